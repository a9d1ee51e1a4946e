"""Atomic publication of a file: the one write-to-temp-then-rename in vidcache.

A reader sees the old file, the new file, or nothing; never a partial one.  The
temp file lives in the target's directory (rename is atomic only within one
filesystem), is fsync'd before the rename and the directory after it, so a
published file survives a power loss on filesystems that honour fsync (NFS does,
on close/commit).  ``exclusive`` publishes with ``link`` instead of ``rename``:
it never replaces an existing file (zarr's ``_safe_move``), which is how
immutable content-addressed objects are written once.
"""
from __future__ import annotations

import os
import uuid
from typing import Callable

PARTIAL = ".partial"
# A temp file this old belongs to a writer that died mid-publish (killed, node lost): a publish takes
# seconds, so a sweep that keeps younger ones never removes another node's write in progress (D25).
PARTIAL_MAX_AGE_S = 3600.0


def _fsync(path: str) -> None:
    """fsync a file or a directory (opened read-only: both can be)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(path: str, fill: Callable[[str], None], *, exclusive: bool = False, fsync: bool = True) -> bool:
    """Call ``fill(tmp)`` to write a temp file, then move it to ``path``.

    Returns False (and removes the temp file) when ``exclusive`` and ``path`` already exists.
    ``fill`` may raise to abandon the write (e.g. a verification failure); nothing is left behind.
    """
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    base, ext = os.path.splitext(os.path.basename(path))
    # Keep the extension last: some writers (PyAV) pick the container from it.
    tmp = os.path.join(d, f".{base}.{uuid.uuid4().hex}{PARTIAL}{ext}")
    try:
        fill(tmp)
        if fsync:
            _fsync(tmp)
        if exclusive:
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
        else:
            os.replace(tmp, path)
        if fsync:
            _fsync(d)
        return True
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)


def publish_bytes(path: str, data: bytes, *, exclusive: bool = False, fsync: bool = True) -> bool:
    def fill(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)
    return publish(path, fill, exclusive=exclusive, fsync=fsync)


def is_partial(name: str) -> bool:
    return PARTIAL in name and name.startswith(".")
