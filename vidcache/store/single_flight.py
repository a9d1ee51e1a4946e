"""One fetch per key per node: whoever fetches an entry from the shared tier holds its lock, and everyone else on
the node (threads of this process and other processes alike) waits for it and then reads the local copy.

The locks are ``flock`` locks on files in the node directory (a local disk: LMDB's rule).  ``flock`` belongs to an
open file, not to a process, so two threads of one process exclude each other as two processes do, and the kernel
drops a lock when its holder dies: a killed fetcher never blocks anyone.  A holder that is alive but stuck is
waited for at most ``timeout_s``; then the waiter fetches by itself (a second fetch, never a hang).

Keys share a fixed set of lock files (``STRIPES``), not one file each: a node reading a 116k-entry tier would
otherwise leave 116k files behind, and a lock file cannot be removed safely while another process may be about
to lock it.  Two keys that land on one stripe only wait for each other (with 4 fetches in flight on a node,
about 1 in 170 fetches does), which costs time, never bytes.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Iterator

import xxhash

STRIPES = 1024
_POLL_S = 0.02


class SingleFlight:
    """The fetch locks of one node directory (``directory``, created on first use)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _open(self, key: str) -> int:
        os.makedirs(self.directory, exist_ok=True)
        stripe = xxhash.xxh3_64_intdigest(key.encode()) % STRIPES
        return os.open(os.path.join(self.directory, f"{stripe:04d}.lock"), os.O_RDWR | os.O_CREAT, 0o644)

    @contextlib.contextmanager
    def hold(self, key: str, timeout_s: float) -> Iterator[bool]:
        """Hold ``key``'s lock inside the block; True if held, False when a holder outlasted ``timeout_s``
        (the block runs all the same: the caller checks for the local copy first in either case)."""
        fd = self._open(key)
        try:
            yield _lock(fd, timeout_s)
        finally:
            os.close(fd)         # releases the lock, if held

    def wait(self, key: str, timeout_s: float) -> bool:
        """Return once nobody on this node is fetching ``key`` (or after ``timeout_s``); True if it waited."""
        with self.hold(key, 0.0) as free:
            if free:
                return False
        with self.hold(key, timeout_s):
            return True


def _lock(fd: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
