"""Opening a file that must be a regular file: the one way, for the directory tier's objects and for ``serve``.

``open()`` of a FIFO blocks until a writer appears, in the kernel, where no timeout reaches it: a FIFO planted at an
object's name held every read for the tier's whole timeout and left its thread blocked for ever (D58).  So the open
never blocks (``O_NONBLOCK``), never follows a symlink (``O_NOFOLLOW``), and anything but a regular file is refused
by name before a byte is read.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat

from ..errors import NotRegularFileError

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"))


def open_regular(name: str, *, dir_fd: int | None = None, shown: str | None = None) -> tuple[int, os.stat_result]:
    """A read-only fd of the regular file at ``name`` (relative to ``dir_fd`` when given), and its stat.
    ``FileNotFoundError`` when nothing is there; ``OSError`` ``ELOOP`` for a symlink; ``IsADirectoryError``; and
    ``NotRegularFileError``
    (naming ``shown``, else ``name``) for anything else that is not a regular file."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "a directory, not a file", shown or name)
        if not stat.S_ISREG(st.st_mode):
            what = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
            raise NotRegularFileError(f"{shown or name} is {what}, not a regular file: refused unread "
                                      "(remove it; a tier's objects are regular files)")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)   # plain reads from here
    except BaseException:
        os.close(fd)
        raise
    return fd, st
