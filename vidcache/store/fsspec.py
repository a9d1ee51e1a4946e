"""The shared tier: objects on an fsspec filesystem, one store class per medium, as zarr's store layer.

* ``DirectoryStore`` (``store/directory.py``): a directory, local or an NFS mount.  Each object is published
  atomically (temp file, fsync, rename; ``link`` for ``set_if_not_exists``), read without following links.
* ``S3Store`` (``store/s3.py``): ``s3://bucket/prefix``.  PUTs are atomic per object; a conditional PUT creates.
* ``FsspecStore`` (here): any other fsspec filesystem (``memory://``, ...), and what the two share: keys to
  paths, every call bounded in time, failures named, object sizes bounded, listings.

``FsspecStore(url)`` opens the store of ``url``'s medium (``store_class``: the one place it is chosen).  What the
media differ in is declared (``supports_urls``, ``supports_partial_sweep``, ``exclusive_create``), as the store
contract declares capabilities, and asked for, never branched on.  LMDB must not live on a network filesystem;
this tier is how NFS and S3 are used.

Failures are bounded and named here, at the store's edge (as zarr's FsspecStore
translates its filesystem's errors): every call ends within ``timeout_s``, and
an unreachable, hung, read-only, forbidden or full tier raises its own
``StoreError`` (``vidcache.errors``) naming the tier and the fix, never a raw
botocore or OSError traceback.  A missing object is an answer, not a failure.
"""
from __future__ import annotations

import errno
import functools
import logging
import os
import sys
import threading
import time
from typing import Iterable, Iterator, Mapping

import fsspec
import xxhash

from ..errors import (ConfigError, InvalidKeyError, NoSpaceError, OversizedObjectError, PermissionDeniedError,
                      ReadOnlyFilesystemError, SharedTimeoutError, SharedUnavailableError, StoreError, VidcacheError)
from .base import Store
from .publish import is_partial



@functools.lru_cache(maxsize=None)
def _s3_stack():
    """aiohttp, botocore's exceptions and s3fs's retryable errors, imported by the first S3 tier (s3fs imports
    them; 0.14 s of every CLI call on a node whose tier is a directory, so never before)."""
    try:
        import aiohttp
        import botocore.exceptions as boto
        from s3fs.core import S3_RETRYABLE_ERRORS
    except ImportError:        # s3fs is a dependency, but only S3 tiers need it
        return None, None, ()
    return aiohttp, boto, S3_RETRYABLE_ERRORS


def _s3_errors():
    """``_s3_stack`` where S3 can have failed (botocore is loaded); else nothing of it was used, so no error of
    its can exist, and nothing is imported."""
    return _s3_stack() if "botocore" in sys.modules else (None, None, ())

log = logging.getLogger(__name__)
ENV_TIMEOUT = "VIDCACHE_SHARED_TIMEOUT_S"
# The most one call on one object may take, end to end.  Generous, because a blob can be a few hundred MB
# on a slow link; it exists to stop a hung tier (an S3 PUT to a hung endpoint otherwise waits forever, and
# a hard-mounted NFS server that stops answering blocks a read in the kernel).
DEFAULT_TIMEOUT_S = 60.0
# ``stream``'s piece: large enough that handing pieces on costs nothing next to the decode, small enough
# that the decoder starts within a millisecond of the first bytes.
STREAM_PIECE = 1 << 20
# A listing (keys, usage, sweep) walks the whole tier: minutes on a big bucket.  This only stops a hung one.
LIST_TIMEOUT_S = 600.0

# The largest object an entry writes is its frames (a raw blob; its compact object and its manifest are
# smaller), and the decode budget bounds those: loader.build.DEFAULT_MAX_DECODED_BYTES, or the cache's
# max_decoded_bytes (CacheConfig.shared_store passes it).  An eighth more for a container around frames that
# do not compress.  Anything larger no entry wrote, so it is refused before a byte is read (D33: a planted
# 2 GiB object took 4.6 GB of memory to read).  $VIDCACHE_SHARED_MAX_OBJECT_BYTES sets the bound outright.
ENV_MAX_OBJECT = "VIDCACHE_SHARED_MAX_OBJECT_BYTES"
DEFAULT_DECODE_BUDGET = 8 << 30     # loader.build.DEFAULT_MAX_DECODED_BYTES (not imported: it loads torch)


def default_max_object_bytes(decode_budget: int | None = None) -> int:
    """The bound on one object's size: ``$VIDCACHE_SHARED_MAX_OBJECT_BYTES``, else from ``decode_budget``."""
    raw = os.environ.get(ENV_MAX_OBJECT)
    if raw:
        try:
            n = int(raw)
        except ValueError:
            n = 0
        if n <= 0:
            raise ConfigError(f"{ENV_MAX_OBJECT}={raw!r}: expected a positive number of bytes")
        return n
    budget = DEFAULT_DECODE_BUDGET if decode_budget is None else decode_budget
    return budget + budget // 8

