"""Read sources through fsspec: digest while streaming, with caps on size and time.

A source's *fingerprint* (size, mtime, ETag: the validators fsspec exposes) is
a cheap hint that lets an unchanged source skip the download; only the
*digest* of the bytes ever enters a cache key.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from urllib.parse import unquote, urlparse

import fsspec

from ..digest import CHUNK, Digest, StreamingDigest
from ..errors import (EmptySourceError, FetchTimeoutError, SchemeNotAllowedError, SourceNotFoundError,
                      SourceTooLargeError, SourceUnavailableError)

DEFAULT_SCHEMES = ("file", "http", "https", "s3", "data")


@dataclass(frozen=True)
class FetchLimits:
    max_bytes: int = 4 << 30          # refuse sources larger than this
    timeout_s: float = 300.0          # wall-clock cap on one fetch
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    storage_options: dict = field(default_factory=dict, hash=False)   # per-protocol fsspec options


def scheme_of(source: str) -> str:
    if source.startswith("data:"):
        return "data"
    p = urlparse(source)
    return p.scheme if len(p.scheme) > 1 else "file"   # "C:\..." is not a scheme


def local_path(source: str) -> str | None:
    """The filesystem path for plain paths and file:// URIs (percent-decoded), else None."""
    if scheme_of(source) != "file":
        return None
    return unquote(urlparse(source).path) if source.startswith("file:") else source


def _filesystem(source: str, limits: FetchLimits):
    scheme = scheme_of(source)
    if scheme not in limits.schemes:
        raise SchemeNotAllowedError(f"scheme {scheme!r} of {source[:80]!r} is not allowed (allowed: {list(limits.schemes)})")
    opts = dict(limits.storage_options.get(scheme, {}))
    if scheme in ("http", "https"):
        import aiohttp
        opts.setdefault("client_kwargs", {}).setdefault("timeout", aiohttp.ClientTimeout(total=limits.timeout_s))
    fs, path = fsspec.core.url_to_fs(source, **opts)
    return fs, path


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return e


def _translate(source: str, e: BaseException) -> Exception:
    cause = _root_cause(e)
    # fsspec's HTTP filesystem reports a refused connection as FileNotFoundError; look underneath.
    if isinstance(cause, (ConnectionError, OSError)) and not isinstance(cause, FileNotFoundError) \
            or type(cause).__module__.startswith("aiohttp") and "Connect" in type(cause).__name__:
        return SourceUnavailableError(f"cannot read {source[:200]}: connection failed: {cause}")
    if isinstance(e, FileNotFoundError):
        return SourceNotFoundError(f"source not found: {source[:200]}")
    if isinstance(e, (TimeoutError,)) or type(e).__name__ in ("ServerTimeoutError", "ReadTimeoutError", "ConnectTimeoutError"):
        return FetchTimeoutError(f"timed out reading {source[:200]}: {e}")
    if isinstance(e, PermissionError):
        return SourceUnavailableError(f"access denied to {source[:200]}: {e}")
    return SourceUnavailableError(f"cannot read {source[:200]}: {type(e).__name__}: {e}")


def fingerprint(source: str, limits: FetchLimits = FetchLimits()) -> dict | None:
    """Validators for ``source``, or None when the source offers none strong enough to trust."""
    scheme = scheme_of(source)
    if scheme == "data":
        return None  # the URI *is* the content; hashing it is as cheap as looking it up
    path = local_path(source)
    if path is not None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise SourceNotFoundError(f"source not found: {source[:200]}") from None
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
    fs, p = _filesystem(source, limits)
    try:
        info = fs.info(p)
    except Exception as e:
        raise _translate(source, e) from None
    fp = {"size": info.get("size")}
    for k in ("ETag", "etag", "LastModified", "last_modified", "mtime", "VersionId"):
        if info.get(k) is not None:
            fp[k.lower()] = str(info[k])
    return fp if len(fp) > 1 and fp["size"] is not None else None


@dataclass
class Fetched:
    """A local, readable copy of a source (the file itself when it is local)."""
    path: str
    digest: Digest
    temporary: bool

    def cleanup(self) -> None:
        if self.temporary:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def fetch(source: str, limits: FetchLimits = FetchLimits(), tmp_dir: str | None = None) -> Fetched:
    """Digest ``source`` while streaming it; remote sources land in a temp file under ``tmp_dir``."""
    deadline = time.monotonic() + limits.timeout_s
    path = local_path(source)
    if path is not None:
        if "file" not in limits.schemes:
            raise SchemeNotAllowedError(f"local files are not allowed (allowed: {list(limits.schemes)})")
        try:
            size = os.path.getsize(path)
            if os.path.isdir(path):
                raise SourceNotFoundError(f"source is a directory, not a video: {path}")
            _check_size(source, size, limits)
            with open(path, "rb") as f:
                digest = _stream(f, None, source, limits, deadline)
        except FileNotFoundError:
            raise SourceNotFoundError(f"source not found: {source[:200]}") from None
        return Fetched(path, digest, temporary=False)

    fs, p = _filesystem(source, limits)
    fd, tmp = tempfile.mkstemp(prefix="fetch-", suffix=".video", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with fs.open(p, "rb", block_size=CHUNK) as f:
                    size = getattr(f, "size", None)
                    if size is not None:
                        _check_size(source, size, limits)
                    digest = _stream(f, out, source, limits, deadline)
            except (SourceTooLargeError, FetchTimeoutError, EmptySourceError):
                raise
            except Exception as e:
                raise _translate(source, e) from None
        return Fetched(tmp, digest, temporary=True)
    except BaseException:
        os.unlink(tmp)
        raise


def _check_size(source: str, size: int, limits: FetchLimits) -> None:
    if size == 0:
        raise EmptySourceError(f"source is empty (0 bytes): {source[:200]}")
    if size > limits.max_bytes:
        raise SourceTooLargeError(f"source is {size} bytes, over the {limits.max_bytes}-byte cap: {source[:200]}")


def _stream(f, out, source: str, limits: FetchLimits, deadline: float) -> Digest:
    d = StreamingDigest()
    while chunk := f.read(CHUNK):
        d.update(chunk)
        if out is not None:
            out.write(chunk)
        if d.size_bytes > limits.max_bytes:
            raise SourceTooLargeError(f"source exceeds the {limits.max_bytes}-byte cap: {source[:200]}")
        if time.monotonic() > deadline:
            raise FetchTimeoutError(f"fetch of {source[:200]} exceeded {limits.timeout_s}s")
    if d.size_bytes == 0:
        raise EmptySourceError(f"source is empty (0 bytes): {source[:200]}")
    return d.digest()
