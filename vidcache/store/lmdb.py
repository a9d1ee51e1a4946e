"""The per-node LMDB tier, with an optional byte budget and LRU eviction.

LMDB's rules: one writer at a time (LMDB's own lock serialises writers across
processes), one environment per file per process, never use an environment
across fork (both kept by ``lmdb_env``, the per-process registry of open
environments), never on a network filesystem.  A write is one transaction, so a
killed writer leaves nothing visible.

Eviction: LMDB never shrinks its file, but pages freed by a delete are reused
by later writes, so a budget bounds the file's growth.  Readers are MVCC
snapshots: a process holding a zero-copy view keeps seeing the old pages until
its transaction ends, so evicting an entry that is being read is safe.

Damage: a damaged page surfaces from whichever call walks it first (an open, a get, a cursor walk, stat()).
Every lmdb.Error leaving this module is a StoreError naming the file and the rebuild, never a raw lmdb
traceback (``_lmdb_errors``).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import struct
import threading
import time
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping

import lmdb

from ..errors import NoSpaceError, StoreError
from . import lmdb_env
from .base import Store
from .lmdb_env import DATA_FILE, LMDB_LIB_VERSION, LRU_DB  # noqa: F401  (LMDB_LIB_VERSION: still importable from here)

logger = logging.getLogger(__name__)

# lmdb errors that mean the file itself is bad (not a full disk, a busy reader table or a bug of ours).
_DAMAGED = (lmdb.CorruptedError, lmdb.InvalidError, lmdb.PageNotFoundError, lmdb.VersionMismatchError)

_WARNED_BUDGET: set[str] = set()     # paths whose below-one-entry budget was already warned about

# Eviction's bounds (``_evict``): the ages' histogram (keys in one bucket are within 1/4096 of the ages' range of
# each other, evicted in key order) and the keys deleted per write transaction.
GC_BUCKETS = 4096
GC_BATCH = 1024
# Keys read per read transaction by ``keys``: what a walk holds (~0.5 MB of names), whatever the store's size.
KEYS_PAGE = 4096


def _disk_full(path: str, err: lmdb.Error) -> bool:
    """LMDB reports a full disk as ENOSPC, or as EIO when a commit was cut short by one (seen on tmpfs)."""
    msg = str(err)
    if os.strerror(errno.ENOSPC) in msg or os.strerror(errno.EDQUOT) in msg:
        return True
    if os.strerror(errno.EIO) in msg:
        with contextlib.suppress(OSError):
            return shutil.disk_usage(path).free < (1 << 20)
    return False


def _rebuild(path: str) -> str:
    return (f"move {path!r} aside and re-run `vidcache prewarm` (with a shared tier, entries are pulled back "
            "from it without decoding)")


def crash_error(path: str, signal_name: str) -> StoreError:
    """The StoreError for a process that LMDB's C code killed (``signal_name``, SIGBUS) while it read the
    environment at ``path``: some damaged pages send LMDB past the end of its map, which no Python can catch."""
    return StoreError(f"the LMDB file at {path!r} is damaged (LMDB's own code crashed with {signal_name} reading "
                      f"it). Rebuild: {_rebuild(path)}")


def _store_error(path: str, err: lmdb.Error) -> StoreError:
    """The StoreError for an lmdb error on the environment at ``path``: the file and how to rebuild it."""
    rebuild = _rebuild(path)
    if isinstance(err, _DAMAGED):
        return StoreError(f"the LMDB file at {path!r} is damaged ({err}). Rebuild: {rebuild}")
    if _disk_full(path, err):
        return NoSpaceError(f"no space left for the LMDB file at {path!r} ({err}): free space on that disk, "
                            "or give the node a budget (--max-local-bytes) below its free space")
    return StoreError(f"LMDB error on {os.path.join(path, DATA_FILE)!r} ({type(err).__name__}: {err}). "
                      f"If it persists, the file may be damaged; rebuild: {rebuild}")


class LMDBStore(Store):
    supports_writes = supports_deletes = supports_listing = True
    # timeout_s: None, a local file (no network call to bound)

    def __init__(self, path: str | os.PathLike, *, read_only: bool = False, map_size: int = 1 << 30,
                 max_readers: int = 1024, max_bytes: int | None = None) -> None:
        """``max_bytes``: a budget for the data; writes past it evict least-recently-used keys."""
        if max_bytes is not None and max_bytes <= 0:
            # A budget of 0 evicts every write at once: the tier would silently keep nothing (D30).
            raise ValueError(f"max_bytes must be a positive number of bytes or None for no budget, got {max_bytes!r}"
                             " (a budget of 0 keeps nothing)")
        super().__init__(read_only=read_only)
        self.path = str(Path(path).absolute())
        lmdb_env.forget_if_replaced(self.path)   # the directory was deleted or replaced: reopen lazily, at the path
        self.initial_map_size = map_size
        self.max_readers = max_readers
        self.max_bytes = max_bytes
        self._touched: dict[bytes, float] = {}   # reads not yet written to the LRU table
        self._touched_lock = threading.Lock()

    # --- lifecycle --------------------------------------------------------
    def _shared(self) -> lmdb_env.SharedEnv:
        e = lmdb_env.cached(self.path, self.read_only)    # fast path: every transaction starts here
        if e is not None:
            return e
        if not self.read_only:
            try:
                Path(self.path).mkdir(parents=True, exist_ok=True)
            except OSError as e:      # a full disk on a brand-new node (D41): named, as a full LMDB is (D23)
                if e.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise NoSpaceError(f"no space left to create the LMDB directory {self.path!r} ({e.strerror}): "
                                   "free space on that disk, or point the cache (--cache, VIDCACHE_DIR) at a disk "
                                   "with room") from e
        elif not Path(self.path, DATA_FILE).exists():
            raise StoreError(f"no LMDB cache at {self.path!r}")
        try:
            return lmdb_env.acquire(self.path, self.read_only, self.initial_map_size, self.max_readers)
        except _DAMAGED as e:
            raise _store_error(self.path, e) from e
        except lmdb.Error as e:
            if _disk_full(self.path, e):      # a new environment's first pages on a full disk
                raise _store_error(self.path, e) from e
            raise StoreError(f"cannot open LMDB at {self.path!r}: {e}") from e

    @property
    def env(self) -> lmdb.Environment:
        return self._shared().env

    @contextlib.contextmanager
    def _lmdb_errors(self) -> Iterator[None]:
        """Turn an lmdb.Error into a StoreError naming the file and the rebuild (D9)."""
        try:
            yield
        except (lmdb.MapFullError, lmdb.MapResizedError):
            raise                      # not errors to the caller: _write grows the map, _begin adopts its size
        except lmdb.Error as e:
            raise _store_error(self.path, e) from e

    def sync(self) -> None:
        """fsync committed transactions (a durability checkpoint)."""
        if not self.read_only:
            self._flush_touched()
            with self._lmdb_errors():
                self.env.sync(True)

    def close(self) -> None:
        """Close this process's environment for the path if no transaction is open."""
        if self._touched and not self.read_only:
            with contextlib.suppress(lmdb.Error, StoreError):
                self._flush_touched()
        lmdb_env.forget(self.path)

    # --- value semantics (Store's, from _args): reopened per process where unpickled ------------------
    _location = ("path",)
    _pickle_args = True

    def _args(self) -> dict:
        return {"path": self.path, "read_only": self.read_only, "map_size": self.initial_map_size,
                "max_readers": self.max_readers, "max_bytes": self.max_bytes}

    # --- transactions -----------------------------------------------------
    @contextlib.contextmanager
    def _begin(self, write: bool = False, buffers: bool = False) -> Iterator[lmdb.Transaction]:
        e = self._shared()
        with e.lock:
            e.active += 1
        try:
            # Every verb's lmdb calls run in here (gets, puts, cursor walks, the commit), so this one
            # translation covers them.
            with self._lmdb_errors():
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

    def _touch(self, key: bytes) -> None:
        if self.read_only:
            return
        with self._touched_lock:
            self._touched[key] = time.time()
            full = len(self._touched) >= 256  # batched: one write transaction per 256 reads, not per read
        if full:
            self._flush_touched()

    def _flush_touched(self, txn=None) -> None:
        with self._touched_lock:      # reads on other threads (a background backfill's commit) touch too
            touched, self._touched = self._touched, {}
        if not touched:
            return
        if txn is None:
            # Through ``_write``: a process that opened a store grown past its initial map size has a map exactly
            # full, and a touch needs room like any write (issue 50: MapFullError out of a read).
            self._write(lambda t: self._flush_touched_in(t, touched))
        else:
            self._flush_touched_in(txn, touched)

    def _flush_touched_in(self, txn, touched: dict) -> None:
        db = self._shared().lru
        for k, ts in touched.items():
            if txn.get(k) is not None:               # evicted meanwhile: no stale LRU row
                txn.put(k, struct.pack(">d", ts), db=db)

    def get(self, key: str) -> bytes | None:
        with self._begin() as txn:
            v = txn.get(key.encode())
        if v is not None:
            self._touch(key.encode())
        return v

    @contextlib.contextmanager
    def read(self, key: str) -> Iterator[memoryview | None]:
        # buffers=True returns a view into the memory map: zero-copy, valid until the txn ends.
        with self._begin(buffers=True) as txn:
            v = txn.get(key.encode())
            yield v
        if v is not None:
            self._touch(key.encode())

    def exists_many(self, keys: Iterable[str]) -> list[bool]:
        with self._begin(buffers=True) as txn:
            return [txn.get(k.encode()) is not None for k in keys]

    def size(self, key: str) -> int | None:
        with self._begin(buffers=True) as txn:
            v = txn.get(key.encode())
            return None if v is None else len(v)

    def _write(self, fn, staged: Callable[[], None] | None = None, evict: bool = True) -> object:
        """Run ``fn(txn)`` in one write transaction, growing the map on demand; ``staged()`` just before the
        commit (``set_many_staged``); then, over the budget, evict (``evict``: not for eviction's own deletes)."""
        self._check_writable()
        handed_back = False
        for _ in range(64):
            try:
                with self._begin(write=True) as txn:
                    out = fn(txn)
                    self._flush_touched(txn)
                    if staged is not None:
                        # The values now live in LMDB's own dirty pages; the commit writes those, not the
                        # caller's buffers, which it may hand on (a first read's tensor) from here.
                        handed_back = True
                        staged()
                break
            except lmdb.MapFullError:
                # Grow on demand; the failed txn is already aborted, so no txn of ours is open.
                env = self.env
                with self._lmdb_errors():
                    size = env.info()["map_size"]
                    env.set_mapsize(max(2 * size, size + 2 * getattr(fn, "needed", 0)))
                if handed_back:   # the commit filled the map: the caller's buffers may have changed since,
                    # so the write is not retried (a backfill: the next read makes the copy; no room lost)
                    raise NoSpaceError(f"the LMDB map at {self.path!r} filled during a commit; the map is grown "
                                       "and this write dropped (its buffers were handed back)")
        else:
            raise StoreError(f"could not grow the LMDB map at {self.path!r}")
        if evict and self.max_bytes is not None and self.used_bytes() > self.max_bytes:
            _, lost = self._evict(self.max_bytes, watch=getattr(fn, "keys", frozenset()))
            if lost:
                self._warn_below_one_entry(lost)
        return out

    def _warn_below_one_entry(self, lost: list[bytes]) -> None:
        # Eviction takes the oldest keys first, so a key written just now goes only when it alone (with the
        # rest of its write) is over the budget: every such write is lost at once, and a run reports
        # "new" every time with nothing kept (D30).  Said once per file and process, not per write.
        if self.path in _WARNED_BUDGET:
            return
        _WARNED_BUDGET.add(self.path)
        logger.warning("vidcache: the local budget (max_local_bytes / --max-local-bytes = %d bytes) of %s is below "
                       "one entry: the keys just written (%s) were evicted at once, so this tier keeps nothing of "
                       "them. Give a budget larger than the largest entry, or none.",
                       self.max_bytes, self.path, ", ".join(k.decode(errors="replace") for k in lost[:3]))

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self.set_many_staged(items, None)

    def set_many_staged(self, items: Mapping[str, bytes], staged: Callable[[], None] | None) -> None:
        now = struct.pack(">d", time.time())

        def put(txn):
            db = self._shared().lru
            for k, v in items.items():
                txn.put(k.encode(), v)
                txn.put(k.encode(), now, db=db)
        put.needed = sum(len(v) for v in items.values())
        put.keys = {k.encode() for k in items}
        self._write(put, staged)

    def set_if_not_exists(self, key: str, value: bytes) -> bool:
        now = struct.pack(">d", time.time())

        def put(txn):
            wrote = txn.put(key.encode(), value, overwrite=False)
            if wrote:
                txn.put(key.encode(), now, db=self._shared().lru)
            return wrote
        put.needed = len(value)
        put.keys = {key.encode()}
        return bool(self._write(put))

    def keys(self, prefix: str = "") -> Iterator[str]:
        """The keys under ``prefix`` in key order, read a page of ``KEYS_PAGE`` per read transaction: a walk of
        10^6 entries holds one page of names, not the namespace (issue 50), and no read transaction stays open
        between pages (an open one pins the pages writers would reuse).  A page starts at the first key not read
        by the one before, so each key is seen at most once, in order, also while keys are deleted meanwhile."""
        p = prefix.encode()
        start = p
        while start is not None:
            page = []
            with self._begin() as txn:
                cur = txn.cursor()
                found = cur.set_range(start)
                while found and len(page) < KEYS_PAGE:
                    k = cur.key()
                    if not k.startswith(p):
                        found = False
                        break
                    if k != LRU_DB:
                        page.append(k.decode())
                    found = cur.next()
                start = cur.key() if found else None     # the next key, not read yet: the next page's first
            yield from page

    def delete(self, key: str) -> None:
        def rm(txn):
            txn.delete(key.encode())
            txn.delete(key.encode(), db=self._shared().lru)
        self._write(rm)

    # --- budget -----------------------------------------------------------
    def used_bytes(self) -> int:
        """Bytes in pages holding data (LMDB's own accounting; the file may be larger, its free pages are reused)."""
        env = self.env
        with self._lmdb_errors():
            st = env.stat()
        return (st["branch_pages"] + st["leaf_pages"] + st["overflow_pages"]) * st["psize"]

    def gc(self, max_bytes: int, low_water: float = 0.9) -> dict:
        """Evict least-recently-used keys until the data fits ``low_water * max_bytes``."""
        return self._evict(max_bytes, low_water)[0]

    def _evict(self, max_bytes: int, low_water: float = 0.9, watch=frozenset()) -> tuple[dict, list[bytes]]:
        """``gc``'s report, and which keys of ``watch`` it evicted.

        Memory is bounded by ``GC_BUCKETS`` and ``GC_BATCH``, not by the keys held (issue 50: holding every key's
        age and size took 280 MB at 10^5 entries): a first pass makes a histogram of the values' bytes by age,
        which gives the age below which everything goes; a second pass deletes those keys, oldest bucket's keys
        included in key order until enough is freed, a batch per write transaction."""
        self._check_writable()
        self._flush_touched()
        used = self.used_bytes()
        if used <= max_bytes:
            return {"evicted": 0, "freed_bytes": 0, "used_bytes": used}, []
        need = used - int(max_bytes * low_water)
        e = self._shared()

        def age(txn, k) -> float | None:
            a = txn.get(k, db=e.lru)
            return struct.unpack(">d", a)[0] if a is not None else None

        with self._begin(buffers=True) as txn:
            lo = hi = None                      # the stamped ages' range, from the LRU table (nothing is held)
            for v in txn.cursor(db=e.lru).iternext(keys=False):
                a = struct.unpack(">d", v)[0]
                lo, hi = (a, a) if lo is None else (min(lo, a), max(hi, a))
            width = ((hi - lo) / GC_BUCKETS or 1.0) if lo is not None else 1.0

            def bucket(a: float | None) -> int:
                # -1: never stamped (the oldest of all); else its age's bucket
                return -1 if a is None else min(GC_BUCKETS - 1, int((a - lo) / width))
            hist = [0] * (GC_BUCKETS + 1)         # the values' bytes by age bucket (index 0: never stamped)
            for k, v in txn.cursor():
                if bytes(k) != LRU_DB:
                    hist[bucket(age(txn, k)) + 1] += len(v)
        cut, total = GC_BUCKETS - 1, 0           # the bucket where the bytes to free are reached
        for i, n in enumerate(hist):
            total += n
            if total >= need:
                cut = i - 1
                break
        freed = evicted = 0
        lost: list[bytes] = []

        def sweep(pick, enough) -> None:
            """Delete the keys ``pick`` selects, in key order, a batch per write transaction, until ``enough()``."""
            nonlocal freed, evicted, lost
            start = b""
            while start is not None and not enough():
                batch = []
                with self._begin(buffers=True) as txn:
                    cur = txn.cursor()
                    found = cur.set_range(start) if start else cur.first()
                    while found and len(batch) < GC_BATCH and not enough():
                        k = bytes(cur.key())
                        if k != LRU_DB and pick(bucket(age(txn, k))):
                            batch.append(k)
                            freed += len(cur.value())
                        found = cur.next()
                    start = bytes(cur.key()) if found else None
                if batch:
                    def rm(txn, batch=batch):
                        for k in batch:
                            txn.delete(k)
                            txn.delete(k, db=e.lru)
                    # Through ``_write``: deletes need free pages too, and a store reopened past its initial map
                    # size has none (issue 50: ``vidcache gc`` raised MapFullError at 1,000 entries).
                    self._write(rm, evict=False)
                    evicted += len(batch)
                    lost += [k for k in batch if k in watch]
        sweep(lambda b: b < cut, lambda: False)              # every key older than the cut's bucket
        sweep(lambda b: b == cut, lambda: freed >= need)     # then the cut's bucket, until enough is freed
        return {"evicted": evicted, "freed_bytes": freed, "used_bytes": self.used_bytes()}, lost

    def stats(self) -> dict:
        env = self.env
        with self._lmdb_errors():
            info, stat = env.info(), env.stat()
        return {"path": self.path, "map_size": info["map_size"], "entries": stat["entries"],
                "used_bytes": self.used_bytes(), "max_bytes": self.max_bytes,
                "file_bytes": os.path.getsize(os.path.join(self.path, DATA_FILE)), "page_size": stat["psize"]}
