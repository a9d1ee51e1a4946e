"""The engine-neutral half of ``vidcache check-server``: a check's verdict (``ServerCheck``, one ``Cause`` per
failed check), the bounded JSON-over-HTTP call every check makes, the version verdict, the checkpoint's processor,
and the canary video.

``vidcache.sglang.check`` and ``vidcache.vllm.check`` each ask their engine's own endpoints and build on these;
neither imports the other.
"""
from __future__ import annotations

import http.client
import json
import os
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import ParityError, VidcacheError
from ..families import FAMILIES
from ..options import VideoOptions


@dataclass(frozen=True)
class Cause:
    kind: str          # version | config | model | plugin | attestation | ids | layout | torchcodec | server |
                       # processor | request | loader
    message: str

    def line(self) -> str:
        return f"FAIL [{self.kind}] {self.message}"


@dataclass
class ServerCheck:
    url: str
    family: str | None = None
    mode: str | None = None
    version: str | None = None
    causes: list[Cause] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    token_layout: str | None = None        # the layout the trainer's ids (and the plugin's references) are in
    engine: str = ""                       # "SGLang" (vidcache.sglang.check) or "vLLM" (vidcache.vllm.check)
    mode_flag: str = "--mode"              # the caller's spelling (vidcache.sglang.check.CLI_FLAGS)

    @property
    def ok(self) -> bool:
        return not self.causes

    def lines(self) -> list[str]:
        head = f"{self.url}: {self.engine} {self.version or '?'}, {self.family or '?'}, {self.mode or '?'} mode"
        warn = [f"WARN {w}" for w in self.warnings]
        if self.ok:
            # Stock mode sees ids and the server's self-reported config only (D38): the line says so.
            limit = ("; stock mode: the pixels are NOT checked (the server's own processor settings and decoder "
                     f"are taken on trust; {self.mode_flag} plugin attests them)" if self.mode == "stock" else "")
            return [f"OK   {head}: parity established ({'; '.join(self.passed)}{limit})"] + warn
        # The verdict first, then why, then what is only worth knowing (a warning never fails the check).
        return [f"{head}: parity NOT established"] + [c.line() for c in self.causes] + warn

    def raise_for_causes(self) -> None:
        if self.causes:
            raise ParityError("\n".join(self.lines()))


# The largest reply a check reads: /server_info and /generate answer in kilobytes, so a server (or proxy) that
# streams on is cut off here rather than growing the checking process, on a trainer node, until it is killed
# (D53: 3.1 GB after 5 s).
MAX_REPLY_BYTES = 32 << 20

class ServerReplyError(VidcacheError, ValueError):
    """The server's reply is not one a check can read (malformed HTTP, JSON nested too deeply, not a JSON object,
    too large, too slow): the check's ``[server]`` cause, or the CLI's ``[server]`` error."""
    kind = "server"


class ReplyTooLargeError(ServerReplyError, ParityError):
    """A server's reply was larger than any a check expects (``MAX_REPLY_BYTES``): not read further."""


class ServerTimeoutError(ServerReplyError, TimeoutError):
    """The server had not answered, whole, by the check's deadline."""


_DEADLINE: ContextVar[float | None] = ContextVar("vidcache_check_deadline", default=None)


@contextmanager
def check_deadline(seconds: float):
    """Every ``http_json`` inside ends by ``seconds`` from now (or an enclosing deadline, if sooner): one bound
    for a whole check, however many requests it makes and however slowly the server answers them."""
    end = time.monotonic() + seconds
    outer = _DEADLINE.get()
    token = _DEADLINE.set(end if outer is None else min(end, outer))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def _opener(end: float, fired: threading.Event, timers: list):
    """A urllib opener (proxies and redirects as ``urlopen``'s) whose connections are shut at ``end`` by a timer:
    the blocked read then returns, whatever stage (status line, headers, body) the server is dripping."""
    def arm(conn) -> None:
        sock = conn.sock

        def shut() -> None:
            fired.set()
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:                    # already closed: nothing left to unblock
                pass
        t = threading.Timer(max(0.0, end - time.monotonic()), shut)
        t.daemon = True
        timers.append(t)
        t.start()

    class HTTPConnection(http.client.HTTPConnection):
        def connect(self):
            super().connect()
            arm(self)

    class HTTPSConnection(http.client.HTTPSConnection):
        def connect(self):
            super().connect()
            arm(self)

    class HTTPHandler(urllib.request.HTTPHandler):
        def http_open(self, req):
            return self.do_open(HTTPConnection, req)

    class HTTPSHandler(urllib.request.HTTPSHandler):
        def https_open(self, req):
            return self.do_open(HTTPSConnection, req, context=self._context)

    return urllib.request.build_opener(HTTPHandler, HTTPSHandler)


