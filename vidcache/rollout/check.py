"""The engine-neutral half of ``vidcache check-server``: a check's verdict (``ServerCheck``, one ``Cause`` per
failed check), the bounded JSON-over-HTTP call every check makes, the version verdict, the checkpoint's processor,
and the canary video.

``vidcache.sglang.check`` and ``vidcache.vllm.check`` each ask their engine's own endpoints and build on these;
neither imports the other.
"""
from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import ParityError
from ..options import PATCH_SIZE, VideoOptions


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


class ReplyTooLargeError(ParityError, ValueError):
    """A server's reply was larger than any a check expects (``MAX_REPLY_BYTES``): not read further."""


def _read_bounded(r, url: str) -> bytes:
    body = r.read(MAX_REPLY_BYTES + 1)
    if len(body) > MAX_REPLY_BYTES:
        raise ReplyTooLargeError(f"{url} replied with more than {MAX_REPLY_BYTES} bytes; not read further "
                                 "(is a proxy in front of the server?)")
    return body


def http_json(url: str, payload: dict | None = None, timeout: float = 60.0) -> tuple[int, dict]:
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(_read_bounded(r, url) or b"{}")
    except urllib.error.HTTPError as e:
        body = _read_bounded(e, url)
        try:
            return e.code, json.loads(body)
        except ValueError:
            return e.code, {"error": {"message": body.decode(errors="replace")[:2000]}}


def error_message(body: dict) -> str:
    err = body.get("error", body)
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)


def exact_canary_options(family: str, nframes: int = 2) -> VideoOptions:
    """The canary for an engine that takes the cached frames as they are (SGLang's plugin, vLLM's loader): two
    frames (or ``nframes``), small enough that the canary's rows travel in its attestation
    (``attest.VALUES_MAX_BYTES``)."""
    side = 2 * PATCH_SIZE[family] * 2
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


def server_processor_dir(res: "ServerCheck", path, what: str) -> str | None:
    """The directory the server names for its processor (``what``), when this machine has it too: the canary is
    built from it.  Else a ``processor`` cause on ``res`` and None."""
    if path and os.path.isdir(path):
        return path
    res.causes.append(Cause("processor", f"{what} ({path!r}) is not a directory here: pass --processor DIR (the "
                                         "checkpoint's processor) to send the canary"))
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
