"""The shared tier: objects on any fsspec filesystem (an NFS path, ``s3://bucket/prefix``, ...).

On filesystems with rename, each object is published atomically through
``publish`` (temp file, fsync, rename; ``link`` for ``set_if_not_exists``), so a
reader never sees a partial object.  S3 PUTs are atomic per object.  LMDB must
not live on a network filesystem; this tier is how NFS and S3 are used.
"""
from __future__ import annotations

import os
from typing import Iterable, Iterator, Mapping
from urllib.parse import quote

import fsspec
import xxhash

from ..errors import InvalidKeyError
from .base import Store
from .publish import is_partial, publish_bytes


class FsspecStore(Store):
    def __init__(self, url: str, *, read_only: bool = False, storage_options: dict | None = None) -> None:
        super().__init__(read_only=read_only)
        self.url = url.rstrip("/") or url
        self.storage_options = dict(storage_options or {})
        self._fs = None
        self._pid = None

    # --- filesystem -----------------------------------------------------------
    def _resolve(self) -> None:
        if self._fs is None or self._pid != os.getpid():   # fsspec instances are not fork-safe
            fs, root = fsspec.core.url_to_fs(self.url, **self.storage_options)
            protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
            self._local = "file" in protocols or "local" in protocols
            self._s3 = "s3" in protocols
            self._fs, self._root, self._pid = fs, root.rstrip("/"), os.getpid()

    @property
    def fs(self):
        self._resolve()
        return self._fs

    @property
    def root(self) -> str:
        self._resolve()
        return self._root

    @property
    def supports_urls(self) -> bool:   # type: ignore[override]
        self._resolve()
        return self._local or self._s3

    def _path(self, key: str) -> str:
        ns, sep, name = key.partition("/")
        # Keys come from the cache, already checked; this guard keeps every path under the root anyway.
        if not sep or not ns or not name or "/" in name or name in (".", "..") or "\\" in key or "\x00" in key:
            raise InvalidKeyError(f"store key {key[:80]!r} does not name an object under the root")
        # 256-way fan-out keeps directories small on NFS; a hash of the name, because the store
        # does not know what the names mean (and some share long prefixes).
        return f"{self.root}/{ns}/{xxhash.xxh3_64_hexdigest(name.encode())[:2]}/{name}"

    # --- reads ------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            if self._s3:     # one GET: s3fs otherwise sends a HEAD first to plan concurrent ranges
                return self.fs.cat_file(path, max_concurrency=1)
            return self.fs.cat_file(path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def exists_many(self, keys: Iterable[str]) -> list[bool]:
        return [self.fs.isfile(self._path(k)) for k in keys]

    def size(self, key: str) -> int | None:
        try:
            return self.fs.size(self._path(key))
        except FileNotFoundError:
            return None

    def url_for(self, key: str, expires_s: float | None = None) -> str:
        path = self._path(key)
        if self._local:
            return "file://" + quote(os.path.abspath(path))     # SGLang mishandles '#', '?', '%' in plain paths
        if self._s3:
            if expires_s is None:     # the default lives with the other serving facts (vidcache.serving)
                raise ValueError("a presigned URL needs expires_s (vidcache.serving.URL_EXPIRY_S)")
            return self.fs.sign(path, expiration=int(expires_s))
        raise NotImplementedError(f"{self.url} has no URL another machine can read")

    # --- writes -----------------------------------------------------------------
    def _put(self, path: str, value: bytes, exclusive: bool) -> bool:
        if self._local:
            return publish_bytes(path, bytes(value), exclusive=exclusive)
        if exclusive and self.fs.exists(path):   # cheap early out; the conditional PUT below decides
            return False
        if exclusive and self._s3:
            try:     # If-None-Match: * -- S3 refuses the PUT if another writer got there first
                self.fs.pipe_file(path, bytes(value), mode="create")
            except FileExistsError:
                return False
            return True
        self.fs.pipe_file(path, bytes(value))      # one PUT: atomic per object (equal bytes either way for CAS)
        return True

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._check_writable()
        for key, value in items.items():          # in order: the caller puts blobs before manifests
            self._put(self._path(key), value, exclusive=False)

    def set_if_not_exists(self, key: str, value: bytes) -> bool:
        self._check_writable()
        return self._put(self._path(key), value, exclusive=True)

    def delete(self, key: str) -> None:
        self._check_writable()
        try:
            self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def keys(self, prefix: str = "") -> Iterator[str]:
        fs, root = self.fs, self.root
        out = []
        try:
            found = fs.find(root)
        except FileNotFoundError:
            found = []
        for p in found:
            rel = p[len(root):].lstrip("/") if p.startswith(root) else p
            parts = rel.split("/")
            if len(parts) != 3 or is_partial(parts[2]):
                continue
            k = f"{parts[0]}/{parts[2]}"
            if k.startswith(prefix):
                out.append(k)
        return iter(sorted(out))

    # --- value semantics ------------------------------------------------------------
    def with_read_only(self, read_only: bool = True) -> "FsspecStore":
        return FsspecStore(self.url, read_only=read_only, storage_options=self.storage_options)

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

    def usage(self) -> dict:
        """Objects and bytes per namespace, and leftover partial uploads, from one listing."""
        objects: dict[str, int] = {}
        nbytes: dict[str, int] = {}
        partial = [0, 0]
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            found = {}
        for p, info in found.items():
            parts = (p[len(self.root):] if p.startswith(self.root) else p).strip("/").split("/")
            if len(parts) != 3:
                continue
            size = int(info.get("size") or 0)
            if is_partial(parts[2]):
                partial[0] += 1
                partial[1] += size
                continue
            objects[parts[0]] = objects.get(parts[0], 0) + 1
            nbytes[parts[0]] = nbytes.get(parts[0], 0) + size
        return {"objects": objects, "bytes": sum(nbytes.values()), "bytes_by_namespace": nbytes,
                "partial_files": partial[0], "partial_bytes": partial[1]}