def _read_bounded(r, url: str) -> bytes:
    body = r.read(MAX_REPLY_BYTES + 1)
    if len(body) > MAX_REPLY_BYTES:
        raise ReplyTooLargeError(f"{url} replied with more than {MAX_REPLY_BYTES} bytes; not read further "
                                 "(is a proxy in front of the server?)")
    return body


def _parse(body: bytes, url: str) -> dict:
    try:
        out = json.loads(body or b"{}")
    except RecursionError:                     # json's parser recurses once per level: 2M "[" overflow it
        raise ServerReplyError(f"{url} replied with JSON nested too deeply to read") from None
    except ValueError as e:                    # not JSON, not UTF-8
        raise ServerReplyError(f"{url} replied with no JSON: {e}") from None
    if not isinstance(out, dict):
        raise ServerReplyError(f"{url} replied with a JSON {type(out).__name__}, not an object")
    return out


def http_json(url: str, payload: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
    """POST ``payload`` (GET without one) and read the JSON object replied: ``(status, body)``; an error status's
    body that is not a JSON object comes back as ``{"error": {"message": text}}``.  The whole exchange ends by
    ``timeout`` seconds, or by the enclosing ``check_deadline``, if sooner.  A connection refused or reset is an
    ``OSError``; a reply that cannot be read, or not in time, a ``ServerReplyError``."""
    start = time.monotonic()
    end = start + timeout
    if (outer := _DEADLINE.get()) is not None:
        end = min(end, outer)
    if end <= start:
        raise ServerTimeoutError(f"no time left to ask {url}: the check's deadline (check-server --timeout) has "
                                 "passed")
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    fired, timers = threading.Event(), []
    try:
        try:
            with _opener(end, fired, timers).open(req, timeout=end - time.monotonic()) as r:
                status, body = r.status, _read_bounded(r, url)
        except urllib.error.HTTPError as e:
            status, body = e.code, _read_bounded(e, url)
        if fired.is_set():             # cut at the deadline, and what came may parse (headers cut read as ended)
            raise TimeoutError
    except (OSError, http.client.HTTPException) as e:
        if fired.is_set() or isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
            raise ServerTimeoutError(f"{url} had not replied in full within {end - start:.1f} s, the time "
                                     "left to the check (check-server --timeout); not waited for further") from None
        if isinstance(e, http.client.HTTPException):       # more than 100 headers, a bad status line, cut short
            raise ServerReplyError(f"{url} replied with a malformed HTTP response: {e!r}") from None
        raise                                              # refused, reset, unreachable: the caller's OSError
    finally:
        for t in timers:
            t.cancel()
    if 200 <= status < 300:            # urllib raised HTTPError for any other status
        return status, _parse(body, url)
    try:
        return status, _parse(body, url)
    except ServerReplyError:           # an error page: its text is the message
        return status, {"error": {"message": body.decode(errors="replace")[:2000]}}


def error_message(body: dict) -> str:
    err = body.get("error", body)
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)


def exact_canary_options(family: str, nframes: int = 2) -> VideoOptions:
    """The canary for an engine that takes the cached frames as they are (SGLang's plugin, vLLM's loader): two
    frames (or ``nframes``), small enough that the canary's rows travel in its attestation
    (``attest.VALUES_MAX_BYTES``)."""
    side = 2 * FAMILIES[family].grid
    return VideoOptions(family=family, nframes=nframes, resized_height=side, resized_width=side)


def canary_video(options: VideoOptions, cache=None):
    """The canary video, made here (deterministic content: the same entry on every run) and cached with
    ``options`` through this node's configuration (``cache``, default ``VIDCACHE_DIR`` + ``VIDCACHE_SHARED``)."""
    return canary_clip("vidcache-canary", 8, 4, options, cache)     # 2 s at 4 fps


