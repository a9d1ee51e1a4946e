"""Read sources through fsspec: digest while streaming, with caps on size and time.

A source's *fingerprint* (size, mtime, ETag: the validators fsspec exposes) is
a cheap hint that lets an unchanged source skip the download; only the
*digest* of the bytes ever enters a cache key.

Which filesystem a source names is decided by fsspec's own parse
(``fsspec.core.split_protocol``), never by urllib's, and the allowlist is checked
against that, so no spelling of a local path (``http:clip.mp4``) passes as http.
Every malformed source raises a ``SourceError`` subclass with its own ``kind``.

Remote sources are copied into a temp file under the ``tmp_dir`` the caller gives: a
cache gives its process's own run directory (``loader/tmpdirs.py``).
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import stat
import tempfile
import time
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

import fsspec
import fsspec.asyn

from ..digest import CHUNK, Digest, StreamingDigest
from ..errors import (EmptySourceError, FetchTimeoutError, InvalidSourceError, SchemeNotAllowedError, SourceChangedError,
                      SourceError, SourceNotFoundError, SourceTooLargeError, SourceUnavailableError)

DEFAULT_SCHEMES = ("file", "http", "https", "s3", "data")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class FetchLimits:
    max_bytes: int = 4 << 30          # refuse sources larger than this
    timeout_s: float = 300.0          # wall-clock cap on one fetch, and on one fingerprint
    schemes: tuple[str, ...] = DEFAULT_SCHEMES
    storage_options: dict = field(default_factory=dict, hash=False)   # per-protocol fsspec options


def scheme_of(source: str) -> str:
    """The protocol fsspec resolves ``source`` to, lower-cased; ``file`` for anything fsspec opens locally.

    Total, so callers may branch on it before validation: a non-string has no scheme (``""``), and
    ``fetch``/``fingerprint`` refuse it.
    """
    if not isinstance(source, str):
        return ""
    if source[:5].lower() == "data:":
        return "data"
    protocol, _ = fsspec.core.split_protocol(source)
    return protocol.lower() if protocol else "file"


def canonical_source(source):
    """The one spelling under which a source is recorded and looked up: a local file as its absolute, normalised
    path (``a.mp4``, ``./a.mp4``, ``~/a.mp4``, ``/abs/a.mp4`` and ``file:///abs/a.mp4`` name one file, so one
    entry), every other source as given.  Relative paths resolve against the current directory, once, here: a
    record that kept ``a.mp4`` would mean another file from another directory.  Anything malformed passes through
    unchanged for ``fetch``/``fingerprint`` to refuse with its own error."""
    if not isinstance(source, str) or not source.strip() or scheme_of(source) != "file":
        return source
    try:
        path = _local_path(source)
    except InvalidSourceError:
        return source
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def _checked(source, limits: FetchLimits) -> tuple[str, str]:
    """(scheme, source with its scheme lower-cased), or the specific error for a source that cannot be read.

    Schemes are case-insensitive (RFC 3986 3.1) but fsspec's registry is not, so ``HTTP://`` is normalised
    rather than refused.  Sources are stored as UTF-8 JSON, so lone surrogates (json's ``"\\udcff"``) are
    refused, as are control characters: urllib silently drops tabs and newlines from URLs, and NUL cannot
    be in a path.
    """
    if not isinstance(source, str):
        raise InvalidSourceError(f"a source must be a string, got {type(source).__name__}")
    if not source.strip():
        raise InvalidSourceError(f"the source is empty: {source!r}")
    try:
        source.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidSourceError(f"the source is not valid Unicode (lone surrogate): {source[:200]!r}") from None
    if _CONTROL.search(source):
        raise InvalidSourceError(f"the source contains a control character: {source[:200]!r}")
    scheme = scheme_of(source)
    if scheme not in limits.schemes:
        raise SchemeNotAllowedError(f"scheme {scheme!r} of {source[:80]!r} is not allowed "
                                    f"(allowed: {list(limits.schemes)})")
    if scheme == "data":
        source = "data:" + source[5:]
    elif fsspec.core.split_protocol(source)[0]:
        source = scheme + source[len(scheme):]   # the scheme was cut at "://", so lengths match
    return scheme, source


# What Miles' image path (qwen-vl-utils ``fetch_image``) reads: local files, http(s), data URIs; not s3.
IMAGE_SCHEMES = ("file", "http", "https", "data")


def check_image_source(source, limits: FetchLimits = FetchLimits(schemes=IMAGE_SCHEMES)) -> str:
    """An image reference of a row, refused as a video source would be (D54: images had no allowlist): not a
    string, empty, a control character, or a scheme outside ``IMAGE_SCHEMES`` (and the cache's own allowlist).
    Returns it, its scheme lower-cased."""
    return _checked(source, FetchLimits(schemes=tuple(s for s in limits.schemes if s in IMAGE_SCHEMES)))[1]


def image_failure(label: str, e: BaseException) -> SourceError | None:
    """The source error an image read failed with, by its causes (D54: a refused connection was reported as a
    ``decode``, "not readable"); None when it is the image's bytes (a decode failure, the caller's to report)."""
    chain = _chain(e)
    if any(isinstance(x, SourceError) for x in chain):
        return next(x for x in chain if isinstance(x, SourceError))
    if any(isinstance(x, FileNotFoundError) for x in chain) or getattr(
            getattr(e, "response", None), "status_code", None) in (404, 410):
        return SourceNotFoundError(f"image not found: {label}")
    if any(isinstance(x, (TimeoutError, asyncio.TimeoutError)) for x in chain) or "Timeout" in type(e).__name__:
        return FetchTimeoutError(f"timed out reading image {label}")
    if any(isinstance(x, (ConnectionError, PermissionError)) for x in chain) or type(e).__name__ in (
            "ConnectionError", "HTTPError", "SSLError", "URLError"):
        return SourceUnavailableError(f"cannot read image {label}: {type(e).__name__}: {str(e)[:200]}")
    return None


def _local_path(source: str) -> str:
    """The path of a source fsspec opens locally: ``file:`` URIs percent-decoded, plain paths verbatim."""
    if not source.startswith("file:"):
        return source
    url = urlsplit(source)
    if url.netloc not in ("", "localhost"):
        raise InvalidSourceError(f"file URI names another host ({url.netloc!r}): {source[:200]}")
    path = unquote(url.path)
    if "\0" in path:
        raise InvalidSourceError(f"the file URI decodes to a path with NUL: {source[:200]!r}")
    return path


@contextlib.contextmanager
def _local_errors(source: str):
    """Turn OS errors on a local source into vidcache's (ours pass through: some subclass OSError)."""
    try:
        yield
    except SourceError:
        raise
    except (FileNotFoundError, NotADirectoryError):
        raise SourceNotFoundError(f"source not found: {source[:200]}") from None
    except PermissionError as e:
        raise SourceUnavailableError(f"access denied to {source[:200]}: {e.strerror}") from None
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENAMETOOLONG, errno.EISDIR):
            raise InvalidSourceError(f"cannot be a video file: {source[:200]}: {e.strerror}") from None
        raise SourceUnavailableError(f"cannot read {source[:200]}: {e}") from None


