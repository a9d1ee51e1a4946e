"""The shared tier: an immutable content-addressed store on any fsspec filesystem (NFS path, S3, ...).

Objects are written once and never modified: a put of an existing key is a
no-op (content addressing makes both writers' bytes equal).  On filesystems
with rename, an object is written to a unique temp name and moved into place,
so a reader never sees a partial object; S3 PUTs are atomic per object.  The
caller writes blobs before the manifest naming them (see ``VideoCache``).
LMDB must not live on a network filesystem; this tier is how NFS is used.
"""
from __future__ import annotations

import os
import uuid
from typing import Iterator, Mapping

import fsspec

from .base import Store


class FsspecStore(Store):
    supports_atomic_batches = False     # objects are atomic, batches are ordered
    supports_deletes = True

    def __init__(self, url: str, *, read_only: bool = False, storage_options: dict | None = None) -> None:
        super().__init__(read_only=read_only)
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        self._fs = None
        self._pid = None

    @property
    def fs(self):
        if self._fs is None or self._pid != os.getpid():   # fsspec instances are not fork-safe
            self._fs, self._root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._pid = os.getpid()
        return self._fs

    @property
    def root(self) -> str:
        self.fs             # resolves the root together with the filesystem
        return self._root

    def _path(self, key: str) -> str:
        ns, _, name = key.partition("/")
        # Two hex characters of fan-out keep directories small on NFS.
        return f"{self.root}/{ns}/{name[:2]}/{name}"

    def get(self, key: str) -> bytes | None:
        try:
            return self.fs.cat_file(self._path(key))
        except FileNotFoundError:
            return None

    def exists_many(self, keys) -> list[bool]:
        return [self.fs.exists(self._path(k)) for k in keys]

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._check_writable()
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        renames = "file" in protocols or "local" in protocols
        for key, value in items.items():          # in order: blobs first, manifest last
            path = self._path(key)
            if key.startswith(("cas/", "ac/")) and self.fs.exists(path):
                continue                          # immutable: first writer wins, later ones are equal
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            if renames:
                tmp = f"{path}.{uuid.uuid4().hex}.partial"
                self.fs.pipe_file(tmp, bytes(value))
                self.fs.mv(tmp, path)             # atomic rename on POSIX filesystems
            else:
                self.fs.pipe_file(path, bytes(value))

    def keys(self, prefix: str = "") -> Iterator[str]:
        fs, root = self.fs, self.root
        ns = prefix.split("/", 1)[0] if prefix else ""
        out = []
        for namespace in ([ns] if ns else ["ac", "cas", "src"]):
            base = f"{root}/{namespace}"
            if not fs.exists(base):
                continue
            for p in fs.find(base):
                name = p.rsplit("/", 1)[1]
                if name.endswith(".partial"):
                    continue
                k = f"{namespace}/{name}"
                if k.startswith(prefix):
                    out.append(k)
        return iter(sorted(out))

    def delete(self, key: str) -> None:
        self._check_writable()
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def __getstate__(self):
        return {"url": self.url, "read_only": self.read_only, "storage_options": self.storage_options}

    def __setstate__(self, state):
        self.__init__(state["url"], read_only=state["read_only"], storage_options=state["storage_options"])

    def __eq__(self, other) -> bool:
        return isinstance(other, FsspecStore) and (self.url, self.read_only) == (other.url, other.read_only)

    def __hash__(self) -> int:
        return hash((self.url, self.read_only))

    def __repr__(self) -> str:
        return f"FsspecStore({self.url!r})"

    def stats(self) -> dict:
        return {"url": self.url}
