"""The per-node LMDB tier.

LMDB's rules (see notes/prior-art.md): one writer at a time (LMDB's own lock
serialises writers across processes), one environment per file per process,
never use an environment across fork, never on a network filesystem.  A write
is one transaction, so a killed writer leaves nothing visible.
"""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import lmdb

from ..errors import StoreError
from .base import Store


class _SharedEnv:
    """One open environment per (file, process), shared by every store on that path."""

    def __init__(self, path: str, readonly: bool, map_size: int, max_readers: int) -> None:
        # sync=False: a power loss may drop the last transactions but never corrupts the file,
        # which is the right trade for a cache (entries can be rebuilt); kill -9 loses nothing.
        self.env = lmdb.open(path, map_size=map_size, subdir=True, readonly=readonly, lock=True, sync=False,
                             readahead=False, meminit=False, max_readers=max_readers, max_dbs=0)
        self.env.reader_check()        # clear reader slots left by killed processes
        self.readonly = readonly
        self.pid = os.getpid()
        self.active = 0                # open transactions
        self.lock = threading.Lock()


_ENVS: dict[str, _SharedEnv] = {}
_ENVS_LOCK = threading.Lock()


def _acquire(path: str, readonly: bool, map_size: int, max_readers: int) -> _SharedEnv:
    with _ENVS_LOCK:
        e = _ENVS.get(path)
        if e is not None and e.pid != os.getpid():
            e = None                   # inherited through fork: never touch the parent's handle
        if e is None or (e.readonly and not readonly):
            if e is not None:
                e.env.close()
            e = _SharedEnv(path, readonly, map_size, max_readers)
            _ENVS[path] = e
        return e


def _close_before_fork() -> None:
    # A forked child inherits py-lmdb's "already open in this process" registry and
    # must not use the parent's environment, so idle environments are closed before
    # fork (DataLoader workers, prewarm pools); both sides reopen lazily.
    with _ENVS_LOCK:
        for path, e in list(_ENVS.items()):
            with e.lock:
                if e.active == 0 and e.pid == os.getpid():
                    e.env.close()
                    del _ENVS[path]


def _drop_inherited() -> None:
    _ENVS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_close_before_fork, after_in_child=_drop_inherited)


class LMDBStore(Store):
    supports_atomic_batches = True

    def __init__(self, path: str | os.PathLike, *, read_only: bool = False,
                 map_size: int = 1 << 30, max_readers: int = 1024) -> None:
        super().__init__(read_only=read_only)
        self.path = str(Path(path).absolute())
        self.initial_map_size = map_size
        self.max_readers = max_readers

    # --- lifecycle --------------------------------------------------------
    def _shared(self) -> _SharedEnv:
        e = _ENVS.get(self.path)    # fast path: every transaction starts here
        if e is not None and e.pid == os.getpid() and (self.read_only or not e.readonly):
            return e
        if not self.read_only:
            Path(self.path).mkdir(parents=True, exist_ok=True)
        elif not Path(self.path, "data.mdb").exists():
            raise StoreError(f"no LMDB cache at {self.path!r}")
        try:
            return _acquire(self.path, self.read_only, self.initial_map_size, self.max_readers)
        except lmdb.Error as e:
            raise StoreError(f"cannot open LMDB at {self.path!r}: {e}") from e

    @property
    def env(self) -> lmdb.Environment:
        return self._shared().env

    def close(self) -> None:
        """Close this process's environment for the path if no transaction is open."""
        with _ENVS_LOCK:
            e = _ENVS.get(self.path)
            if e is not None and e.pid == os.getpid() and e.active == 0:
                e.env.close()
                del _ENVS[self.path]

    def __getstate__(self):
        return {"path": self.path, "read_only": self.read_only, "map_size": self.initial_map_size,
                "max_readers": self.max_readers}

    def __setstate__(self, state):
        self.__init__(state["path"], read_only=state["read_only"], map_size=state["map_size"],
                      max_readers=state["max_readers"])

    def __eq__(self, other) -> bool:
        return isinstance(other, LMDBStore) and (self.path, self.read_only) == (other.path, other.read_only)

    def __hash__(self) -> int:
        return hash((self.path, self.read_only))

    def __repr__(self) -> str:
        return f"LMDBStore({self.path!r}{', read_only=True' if self.read_only else ''})"

    # --- transactions -----------------------------------------------------
    @contextlib.contextmanager
    def _begin(self, write: bool = False, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        e = self._shared()
        with e.lock:
            e.active += 1
        try:
            try:
                txn = e.env.begin(write=write, buffers=buffers)
            except lmdb.MapResizedError:
                e.env.set_mapsize(0)   # another process grew the map: adopt its size
                txn = e.env.begin(write=write, buffers=buffers)
            with txn:
                yield txn
        finally:
            with e.lock:
                e.active -= 1

    def get(self, key: str) -> bytes | None:
        with self._begin() as txn:
            return txn.get(key.encode())

    @contextlib.contextmanager
    def read(self, key: str) -> Iterator[memoryview | None]:
        # buffers=True returns a view into the memory map: zero-copy, valid until the txn ends.
        with self._begin(buffers=True) as txn:
            yield txn.get(key.encode())

    def exists_many(self, keys: Iterable[str]) -> list[bool]:
        with self._begin(buffers=True) as txn:
            return [txn.get(k.encode()) is not None for k in keys]

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._check_writable()
        needed = sum(len(v) for v in items.values())
        for _ in range(64):
            try:
                with self._begin(write=True) as txn:
                    for k, v in items.items():
                        txn.put(k.encode(), v)
                return
            except lmdb.MapFullError:
                # Grow on demand; the failed txn is already aborted, so no txn of ours is open.
                env = self.env
                size = env.info()["map_size"]
                env.set_mapsize(max(2 * size, size + 2 * needed))
        raise StoreError(f"could not grow the LMDB map at {self.path!r} to fit {needed} bytes")

    def keys(self, prefix: str = "") -> Iterator[str]:
        p = prefix.encode()
        with self._begin() as txn:
            cur = txn.cursor()
            found = cur.set_range(p)
            out = []
            while found:
                k = cur.key()
                if not k.startswith(p):
                    break
                out.append(k.decode())
                found = cur.next()
        return iter(out)

    def delete(self, key: str) -> None:
        self._check_writable()
        with self._begin(write=True) as txn:
            txn.delete(key.encode())

    def stats(self) -> dict:
        env = self.env
        info, stat = env.info(), env.stat()
        return {"path": self.path, "map_size": info["map_size"], "entries": stat["entries"],
                "file_bytes": os.path.getsize(os.path.join(self.path, "data.mdb")), "page_size": stat["psize"]}