# Answers, not failures: each call turns them into its result (a miss, "already there").
_ANSWERS = (FileNotFoundError, FileExistsError, IsADirectoryError, NotADirectoryError)
_UNREACHABLE = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EHOSTUNREACH,
                errno.ENETUNREACH, errno.EHOSTDOWN, errno.ENETDOWN}


def _default_timeout() -> float:
    raw = os.environ.get(ENV_TIMEOUT)
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        t = float(raw)
    except ValueError:
        t = float("nan")
    if not t > 0 or t == float("inf"):
        raise ConfigError(f"{ENV_TIMEOUT}={raw!r}: expected a positive number of seconds")
    return t


def _in_thread(limit: float, fn, *args, **kwargs):
    """``fn(*args, **kwargs)``, given up on after ``limit`` seconds.

    A syscall on a hung NFS mount never returns and cannot be interrupted: only the waiting can end, so
    the call runs in its own thread.  A daemon thread, so one stuck in the kernel never keeps the process
    from exiting.
    """
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args, **kwargs)
        except BaseException as e:        # handed to the caller below
            out["error"] = e

    t = threading.Thread(target=run, name="vidcache-shared-io", daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        raise TimeoutError(f"no answer within {limit:g} s")
    if "error" in out:
        raise out["error"]
    return out["value"]


def _failure(e: BaseException, s3: bool) -> str | None:
    """What kind of tier failure ``e`` is, or None when it is not one (a bug: passed on untouched)."""
    aiohttp, _boto, _ = _s3_errors()
    n = e.errno if isinstance(e, OSError) else None
    if isinstance(e, TimeoutError) or n == errno.ETIMEDOUT or (
            _boto and isinstance(e, (_boto.ConnectTimeoutError, _boto.ReadTimeoutError))):
        return "timeout"
    if n == errno.EROFS:
        return "read_only"
    if n in (errno.ENOSPC, errno.EDQUOT):
        return "no_space"
    if isinstance(e, PermissionError) or n in (errno.EACCES, errno.EPERM) or (
            _boto and isinstance(e, _boto.NoCredentialsError)):
        return "denied"
    if isinstance(e, ConnectionError) or n in _UNREACHABLE or (s3 and n == errno.EBUSY) or (
            _boto and isinstance(e, (_boto.ConnectionError, _boto.HTTPClientError))) or (
            aiohttp and isinstance(e, aiohttp.ClientError)):       # e.g. a body cut off part-way
        return "unavailable"      # s3fs reports S3's SlowDown/503 as EBUSY
    if isinstance(e, OSError) or (_boto and isinstance(e, (_boto.BotoCoreError, _boto.ClientError))):
        return "other"
    return None


def _detail(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


# protocol -> the store class of that medium: each medium's class names its protocols (``protocols``) and is
# entered here when it is defined (``vidcache.store`` imports them all, so every importer of this module has them).
_MEDIA: dict[str, type] = {}


def store_class(url: str) -> type["FsspecStore"]:
    """The store class of ``url``'s medium: a directory (a plain path, ``file://``), S3, or any other fsspec URL."""
    return _MEDIA.get(fsspec.core.split_protocol(url)[0] or "file", FsspecStore)


class FsspecStore(Store):
    supports_writes = supports_deletes = supports_listing = True
    supports_usage = True
    supports_urls = False             # a URL another machine can read (a directory: file://; S3: presigned)
    supports_partial_sweep = False    # only a directory's publish leaves temporary files behind a killed writer
    exclusive_create = False          # whether ``set_if_not_exists`` is decided by the medium (else a look first)
    protocols: tuple[str, ...] = ()   # the URL protocols whose medium this class is (``store_class``)
    # timeout_s: set per store (``__init__``)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        _MEDIA.update(dict.fromkeys(cls.__dict__.get("protocols", ()), cls))

    def __new__(cls, url: str | None = None, *args, **kwargs):
        # ``FsspecStore(url)`` is the store of url's medium; a subclass named, or unpickled, is itself.
        if cls is FsspecStore and url is not None:
            cls = store_class(url)
        return super().__new__(cls)

    def __init__(self, url: str, *, read_only: bool = False, storage_options: dict | None = None,
                 timeout_s: float | None = None, max_object_bytes: int | None = None) -> None:
        """``timeout_s``: the most one call on one object may take (default ``$VIDCACHE_SHARED_TIMEOUT_S``
        or 60 s); S3 requests also get bounded botocore timeouts and retries unless ``storage_options``
        sets its own ``config_kwargs``.  ``max_object_bytes``: larger objects are refused unread
        (``OversizedObjectError``; default ``default_max_object_bytes()``)."""
        super().__init__(read_only=read_only)
        self.url = url.rstrip("/") or url
        self.storage_options = dict(storage_options or {})
        self.timeout_s = float(timeout_s) if timeout_s is not None else _default_timeout()
        self.max_object_bytes = default_max_object_bytes() if max_object_bytes is None else int(max_object_bytes)
        self._fs = None
        self._pid = None

    # --- filesystem -----------------------------------------------------------
    def _storage_options(self) -> dict:
        """The options the filesystem is opened with (S3 fills in bounded timeouts)."""
        return self.storage_options

    def _resolve(self) -> None:
        if self._fs is None or self._pid != os.getpid():   # fsspec instances are not fork-safe
            fs, root = fsspec.core.url_to_fs(self.url, **self._storage_options())
            self._fs, self._root, self._pid = fs, root.rstrip("/"), os.getpid()

    @property
    def fs(self):
        self._resolve()
        return self._fs

    @property
    def root(self) -> str:
        self._resolve()
        return self._root

    def _path(self, key: str) -> str:
        ns, sep, name = key.partition("/")
        # Keys come from the cache, already checked; this guard keeps every path under the root anyway.
        if not sep or not ns or not name or "/" in name or name in (".", "..") or "\\" in key or "\x00" in key:
            raise InvalidKeyError(f"store key {key[:80]!r} does not name an object under the root")
        # 256-way fan-out keeps directories small on NFS; a hash of the name, because the store
        # does not know what the names mean (and some share long prefixes).
        return f"{self.root}/{ns}/{xxhash.xxh3_64_hexdigest(name.encode())[:2]}/{name}"

    # --- every call on the filesystem: bounded in time, failures named -----------------
    def _call(self, what: str, fn, *args, limit: float | None = None, **kwargs):
        limit = self.timeout_s if limit is None else limit
        t0 = time.monotonic()
        try:
            if getattr(self.fs, "async_impl", False):    # fsspec's sync wrapper cancels the call at `timeout`
                return fn(*args, timeout=limit, **kwargs)
            return _in_thread(limit, fn, *args, **kwargs)
        except (VidcacheError, *_ANSWERS):
            raise
        except Exception as e:
            kind = _failure(e, self._busy_is_unavailable)
            if kind is None:
                raise
            raise self._error(kind, what, e, time.monotonic() - t0) from None

    # Whether EBUSY means the tier is overloaded (s3fs reports S3's SlowDown/503 so) rather than a local failure.
    _busy_is_unavailable = False

    def _error(self, kind: str, what: str, e: BaseException, took: float) -> StoreError:
        """One line: the tier, what failed, why, and what fixes it."""
        tier = f"shared tier {self.url}"
        if kind == "timeout":
            return SharedTimeoutError(
                f"{tier}: {what} got no answer in {took:.0f} s ({_detail(e)}); check that the tier (its S3 "
                f"endpoint or NFS server) is up and reachable from this node, or give a slow one longer "
                f"with {ENV_TIMEOUT} (now {self.timeout_s:g})")
        if kind == "unavailable":
            return SharedUnavailableError(
                f"{tier} is unreachable ({what}: {_detail(e)}); check that it is up and that its URL and "
                "endpoint_url are right")
        if kind == "read_only":
            return ReadOnlyFilesystemError(
                f"{tier} is on a read-only filesystem ({what}); remount it read-write, or open the cache "
                "read-only (read_only=True) to only read from it")
        if kind == "denied":
            return PermissionDeniedError(
                f"{tier} refused this node ({what}: {_detail(e)}); give it read and write access (on S3: "
                "credentials whose policy allows the bucket and prefix), or open the cache read-only")
        if kind == "no_space":
            return NoSpaceError(f"{tier} is out of space ({what}); free space on it or grow its volume or quota")
        return StoreError(f"{tier}: {what} failed ({_detail(e)})")

    # --- reads ------------------------------------------------------------------
    def _check_size(self, key: str, size) -> None:
        """Before any byte of an object is read: refuse one larger than an entry can write."""
        if size is not None and int(size) > self.max_object_bytes:
            raise OversizedObjectError(
                f"shared tier {self.url}: object {key} is {int(size)} bytes, more than any entry writes "
                f"(bound {self.max_object_bytes}); not read. Remove it from the tier, or set {ENV_MAX_OBJECT} "
                "if entries really are that large")

    def get(self, key: str) -> bytes | None:
        path = self._path(key)
        try:
            self._check_size(key, self._call(f"size {key}", self.fs.size, path))
            return self._call(f"get {key}", self.fs.cat_file, path)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def _stream(self, key: str, path: str, sink):
        """A callable that hands ``key``'s bytes to ``sink`` as they arrive (raising FileNotFoundError for a
        missing object); None: this medium has no streaming read, and ``stream`` reads it whole."""
        return None

    def stream(self, key: str, sink) -> bool:
        """The object handed on in pieces as it arrives, the whole transfer bounded by the tier's timeout as one
        ``get`` is (a directory: the file in pieces; S3: one GET's body).  Other filesystems: ``get``."""
        path = self._path(key)
        run = self._stream(key, path, sink)
        if run is None:
            return super().stream(key, sink)
        try:
            self._call(f"get {key}", run)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return False
        return True

    def _isfile(self, key: str) -> bool:
        # Not fs.isfile: it answers False for *any* error, so an outage would look like an empty tier.
        try:
            return self._call(f"look up {key}", self.fs.info, self._path(key))["type"] == "file"
        except (FileNotFoundError, NotADirectoryError):
            return False

    def exists_many(self, keys: Iterable[str]) -> list[bool]:
        return [self._isfile(k) for k in keys]

    def size(self, key: str) -> int | None:
        try:
            return self._call(f"size {key}", self.fs.size, self._path(key))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def url_for(self, key: str, expires_s: float | None = None) -> str:
        raise NotImplementedError(f"{self.url} has no URL another machine can read")

    # --- writes -----------------------------------------------------------------
    def _put(self, key: str, value: bytes, exclusive: bool) -> bool:
        path, what = self._path(key), f"put {key}"
        if exclusive and self._call(what, self.fs.exists, path):   # cheap early out; the PUT below decides
            return False
        if exclusive and self.exclusive_create:
            try:     # the medium refuses the write if another writer got there first (S3: If-None-Match: *)
                self._call(what, self.fs.pipe_file, path, bytes(value), mode="create")
            except FileExistsError:
                return False
            return True
        # one PUT: atomic per object (equal bytes either way for CAS)
        self._call(what, self.fs.pipe_file, path, bytes(value))
        return True

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._check_writable()
        for key, value in items.items():          # in order: the caller puts blobs before manifests
            self._put(key, value, exclusive=False)

    def set_if_not_exists(self, key: str, value: bytes) -> bool:
        self._check_writable()
        return self._put(key, value, exclusive=True)

    def _before_change(self, path: str) -> None:
        """Called before a write or delete at ``path`` (a directory checks its own directories)."""

    def delete(self, key: str) -> None:
        self._check_writable()
        self._before_change(self._path(key))
        try:
            self._call(f"delete {key}", self.fs.rm_file, self._path(key))
        except FileNotFoundError:
            pass

    def _find(self, ns: str = "") -> dict:
        """Every object under the root, or under its namespace ``ns`` only: path -> info."""
        try:
            return self._call("list", self.fs.find, f"{self.root}/{ns}" if ns else self.root, detail=True,
                              limit=LIST_TIMEOUT_S)
        except FileNotFoundError:
            return {}

    def keys(self, prefix: str = "") -> Iterator[str]:
        # A prefix that names a namespace (``ac/``) lists that namespace only (issue 50: ``ls`` listed every blob,
        # source record and frozen file of the tier to find its entries, three listings of the whole tier).  The
        # sort needs every name (the fan-out directory is a hash of the name), but only the names are kept.
        ns, sep, _ = prefix.partition("/")
        out = []
        for p, _ in self._objects(ns if sep and ns else ""):
            parts = self._parts(p)
            if len(parts) == 3 and not is_partial(parts[2]) and (k := f"{parts[0]}/{parts[2]}").startswith(prefix):
                out.append(k)
        out.sort()
        return iter(out)

    def _parts(self, path: str) -> list[str]:
        """A listed path's components under the root: ``[namespace, fan-out, name]`` for an object."""
        return (path[len(self.root):] if path.startswith(self.root) else path).strip("/").split("/")

    # --- value semantics (Store's, from _args): the filesystem is made again where unpickled ----------
    # The storage options (credentials included) pickle with the store, as they always have.
    _location = ("url",)
    _pickle_args = True

    def _args(self) -> dict:
        return {"url": self.url, "read_only": self.read_only, "storage_options": self.storage_options,
                "timeout_s": self.timeout_s}

    def stats(self) -> dict:
        return {"url": self.url}

    def _objects(self, ns: str = "") -> Iterable[tuple[str, dict]]:
        """(path, info) of every object under the root, or under namespace ``ns``, from one listing (S3: a LIST
        request per 1,000 keys; fsspec hands the listing back whole)."""
        return self._find(ns).items()

    def usage(self) -> dict:
        """Objects and bytes per namespace, and leftover partial uploads, from one listing."""
        objects: dict[str, int] = {}
        nbytes: dict[str, int] = {}
        partial = [0, 0]
        for p, info in self._objects():
            parts = self._parts(p)
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