def canary_clip(name: str, n_frames: int, fps: int, options: VideoOptions, cache=None):
    """A deterministic noise clip (96 x 96, ``n_frames`` at ``fps``; noise exercises every bit) written once per user
    under ``name`` and cached with ``options`` (``canary_video``; the computation check's longer clip)."""
    import numpy as np

    from ..encode import write_video
    from ..handle import get
    rng = np.random.default_rng(20261201)
    frames = rng.integers(0, 256, (n_frames, 96, 96, 3), dtype=np.uint8)
    # NUT, not Matroska: Matroska writes a random segment UID, so every run cached a new canary entry (D40).  One
    # fixed path per user, written whole (os.replace), so its source record is the same every run too.
    d = os.path.join(tempfile.gettempdir(), f"vidcache-canary-{os.getuid() if hasattr(os, 'getuid') else 0}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{name}.nut")
    tmp = tempfile.NamedTemporaryFile(dir=d, suffix=".nut", delete=False)
    tmp.close()
    try:
        write_video(tmp.name, frames, codec="ffv1", rate=Fraction(fps), pix_fmt="bgr0", exact_time_base=True)
        os.replace(tmp.name, path)
    finally:
        if os.path.exists(tmp.name):
            os.unlink(tmp.name)
    return get(path, options, cache)


def load_processor(path: str):
    """The checkpoint's HF processor, from its directory (transformers is imported only here)."""
    from transformers import AutoProcessor
    return AutoProcessor.from_pretrained(path)


def check_url(url) -> str:
    """A server URL as the checks take it: ``http://`` or ``https://`` and a host, else a ``[config]`` error that
    shows the fix (urllib's own is "unknown url type")."""
    from urllib.parse import urlsplit

    from ..errors import ConfigError
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        shown = url if isinstance(url, str) else type(url).__name__
        hint = f"http://{shown}" if isinstance(url, str) and "://" not in url else "http://HOST:PORT"
        raise ConfigError(f"the server URL must start with http:// or https:// and name a host, got {shown!r}: "
                          f"e.g. {hint}")
    return url.rstrip("/")


def local_checkpoint(path) -> str | None:
    """The directory of a checkpoint a server names (``tokenizer_path``, a vLLM model's ``root``): the path itself
    when it is a directory here, else, for a hub id (``Qwen/Qwen2.5-VL-7B-Instruct``), its snapshot in this
    machine's Hugging Face cache, found as ``from_pretrained`` finds it (nothing is downloaded).  None: neither."""
    if not isinstance(path, str) or not path:
        return None
    if os.path.isdir(path):
        return path
    if path.count("/") != 1 or path.startswith(("/", ".")):
        return None             # not a hub id: a path of the server's machine
    try:
        from huggingface_hub import snapshot_download
        got = snapshot_download(repo_id=path, local_files_only=True)
    except Exception:  # noqa: BLE001 -- not cached, an invalid id, or no huggingface_hub: "not here" either way
        return None
    return got if os.path.isdir(got) else None


def server_processor_dir(res: "ServerCheck", path, what: str) -> str | None:
    """The directory the server names for its processor (``what``), when this machine has it too, as a directory
    or a hub id in the local Hugging Face cache: the canary is built from it.  Else a ``processor`` cause on
    ``res`` and None."""
    found = local_checkpoint(path)
    if found is not None:
        return found
    res.causes.append(Cause("processor", f"{what} ({path!r}) is neither a directory here nor a model in this "
                                         "machine's Hugging Face cache: pass --processor DIR (the checkpoint's "
                                         "processor), or fetch it here first (huggingface-cli download ID)"))
    return None


def check_version(res: "ServerCheck", engine: str, version: str, verified, allow_unverified: str | None,
                  flag: str | None = None) -> None:
    """The version verdict, for every engine: verified, unverified but named by the operator, or a cause."""
    if version in verified:
        res.passed.append(f"version {version} verified")
    elif allow_unverified is not None and allow_unverified == version:
        res.passed.append(f"version {version} UNVERIFIED, allowed explicitly")
    else:
        res.causes.append(Cause("version", f"{engine} {version} is not verified; vidcache is verified with "
                                           f"{', '.join(verified)} (to run anyway, name it: "
                                           f"{flag or '--allow-unverified-' + engine.lower()} {version})"))
