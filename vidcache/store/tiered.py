"""Read-through tiers: a fast node-local store (LMDB) in front of the cluster's shared one.

Reads try the local tier first; on a miss they pull from the shared tier,
``check`` the pulled bytes (a hook the cache supplies: digests, manifests) and
only then serve and backfill them.  Writes go to the shared tier first
(durable, visible to every node), then the local one.  Keys under
``local_only`` prefixes never reach the shared tier; the policy comes from the
caller, the store only compares prefixes.

The local copy of a shared value is a convenience: when the node's disk is
full, the value is served (or published) without it, with one warning per
process (D20).  A key held locally is answered without touching the shared
tier, so local hits keep working while the shared tier is down.
"""
from __future__ import annotations

import contextlib
import errno
import heapq
import os
from typing import Callable, Iterable, Iterator, Mapping

import lmdb

from ..errors import NoSpaceError, warn_once
from .base import Store


def _union(*sorted_keys: Iterator[str]) -> Iterator[str]:
    """The keys of sorted iterators, merged, each once."""
    last = None
    for k in heapq.merge(*sorted_keys):
        if k != last:
            yield k
            last = k


def _no_check(key: str, value: bytes) -> None:
    pass


def _free_bytes(path) -> float:
    try:
        st = os.statvfs(path)
    except (OSError, TypeError):
        return float("inf")
    return st.f_bavail * st.f_frsize


def out_of_space(exc: BaseException, local: Store | None = None, needed: int = 0) -> bool:
    """Whether a failed write to ``local`` failed for lack of room (``exc`` or the error it was raised from).

    LMDB says so in several ways: MapFullError, "No space left on device", and EIO -- its report of a
    commit that a full disk cut short -- so an EIO counts when the disk under ``local.path`` has no room
    for ``needed`` bytes (and a margin).
    """
    for e in (exc, exc.__cause__):
        if isinstance(e, (NoSpaceError, lmdb.MapFullError)):
            return True
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(e, lmdb.Error):
            msg = str(e)
            if os.strerror(errno.ENOSPC) in msg or os.strerror(errno.EDQUOT) in msg:
                return True
            if os.strerror(errno.EIO) in msg and _free_bytes(getattr(local, "path", None)) < needed + (1 << 20):
                return True
    return False