def _require_file(source: str, st: os.stat_result) -> None:
    # A directory has no bytes to hash, and opening a FIFO would block forever.
    if not stat.S_ISREG(st.st_mode):
        what = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InvalidSourceError(f"source is {what}, not a video file: {source[:200]}")


def _filesystem(source: str, scheme: str, limits: FetchLimits):
    """fsspec's filesystem for ``scheme``, and the path within it.

    Resolved from the one protocol split_protocol found, never as a chain (``a::b``): the allowlist approved
    exactly one protocol, and chain splitting would also break IPv6 hosts such as ``http://[::1]/``.
    """
    opts = dict(limits.storage_options.get(scheme, {}))
    if scheme in ("http", "https"):
        import aiohttp
        # Only a backstop: each call is bounded by the deadline itself (``_info``, ``_open_remote``).  It
        # must fire *after* the deadline: when aiohttp's timer and sync()'s cancellation coincide, aiohttp
        # turns the cancellation into its own timeout, which fsspec's info() swallows to retry with GET.
        timeout = aiohttp.ClientTimeout(total=limits.timeout_s + 1.0)
        opts["client_kwargs"] = {"timeout": timeout, **opts.get("client_kwargs", {})}
    try:
        cls = fsspec.get_filesystem_class(scheme)
        fs = cls(**{**cls._get_kwargs_from_urls(source), **opts})
    except (ImportError, ValueError) as e:   # unknown protocol, or its package is not installed
        raise SourceUnavailableError(f"no filesystem for scheme {scheme!r}: {e}") from None
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if scheme not in protocols:   # e.g. a plugin that maps the scheme onto another filesystem
        raise SchemeNotAllowedError(f"scheme {scheme!r} resolves to a {type(fs).__name__} for {protocols}")
    return fs, fs._strip_protocol(source)


