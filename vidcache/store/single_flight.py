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

from ..errors import warn_once

STRIPES = 1024
_POLL_S = 0.02


class SingleFlight:
    """The fetch locks of one node directory (``directory``, created on first use).

    A lock is an optimisation, never a condition of a read: a lock file that cannot be opened (the local disk out
    of inodes, ``locks`` not a directory, a stripe that is a directory or a symlink, ``locks/`` removed under us)
    means an unlocked fetch, with one warning, never a failed read (D43: a full local disk must still serve, D20).
    Stripes are opened with ``O_NOFOLLOW`` under a directory opened the same way, so a planted link never makes
    this node create a file elsewhere.  A holder outwaited once is remembered as stuck: later waits on its stripe
    only look (D47: each read waited the whole timeout again, twice per read)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._stuck: set[int] = set()       # stripes whose holder outlasted a wait, until seen free

    @staticmethod
    def stripe(key: str) -> int:
        return xxhash.xxh3_64_intdigest(key.encode()) % STRIPES

    def _open(self, stripe: int) -> int | None:
        """The stripe's lock file, opened; None when it cannot be (then the fetch runs unlocked)."""
        name = f"{stripe:04d}.lock"
        for attempt in range(2):            # a second time: the directory removed between makedirs and open
            try:
                os.makedirs(self.directory, exist_ok=True)
                d = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC)
                try:
                    return os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | _CLOEXEC, 0o644, dir_fd=d)
                finally:
                    os.close(d)
            except FileNotFoundError as e:
                if attempt:
                    return _unlocked(self.directory, name, e)
            except OSError as e:     # ENOSPC, EEXIST (a file at locks), EISDIR, ELOOP (a link), ENOTDIR, EACCES...
                return _unlocked(self.directory, name, e)
        return None

    @contextlib.contextmanager
    def hold(self, key: str, timeout_s: float) -> Iterator[bool]:
        """Hold ``key``'s lock inside the block; True if held, False when a holder outlasted ``timeout_s`` or no
        lock could be had (the block runs all the same: the caller checks for the local copy first either way)."""
        stripe = self.stripe(key)
        fd = self._open(stripe)
        if fd is None:
            yield False
            return
        try:
            held = _lock(fd, 0.0 if stripe in self._stuck else timeout_s)
            if held:
                self._stuck.discard(stripe)
            elif timeout_s > 0:
                self._stuck.add(stripe)      # outwaited: the next wait on this stripe only looks
            yield held
        finally:
            os.close(fd)         # releases the lock, if held

    def wait(self, key: str, timeout_s: float) -> bool:
        """Return once nobody on this node is fetching ``key`` (or after ``timeout_s``, or at once when its
        stripe's holder was outwaited before); True if it waited."""
        with self.hold(key, 0.0) as free:
            if free:
                return False
        if self.stripe(key) in self._stuck:
            return False
        with self.hold(key, timeout_s):
            return True


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _unlocked(directory: str, name: str, e: OSError) -> None:
    warn_once("single_flight", "vidcache: cannot open the fetch lock %s (%s); fetching without it (a fetch may "
              "run twice on this node, never a wrong byte)", os.path.join(directory, name), e)
    return None


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
        except OSError:      # a file flock refuses (ENOLCK, a FIFO on some filesystems): unlocked
            return False