class TieredStore(Store):
    supports_writes = supports_deletes = supports_listing = True
    # supports_urls: the shared tier's (a property).  No usage or partial sweep of its own: ask a tier
    # (``tiers()``).

    def __init__(self, local: Store, shared: Store, *, local_only: tuple[str, ...] = (),
                 check: Callable[[str, bytes], None] = _no_check, read_only: bool = False) -> None:
        super().__init__(read_only=read_only)
        self.local, self.shared = local, shared
        self.local_only = tuple(local_only)
        self.check = check

    def _is_local_only(self, key: str) -> bool:
        return key.startswith(self.local_only) if self.local_only else False

    @property
    def supports_urls(self) -> bool:   # type: ignore[override]
        return self.shared.supports_urls

    def tiers(self) -> tuple[Store, Store]:
        return self.local, self.shared

    def sync(self) -> None:
        self.local.sync()          # the shared tier's writes are durable when they return

    def url_for(self, key: str, expires_s: float | None = None) -> str:
        return self.shared.url_for(key, expires_s)

    def pull(self, key: str) -> bytes | None:
        """Fetch ``key`` from the shared tier, check it, and backfill the local tier."""
        if self._is_local_only(key):
            return None
        v = self.shared.get(key)
        if v is not None:
            self.check(key, v)                    # raises on corrupt bytes: never served, never backfilled
            if not self.local.read_only:
                self._keep_local(lambda: self.local.set_many({key: v}), len(v))
        return v

    def _keep_local(self, write: Callable[[], object], nbytes: int) -> None:
        """Make the local copy of a value the shared tier holds; a full local disk skips it (and warns once):
        the shared copy is the durable one, so there is nothing to fail for."""
        try:
            write()
        except Exception as e:
            if not self.local_copy_failed(e, nbytes):
                raise

    def local_copy_failed(self, exc: BaseException, nbytes: int) -> bool:
        """The rule for every local copy of a shared value, made here or behind a read (``store/backfill``):
        True when ``exc`` is a full local disk, which costs only the copy (one warning per process); False
        for anything else, which the caller raises."""
        if not out_of_space(exc, self.local, nbytes):
            return False
        # once per process: a full disk stays full for every read
        warn_once("no_space", "vidcache: the local tier %r is out of space (%s); shared-tier entries are served "
                  "without a local copy (slower reads) until there is room: free space on its disk, or set a "
                  "local budget that fits it (max_local_bytes, --max-local-bytes). Not repeated in this process.",
                  self.local, exc)
        return True

    def get(self, key: str) -> bytes | None:
        v = self.local.get(key)
        return v if v is not None else self.pull(key)

    @contextlib.contextmanager
    def read(self, key: str) -> Iterator[memoryview | None]:
        with self.local.read(key) as v:
            if v is not None:
                yield v
                return
        v = self.pull(key)
        if v is None or self.local.read_only:
            yield None if v is None else memoryview(v)
            return
        with self.local.read(key) as lv:           # the backfilled copy: zero-copy like a local hit
            yield lv if lv is not None else memoryview(v)

    def exists_many(self, keys: Iterable[str]) -> list[bool]:
        keys = list(keys)
        found = self.local.exists_many(keys)
        missing = [k for k, f in zip(keys, found) if not f and not self._is_local_only(k)]
        if missing:
            remote = dict(zip(missing, self.shared.exists_many(missing)))
            found = [f or remote.get(k, False) for k, f in zip(keys, found)]
        return found

    def size(self, key: str) -> int | None:
        n = self.local.size(key)
        return n if n is not None or self._is_local_only(key) else self.shared.size(key)

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._check_writable()
        shared = {k: v for k, v in items.items() if not self._is_local_only(k)}
        if shared:
            self.shared.set_many(shared)
        if len(shared) == len(items):           # all published: the local copies are a convenience
            self._keep_local(lambda: self.local.set_many(items), sum(len(v) for v in items.values()))
        else:
            self.local.set_many(items)

    def set_if_not_exists(self, key: str, value: bytes) -> bool:
        self._check_writable()
        if self._is_local_only(key):
            return bool(self.local.set_if_not_exists(key, value))
        wrote = self.shared.set_if_not_exists(key, value)
        self._keep_local(lambda: self.local.set_if_not_exists(key, value), len(value))
        return bool(wrote)

    def keys(self, prefix: str = "") -> Iterator[str]:
        # Each tier lists in key order (Store.keys' contract), so their union is a merge, not two sets and a sorted
        # copy of them (issue 50: ``stats`` behind a directory tier held all three, 137 MB at 10^5 entries).  The
        # shared tier's listing is made here (LMDB's is read a page at a time as the merge goes), so a shared tier
        # that cannot be listed fails the call, not a later step of the walk.
        return _union(self.local.keys(prefix), self.shared.keys(prefix))

    def delete(self, key: str) -> None:
        self._check_writable()
        self.local.delete(key)
        if not self._is_local_only(key):
            self.shared.delete(key)

    def with_read_only(self, read_only: bool = True) -> "TieredStore":
        return type(self)(**{**self._args(), "local": self.local.with_read_only(read_only),
                             "shared": self.shared.with_read_only(read_only), "read_only": read_only})

    def close(self) -> None:
        self.local.close()
        self.shared.close()

    def stats(self) -> dict:
        return {"local": self.local.stats(), "shared": self.shared.stats()}

    # --- value semantics (Store's, from _args; the check is not part of the identity) ---------------
    _location = ("local", "shared", "local_only")

    def _args(self) -> dict:
        return {"local": self.local, "shared": self.shared, "local_only": self.local_only, "check": self.check,
                "read_only": self.read_only}