def _remaining(source: str, deadline: float, limits: FetchLimits) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise FetchTimeoutError(f"timed out after {limits.timeout_s}s reading {source[:200]}")
    return left


def _info(fs, path: str, source: str, deadline: float, limits: FetchLimits) -> dict:
    """``fs.info(path)`` bounded by the deadline.

    fsspec's HTTP info tries HEAD and then GET, each under aiohttp's per-request timeout, so a hung server
    costs twice the timeout unless the whole call is bounded; fsspec's ``sync(timeout=)`` cancels it.
    """
    try:
        if getattr(fs, "async_impl", False):
            return fsspec.asyn.sync(fs.loop, fs._info, path, timeout=_remaining(source, deadline, limits))
        return fs.info(path)
    except Exception as e:
        raise _translate(source, e, limits) from None


def _chain(e: BaseException) -> list[BaseException]:
    out = [e]
    while (nxt := out[-1].__cause__ or out[-1].__context__) is not None and nxt not in out:
        out.append(nxt)
    return out


def _translate(source: str, e: BaseException, limits: FetchLimits) -> SourceError:
    """A vidcache error for a remote failure, judged by its root causes.

    fsspec's HTTP filesystem reports *any* failure of its info call (timeout, refused connection, HTTP 500)
    as FileNotFoundError, so the wrapper alone says nothing; look underneath.
    """
    import aiohttp
    if isinstance(e, SourceError):
        return e
    chain = _chain(e)
    if any(isinstance(x, (TimeoutError, asyncio.TimeoutError)) for x in chain):
        return FetchTimeoutError(f"timed out after {limits.timeout_s}s reading {source[:200]}")
    status = next((x.status for x in chain if isinstance(x, aiohttp.ClientResponseError)), None)
    if status in (404, 410):
        return SourceNotFoundError(f"source not found (HTTP {status}): {source[:200]}")
    if status is not None:
        return SourceUnavailableError(f"cannot read {source[:200]}: HTTP {status}")
    cause = chain[-1]
    if isinstance(cause, ValueError):      # yarl's and aiohttp's bad URLs, a data: URI without a comma, ...
        return InvalidSourceError(f"not a readable address: {source[:200]}: {cause}")
    if any(isinstance(x, PermissionError) for x in chain):
        return SourceUnavailableError(f"access denied to {source[:200]}: {e}")
    if isinstance(cause, (aiohttp.ClientError, OSError)) and not isinstance(cause, FileNotFoundError):
        return SourceUnavailableError(f"cannot read {source[:200]}: connection failed: {cause}")
    if isinstance(e, FileNotFoundError):
        return SourceNotFoundError(f"source not found: {source[:200]}")
    return SourceUnavailableError(f"cannot read {source[:200]}: {type(cause).__name__}: {cause}")


