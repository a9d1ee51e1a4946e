"""One open LMDB environment per (file, process), shared by every LMDBStore on that path, and safe across fork.

LMDB's rules: one environment per file per process, never use an environment across fork.  So environments
live in one registry, keyed by path; an entry belongs to the process that opened it (``_owned``), a forked
child never touches its parent's handle, and idle environments are closed before a fork (``os.register_at_fork``).
A directory deleted or replaced under an open environment is noticed by its file id and reopened at the path.

Errors: this module lets lmdb.Error through; ``LMDBStore`` (its only user) turns them into StoreErrors.
"""
from __future__ import annotations

import os
import threading

import lmdb

LMDB_LIB_VERSION = 0       # LMDB 0.9.x, data format 1: what every py-lmdb release reads
DATA_FILE = "data.mdb"     # the file LMDB keeps an environment in (its own name, not ours)
LRU_DB = b"vidcache-lru"   # the last-access sub-database: no namespaced key ("ns/...") equals it; hidden from keys()


class SharedEnv:
    """One open environment per (file, process), shared by every store on that path."""

    def __init__(self, path: str, readonly: bool, map_size: int, max_readers: int) -> None:
        # sync=False: commits reach the OS but are not fsync'd, so kill -9 loses nothing, and a power
        # loss may lose the last commits -- and, on filesystems that reorder writes, can damage the
        # file (LMDB's docs).  Callers that need durability call ``sync()`` at a checkpoint (prewarm
        # does, once at the end of a run); a damaged file is detected on open and reported with its fix.
        # The on-disk format is ours to choose, not the environment's: py-lmdb 3.x bundles LMDB 0.9 (data
        # format 1) and 1.0 (format 3), and its LMDB_DEFAULT_LIB_VERSION variable (set by another library
        # or a test suite) would switch new files to 1.0, which 0.9 readers and py-lmdb < 3 cannot open.
        # New environments are always LMDB_LIB_VERSION; an existing file opens in its own format.
        new = not os.path.exists(os.path.join(path, DATA_FILE))
        for attempt in range(8):
            try:
                self.env = lmdb.open(path, map_size=map_size, subdir=True, readonly=readonly, lock=True,
                                     sync=False, readahead=False, meminit=False, max_readers=max_readers,
                                     max_dbs=1, lib_version=LMDB_LIB_VERSION if new else None)
                break
            except lmdb.MapResizedError:
                # Another process grew the map between this open reading its size and its first transaction
                # (seen with 3 writers growing a 64 KiB map on a loaded 2-core CI machine): open again, at
                # the size the file has now.
                if attempt == 7:
                    raise
        # Last-access times for LRU eviction, beside the data (a named sub-database).
        try:
            self.lru = self._open_lru(readonly)
        except lmdb.MapResizedError:
            self.env.set_mapsize(0)    # another process grew the map: adopt its size
            self.lru = self._open_lru(readonly)
        self.env.reader_check()        # clear reader slots left by killed processes
        self.file_id = _file_id(path)
        self.readonly = readonly
        self.pid = os.getpid()
        self.active = 0                # open transactions
        self.lock = threading.Lock()

    def _open_lru(self, readonly: bool):
        if readonly and not _has_lru(self.env):
            return None
        return self.env.open_db(LRU_DB, create=not readonly)


def _has_lru(env) -> bool:
    with env.begin() as txn:
        return txn.get(LRU_DB) is not None


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(os.path.join(path, DATA_FILE))
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


_ENVS: dict[str, SharedEnv] = {}
_ENVS_LOCK = threading.Lock()


def _owned(e: SharedEnv) -> bool:
    """Opened by this process (not inherited through fork, when the parent's handle must never be touched)."""
    return e.pid == os.getpid()


def _close_if_idle(path: str, e: SharedEnv) -> None:
    """Close and unregister ``e`` (the entry for ``path``) if this process owns it and no transaction is open.
    The caller holds ``_ENVS_LOCK``."""
    with e.lock:
        if e.active == 0 and _owned(e):
            e.env.close()
            del _ENVS[path]


def cached(path: str, readonly: bool) -> SharedEnv | None:
    """This process's open environment for ``path``, if it serves ``readonly`` (a writable one serves both).
    Lock-free: every transaction starts here."""
    e = _ENVS.get(path)
    return e if e is not None and _owned(e) and (readonly or not e.readonly) else None


def acquire(path: str, readonly: bool, map_size: int, max_readers: int) -> SharedEnv:
    """The environment for ``path``, opening (or reopening) it when this process has none that serves."""
    with _ENVS_LOCK:
        e = _ENVS.get(path)
        if e is not None and not _owned(e):
            e = None                   # inherited through fork: never touch the parent's handle
        if e is not None and e.file_id != _file_id(path):
            # The directory was deleted or replaced under us: the open environment is a deleted file's,
            # whose writes nobody would see.  Reopen the one at the path now (if it is idle).
            with e.lock:
                if e.active == 0:
                    e.env.close()
                    e = None
        if e is None or (e.readonly and not readonly):
            if e is not None:
                e.env.close()
            e = SharedEnv(path, readonly, map_size, max_readers)
            _ENVS[path] = e
        return e


def forget(path: str) -> None:
    """Close this process's environment for ``path`` if no transaction is open (the next use reopens it)."""
    with _ENVS_LOCK:
        e = _ENVS.get(path)
        if e is not None:
            _close_if_idle(path, e)


def forget_if_replaced(path: str) -> None:
    """Forget this process's environment for ``path`` if the directory was deleted or replaced under it."""
    e = _ENVS.get(path)
    if e is not None and _owned(e) and e.file_id != _file_id(path):
        forget(path)


def _close_before_fork() -> None:
    # A forked child inherits py-lmdb's "already open in this process" registry and
    # must not use the parent's environment, so idle environments are closed before
    # fork (DataLoader workers, prewarm pools); both sides reopen lazily.
    with _ENVS_LOCK:
        for path, e in list(_ENVS.items()):
            _close_if_idle(path, e)


def _drop_inherited() -> None:
    _ENVS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_close_before_fork, after_in_child=_drop_inherited)
