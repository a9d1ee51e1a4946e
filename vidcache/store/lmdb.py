"""The per-node LMDB tier.

LMDB's rules (see notes/prior-art.md): one writer at a time (LMDB's own lock
serialises writers across processes), never use an environment across fork
(we reopen lazily in the current pid), never on a network filesystem.  A
write is one transaction, so a killed writer leaves nothing visible.
"""
from __future__ import annotations

import contextlib
import os
import threading
import weakref
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import lmdb

from ..errors import StoreError
from .base import Store

_ORPHANED_ENVS: list = []  # environments inherited through fork: never closed in the child
_LIVE: "weakref.WeakSet[LMDBStore]" = weakref.WeakSet()


def _close_before_fork() -> None:
    # py-lmdb refuses to open an environment that is "already open in this process",
    # and a forked child inherits that registry.  Idle environments are therefore
    # closed before fork (DataLoader workers, prewarm pools) and reopen lazily.
    for store in list(_LIVE):
        store._close_if_idle()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_close_before_fork)


class LMDBStore(Store):
    supports_atomic_batches = True

    def __init__(self, path: str | os.PathLike, *, read_only: bool = False,
                 map_size: int = 1 << 30, max_readers: int = 1024) -> None:
        super().__init__(read_only=read_only)
        self.path = str(Path(path))
        self.initial_map_size = map_size
        self.max_readers = max_readers
        self._env: lmdb.Environment | None = None
        self._pid: int | None = None
        self._active = 0
        self._lock = threading.Lock()
        _LIVE.add(self)

    # --- lifecycle --------------------------------------------------------
    @property
    def env(self) -> lmdb.Environment:
        if self._env is not None and self._pid != os.getpid():
            _ORPHANED_ENVS.append(self._env)  # the parent's handle; closing it here is unsafe
            self._env = None
        if self._env is None:
            if not self.read_only:
                Path(self.path).mkdir(parents=True, exist_ok=True)
            elif not Path(self.path, "data.mdb").exists():
                raise StoreError(f"no LMDB cache at {self.path!r}")
            env = lmdb.open(self.path, map_size=self.initial_map_size, subdir=True, readonly=self.read_only,
                            lock=True, readahead=False, meminit=False, max_readers=self.max_readers, max_dbs=0)
            env.reader_check()  # clear reader slots left by killed processes
            self._env, self._pid = env, os.getpid()
        return self._env

    def close(self) -> None:
        if self._env is not None and self._pid == os.getpid():
            self._env.close()
        self._env = None

    def _close_if_idle(self) -> None:
        with self._lock:
            if self._active == 0:
                self.close()

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
        with self._lock:
            self._active += 1
        try:
            try:
                txn = self.env.begin(write=write, buffers=buffers)
            except lmdb.MapResizedError:
                self.env.set_mapsize(0)  # another process grew the map: adopt its size
                txn = self.env.begin(write=write, buffers=buffers)
            with txn:
                yield txn
        finally:
            with self._lock:
                self._active -= 1

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
                # Grow on demand.  set_mapsize needs no open txn in this process: the
                # aborted txn above is closed by the context manager.
                info = self.env.info()
                self.env.set_mapsize(max(2 * info["map_size"], info["map_size"] + 2 * needed))
        raise StoreError(f"could not grow the LMDB map at {self.path!r} to fit {needed} bytes")

    def keys(self, prefix: str = "") -> Iterator[str]:
        p = prefix.encode()
        with self._begin() as txn:
            cur = txn.cursor()
            if not cur.set_range(p):
                return
            for k in cur.iternext(keys=True, values=False):
                if not k.startswith(p):
                    break
                yield k.decode()

    def delete(self, key: str) -> None:
        self._check_writable()
        with self._begin(write=True) as txn:
            txn.delete(key.encode())

    def stats(self) -> dict:
        info, stat = self.env.info(), self.env.stat()
        return {"path": self.path, "map_size": info["map_size"], "entries": stat["entries"],
                "file_bytes": os.path.getsize(os.path.join(self.path, "data.mdb")),
                "page_size": stat["psize"]}