def fingerprint(source: str, limits: FetchLimits = FetchLimits()) -> dict | None:
    """Validators for ``source``, or None when the source offers none strong enough to trust."""
    deadline = time.monotonic() + limits.timeout_s
    scheme, source = _checked(source, limits)
    if scheme == "data":
        return None  # the URI *is* the content; hashing it is as cheap as looking it up
    if scheme == "file":
        with _local_errors(source):
            st = os.stat(_local_path(source))
        _require_file(source, st)
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
    fs, p = _filesystem(source, scheme, limits)
    info = _info(fs, p, source, deadline, limits)
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
    stat: tuple | None = None      # a local source's (device, inode, size, mtime_ns) when it was hashed

    def check_unchanged(self) -> None:
        """Raise ``SourceChangedError`` if the local source is no longer the file that was hashed: the decoder
        reopens it by name, and frames decoded from other bytes than the digest names would be cached under
        it (D35: one key, different frames on two nodes)."""
        if self.stat is None:
            return
        try:
            now = _identity(os.stat(self.path))
        except OSError as e:
            raise SourceChangedError(f"{self.path} went away while it was decoded ({e.strerror})") from None
        if now != self.stat:
            raise SourceChangedError(f"{self.path} changed while it was hashed and decoded (size {self.stat[2]} -> "
                                     f"{now[2]} bytes): nothing was cached; prewarm it again once it is complete")

    def cleanup(self) -> None:
        if self.temporary:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def fetch(source: str, limits: FetchLimits = FetchLimits(), tmp_dir: str | None = None) -> Fetched:
    """Digest ``source`` while streaming it; remote sources land in a temp file under ``tmp_dir``."""
    deadline = time.monotonic() + limits.timeout_s
    scheme, source = _checked(source, limits)
    if scheme == "file":
        path = _local_path(source)
        with _local_errors(source):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)   # a FIFO must not block the open
            try:
                st = os.fstat(fd)               # the file opened, not whatever the name points to now
                _require_file(source, st)
                _check_size(source, st.st_size, limits)
            except BaseException:
                os.close(fd)
                raise
            with open(fd, "rb") as f:
                digest = _stream(f, None, source, limits, deadline)
                after = os.fstat(f.fileno())
        if _identity(after) != _identity(st) or after.st_size != digest.size_bytes:
            raise SourceChangedError(f"{source} changed while it was hashed ({st.st_size} -> {after.st_size} "
                                     "bytes): nothing was cached; prewarm it again once it is complete")
        return Fetched(path, digest, temporary=False, stat=_identity(after))

    fs, p = _filesystem(source, scheme, limits)
    fd, tmp = tempfile.mkstemp(prefix="fetch-", suffix=".video", dir=tmp_dir)
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with _open_remote(fs, p, scheme, source, limits, deadline) as f:
                    size = getattr(f, "size", None)
                    if size is not None:
                        _check_size(source, size, limits)
                    digest = _stream(f, out, source, limits, deadline)
            except SourceError:
                raise
            except Exception as e:
                raise _translate(source, e, limits) from None
        return Fetched(tmp, digest, temporary=True)
    except BaseException:
        os.unlink(tmp)
        raise


def _open_remote(fs, p: str, scheme: str, source: str, limits: FetchLimits, deadline: float):
    if scheme not in ("http", "https"):
        return fs.open(p, "rb", block_size=CHUNK)
    # HTTP: one streaming GET of the whole body (fsspec's HTTPStreamFile, block_size=0).  fsspec's default
    # ranged reads fail past the first blocks on servers that ignore Range, and a whole-file read gains
    # nothing from ranges.  The deadline bounds the info call and, as aiohttp's per-request timeout, the
    # GET with its body.
    import aiohttp
    size = _info(fs, p, source, deadline, limits).get("size")
    if size is not None:
        _check_size(source, size, limits)      # refuse before downloading
    # ``size`` only spares open() a second, unbounded HEAD; a streaming file does not use it, so any
    # positive value serves when the server sent no Content-Length.
    return fs.open(p, "rb", block_size=0, size=size or 1,
                   timeout=aiohttp.ClientTimeout(total=_remaining(source, deadline, limits)))


def _check_size(source: str, size: int, limits: FetchLimits) -> None:
    if size == 0:
        raise EmptySourceError(f"source is empty (0 bytes): {source[:200]}")
    if size > limits.max_bytes:
        raise SourceTooLargeError(f"source is {size} bytes, over the {limits.max_bytes}-byte cap: {source[:200]}")


def _stream(f, out, source: str, limits: FetchLimits, deadline: float) -> Digest:
    d = StreamingDigest()
    while chunk := f.read(CHUNK):
        d.update(chunk)
        if d.size_bytes > limits.max_bytes:
            raise SourceTooLargeError(f"source exceeds the {limits.max_bytes}-byte cap: {source[:200]}")
        if out is not None:
            out.write(chunk)
        _remaining(source, deadline, limits)
    if d.size_bytes == 0:
        raise EmptySourceError(f"source is empty (0 bytes): {source[:200]}")
    return d.digest()
