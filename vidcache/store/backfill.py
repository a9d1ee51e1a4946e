"""Local copies of pulled values, committed behind the read that pulled them.

A node's first read of a shared-tier entry ends by writing the checked frames into its local LMDB.  The
commit (LMDB writing its dirty pages into the file) was a third of that read on the 2-core VM, and the
reader does not need it: the frames in hand are already checked.  So ``Backfill.put`` returns once the
store holds its own copy of the value (``Store.set_many_staged``: for LMDB, once it is in the transaction),
and one writer thread per process commits it while the reader goes on.

What stays true:
  * the caller's buffer is its own again when ``put`` returns: writing into it cannot reach the store
    (an immutable ``bytes`` value, a zlib-compressed copy, does not wait even for that);
  * a read of a key whose write is in flight waits for it (``wait``), so this process never pulls it twice;
  * ``drain`` (called by the cache's ``sync``, ``close`` and inspecting verbs) waits for every write; at
    interpreter exit the writer finishes its queue (concurrent.futures joins its threads);
  * a write that fails for lack of room costs only the local copy (``on_error`` tolerates it): the read was
    served, the next one pulls.  Any other failure (a failing disk, a bug) is raised by this process's next
    ``put``, ``wait`` or ``drain``: never dropped.
  * a forked child starts with no writer and nothing in flight (the parent's thread is not in it).
"""
from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from .base import Store

log = logging.getLogger("vidcache")


class OneWriter:
    """One writer thread per process and its jobs in flight, by key.  A forked child starts with no writer and
    nothing in flight (the parent's thread is not in it).  Backfill's local commits and the compact layout's
    republishing (``vidcache.compact.Republish``) both stand on it."""

    def __init__(self, thread_name: str) -> None:
        self._thread_name = thread_name
        self._pid: int | None = None
        self._lock = threading.Lock()

    def _state(self) -> tuple[ThreadPoolExecutor, dict[str, Future]]:
        with self._lock:
            if self._pid != os.getpid():      # first use, or a forked child: nothing of the parent's
                self._pid = os.getpid()
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self._thread_name)
                self._pending: dict[str, Future] = {}
                self._started()
            return self._pool, self._pending

    def _started(self) -> None:
        """Per-process state of a subclass, reset where ``_state`` starts a writer (called under the lock)."""

    def _wait_all(self) -> None:
        """Return once every job this process started has run (a job's own exception is raised)."""
        if self._pid != os.getpid():
            return
        with self._lock:
            futs = list(self._pending.values())
        for fut in futs:
            fut.result()


class Backfill(OneWriter):
    """One writer thread for a local store, and the writes it has in flight, per process."""

    def __init__(self, store: Store, on_error: Callable[[BaseException, int], bool]) -> None:
        super().__init__("vidcache-backfill")
        self.store = store
        self.on_error = on_error          # (error, bytes written) -> tolerated?  Else raised on the next use
        self._failed: BaseException | None = None

    def _started(self) -> None:
        self._failed = None

    def _raise_failed(self) -> None:
        with self._lock:
            failed, self._failed = self._failed, None
        if failed is not None:
            raise failed

    def put(self, key: str, value) -> None:
        """Write ``value`` under ``key`` in the background; return once the store no longer needs ``value``."""
        pool, pending = self._state()
        self._raise_failed()
        staged = threading.Event()

        def write() -> None:
            try:
                self.store.set_many_staged({key: value}, staged.set)
            except Exception as e:        # noqa: BLE001 -- kept and raised in the reader's thread, not lost here
                if not self.on_error(e, len(value)):
                    log.warning("vidcache: the local copy %s was not written: %s", key, e)
                    with self._lock:
                        self._failed = self._failed or e
            finally:
                staged.set()

        fut = pool.submit(write)
        with self._lock:
            pending[key] = fut
        fut.add_done_callback(lambda f: self._done(key, f))
        if not isinstance(value, bytes):
            staged.wait()

    def _done(self, key: str, fut: Future) -> None:
        with self._lock:
            if self._pending.get(key) is fut:
                del self._pending[key]

    def wait(self, key: str) -> None:
        """Return once no write of ``key`` is in flight in this process."""
        if self._pid != os.getpid():
            return
        with self._lock:
            fut = self._pending.get(key)
        if fut is not None:
            fut.result()
        self._raise_failed()

    def drain(self) -> None:
        """Return once every write this process started is committed (or has failed and been reported)."""
        self._wait_all()
        self._raise_failed()

    def close(self) -> None:
        """``drain``, then stop the writer thread (a later ``put`` starts another): a closed cache keeps none."""
        self.drain()
        with self._lock:
            if self._pid != os.getpid():
                return
            pool, self._pid = self._pool, None
        pool.shutdown(wait=True)      # outside the lock: the thread's last done-callback takes it
