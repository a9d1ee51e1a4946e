"""A shared tier in a directory: a local path or an NFS mount (``/mnt/tier``, ``file:///mnt/tier``).

What a directory adds to ``FsspecStore``: each object is published atomically (``publish``: temp file, fsync,
rename; ``link`` for ``set_if_not_exists``), so a reader never sees a partial object, and a killed writer's
temporary files are swept (``sweep_partials``); objects are read through the tier's own directories, never through
a symlink, and never waited on when they are not regular files (a FIFO); its objects have ``file://`` URLs.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from urllib.parse import quote

from ..errors import PermissionDeniedError
from .fsspec import LIST_TIMEOUT_S, STREAM_PIECE, FsspecStore
from .publish import PARTIAL_MAX_AGE_S, is_partial, publish_bytes
from .regular import open_regular

log = logging.getLogger("vidcache.store.fsspec")     # the tier's one logger, whichever medium


def _open_object(root: str, path: str):
    """A directory tier's object, opened only if it is a regular file of the tier itself, reached through the tier's
    own directories: no symlink is followed, at the object's name (D33) or at its namespace or fan-out directory
    (D51: a planted ``frozen/xx`` link was read through; every node that read it copied the link's target, a
    file of its own, into the tier's quarantine/).  Each component is opened relative to the last (``dir_fd``),
    so a link swapped in meanwhile is not followed either.  A link at the name counts as no object; anything else
    that is not a regular file (a FIFO, a directory) is refused by name (``NotRegularFileError``), unopened."""
    parts = os.path.relpath(path, root).split(os.sep)
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))   # the root itself may be a link
    try:
        for part in parts[:-1]:
            sub = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        obj, _ = open_regular(parts[-1], dir_fd=fd, shown=path)   # a FIFO is refused, never waited on (D58)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            log.warning("not following the symlink at %s: a tier's objects and directories are its own", path)
            raise FileNotFoundError(errno.ENOENT, "a symlink, not an object", path) from None
        raise
    finally:
        os.close(fd)
    return os.fdopen(obj, "rb")


def _own_dirs(root: str, path: str) -> None:
    """Before a write or delete under ``path``: its namespace and fan-out directories must be the tier's own, not
    symlinks (D51: ``publish`` made, linked and renamed through a planted one, writing outside the tier)."""
    d = os.path.dirname(path)
    while len(d) > len(root) and d.startswith(root):
        if os.path.islink(d):
            raise PermissionDeniedError(f"shared tier {root}: {d} is a symlink; a tier's directories are its own, so "
                                        "nothing is written through it (remove the link)")
        d = os.path.dirname(d)


class DirectoryStore(FsspecStore):
    protocols = ("file", "local")
    supports_urls = True
    supports_partial_sweep = True
    exclusive_create = True          # publish's link() refuses an existing name

    def get(self, key: str) -> bytes | None:
        path = self._path(key)

        def read() -> bytes:
            with _open_object(self.root, path) as fh:
                self._check_size(key, os.fstat(fh.fileno()).st_size)   # the file opened, not the name
                return fh.read()
        try:
            return self._call(f"get {key}", read)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _stream(self, key: str, path: str, sink):
        def run() -> None:
            with _open_object(self.root, path) as fh:
                self._check_size(key, os.fstat(fh.fileno()).st_size)
                while chunk := fh.read(STREAM_PIECE):
                    sink(chunk)
        return run

    def url_for(self, key: str, expires_s: float | None = None) -> str:
        # SGLang mishandles '#', '?', '%' in plain paths
        return "file://" + quote(os.path.abspath(self._path(key)))

    def _before_change(self, path: str) -> None:
        _own_dirs(self.root, path)

    def _put(self, key: str, value: bytes, exclusive: bool) -> bool:
        path = self._path(key)
        self._before_change(path)
        return self._call(f"put {key}", publish_bytes, path, bytes(value), exclusive=exclusive)

    # --- maintenance ------------------------------------------------------------------
    def _objects(self, ns: str = ""):
        """(path, info) of every object (``namespace/fan-out/name``), or of namespace ``ns``'s, a fan-out directory
        at a time: a walk of the tier holds one directory's listing, not the tier's (issue 50: ``stats`` behind a
        directory tier of 10^5 entries peaked at 283 MB holding ``find``'s whole listing).  Only a directory gets
        this: on S3 a LIST per directory would replace a LIST per 1,000 keys."""
        def ls(path: str) -> list[dict]:
            try:
                return self._call("list", self.fs.ls, path, detail=True, limit=LIST_TIMEOUT_S)
            except FileNotFoundError:              # removed meanwhile (or no tier yet)
                return []
        for top in [{"name": f"{self.root}/{ns}", "type": "directory"}] if ns else ls(self.root):
            for fan in ls(top["name"]) if top["type"] == "directory" else ():
                for obj in ls(fan["name"]) if fan["type"] == "directory" else ():
                    if obj["type"] == "file":
                        yield obj["name"], obj

    def sweep_partials(self, older_than_s: float = PARTIAL_MAX_AGE_S) -> dict:
        """Remove the ``.partial`` files of writers killed mid-publish (D25), once older than ``older_than_s``.

        A publish takes seconds, so an hour-old partial file is dead whichever node wrote it; younger ones
        may be another node's write in progress and stay.  Only directory tiers have them (S3 PUTs are
        atomic: ``S3Store`` declares no sweep).  Safe to run from many nodes at once.
        """
        self._check_writable()
        removed = [0, 0]
        cutoff = time.time() - older_than_s     # NFS stamps mtimes with the server's clock: skew << an hour
        for p, info in self._objects():
            parts = self._parts(p)
            if len(parts) != 3 or not is_partial(parts[2]):
                continue
            if info.get("mtime") is None or float(info["mtime"]) >= cutoff:
                continue                    # young (or of unknown age): perhaps a live write
            try:
                self._call(f"remove {p}", self.fs.rm_file, p)
            except FileNotFoundError:       # another node's sweep, or the writer, got there first
                continue
            removed[0] += 1
            removed[1] += int(info.get("size") or 0)
        return {"partial_files_removed": removed[0], "partial_bytes_removed": removed[1]}
