"""Per-process temp directories, so that what a killed process leaves behind can be found and removed.

``run_tmp_dir(base)`` gives each process its own directory for fetched sources; ``sweep_stale(base)``
removes the directories of dead processes (a cache's prewarm does it at start and whenever it sees a
worker die); ``tmp_bytes(base)`` reports what temp files hold (``vidcache stats``).
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import time
import uuid

# Each process writes temp files only under its own run directory, base/<pid>-<start>-<pidns>: pid, the
# process's start time (clock ticks after boot, /proc/<pid>/stat field 22) and its pid namespace's inode.
# A directory whose (pid, start) no longer names a live process belonged to a dead one (SIGKILL, the OOM
# killer, a worker timeout) and is swept; the start time tells a reused pid apart.  Directories of another
# pid namespace (another container sharing the cache) are never judged: their pids mean nothing here.
# Without /proc nothing is judged, so nothing is swept.

_RUN_DIR = re.compile(r"(\d+)-(\d+)-(\d+)")
_LEGACY = re.compile(r"fetch-.*\.video")     # loose temp files of versions before run directories


def _proc_start(pid: int) -> str | None:
    """The start time of live process ``pid``; None if it is gone, a zombie, or /proc is missing."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()   # the name in (...) may hold spaces
    except OSError:
        return None
    return None if fields[0] in (b"Z", b"X") else fields[19].decode()


def _pid_ns() -> str | None:
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return None


def run_tmp_dir(base: str) -> str:
    """This process's own temp directory under ``base`` (created if missing).

    Call it in the process that writes (after any fork), not once up front: the name is the caller's.
    """
    start, ns = _proc_start(os.getpid()), _pid_ns()
    # Without /proc the name cannot be judged later; a uuid keeps it unique and outside _RUN_DIR's pattern.
    name = f"{os.getpid()}-{start}-{ns}" if start and ns else f"{os.getpid()}-{uuid.uuid4().hex}"
    path = os.path.join(base, name)
    os.makedirs(path, exist_ok=True)
    return path


def sweep_stale(base: str, legacy_age_s: float = 86400.0) -> int:
    """Remove the run directories under ``base`` whose process is dead; returns the bytes freed.

    Loose ``fetch-*.video`` files (from versions without run directories) are removed once older than
    ``legacy_age_s``: their owner cannot be known, but no fetch and decode takes a day.
    """
    ns = _pid_ns()
    if ns is None or _proc_start(os.getpid()) is None:
        return 0
    try:
        entries = list(os.scandir(base))
    except FileNotFoundError:
        return 0
    freed = 0
    for e in entries:
        m = _RUN_DIR.fullmatch(e.name)
        if m and e.is_dir(follow_symlinks=False):
            pid, start, owner_ns = m.groups()
            if owner_ns != ns or _proc_start(int(pid)) == start:
                continue                                    # another namespace's, or alive
            before = tmp_bytes(e.path)
            shutil.rmtree(e.path, ignore_errors=True)       # another sweeper may be removing it too
            freed += before - tmp_bytes(e.path)             # what is left, we had no right to remove
        elif _LEGACY.fullmatch(e.name) and e.is_file(follow_symlinks=False):
            with contextlib.suppress(OSError):                # gone meanwhile, or not ours to remove
                st = e.stat(follow_symlinks=False)
                if time.time() - st.st_mtime > legacy_age_s:
                    os.unlink(e.path)
                    freed += st.st_size
    return freed


def tmp_bytes(base: str) -> int:
    """Bytes held by the regular files under ``base`` (0 when it does not exist)."""
    total = 0
    for root, _dirs, files in os.walk(base):
        for name in files:
            with contextlib.suppress(FileNotFoundError):     # a fetch may finish and remove it meanwhile
                st = os.lstat(os.path.join(root, name))
                if stat.S_ISREG(st.st_mode):
                    total += st.st_size
    return total
