"""vLLM video loader that serves vidcache references from this node's cache (the OpenAI server's path).

Registered as ``VIDEO_LOADER_REGISTRY`` backend ``"vidcache"`` when this module is imported: by vLLM's plugin
loader through the ``vllm.general_plugins`` entry point ``vidcache`` (pyproject.toml; every vLLM process calls
``load_general_plugins``), or by importing it.  The server selects it with ``media_io_kwargs``
(``vidcache.vllm.config.ENGINE_KWARGS``).

A request's video is the plugin-mode reference of ``vidcache.rollout.ref`` (``data:application/vnd.vidcache.ref+json
;base64,...``); vLLM base64-decodes the data URL and hands this loader the JSON bytes.  They are parsed by the same
``parse_ref`` as the SGLang plugin's (size and depth capped, every field type-checked, JSON only) and resolved by
the same ``open_ref`` (the node's own cache, never a path from the request), to the cached uint8 frames and the
original video's metadata (``processing.video_metadata(m, "plugin")`` with ``do_sample_frames: False``), so vLLM's
Qwen processors neither sample nor re-time them.

Bytes that are not a reference (a real video file) go to the loader vLLM would have used without vidcache: the
model's own (``media_io_kwargs``' ``vidcache_fallback``, which ``engine_kwargs(family)`` sets from
``config.OWN_LOADER``: ``qwen2_vl`` / ``qwen3_vl``, with their fps sampling), else ``VLLM_VIDEO_LOADER_BACKEND``
(``opencv`` by default), with vLLM's own kwargs.  A reference that does not parse or resolve raises; it never falls
through to a decoder.
"""
from __future__ import annotations

import base64

from vllm import envs
from vllm.multimodal.video import VIDEO_LOADER_REGISTRY, VideoLoader

from ..errors import InvalidKeyError
from ..processing import video_metadata
from ..rollout.ref import MAX_REF_CHARS, REF_PREFIX, open_ref, parse_ref
from .config import FALLBACK_KEY, LOADER_NAME

# A container format never begins with "{" (MP4: a box size; Matroska/WebM: 0x1A45DFA3; AVI: "RIFF"; MPEG-TS:
# 0x47; NUT: "nut/"), so bytes that do are a reference, parsed strictly, and refused if they are not a sound one.
_REF_START = b"{"
_BOM = b"\xef\xbb\xbf"


def is_reference(data: bytes) -> bool:
    # A UTF-8 byte-order mark before the "{" is a reference all the same (one no container begins with), and is
    # refused by load_reference rather than handed to the fallback decoder as a video (D54).
    return data.lstrip().removeprefix(_BOM).lstrip()[:1] == _REF_START


def load_reference(data: bytes):
    """``(frames THWC uint8 numpy, metadata)`` for the reference in ``data`` (the data URL's decoded JSON)."""
    if len(data) > MAX_REF_CHARS:            # cap before re-encoding, as parse_ref caps the URI before decoding
        raise InvalidKeyError(f"vidcache reference of {len(data)} bytes; at most {MAX_REF_CHARS} are read")
    if data.lstrip().startswith(_BOM):
        raise InvalidKeyError("vidcache reference preceded by a UTF-8 byte-order mark: a reference is plain JSON "
                              "(build it with vidcache.vllm)")
    rec = parse_ref(REF_PREFIX + base64.b64encode(data).decode())
    if rec.get("attest") is not None or rec.get("layout") is not None:
        # SGLang's plugin checks an attestation against its processor output and expands in the named layout; a
        # vLLM loader runs before the processor and can do neither, so it refuses rather than seem to have checked.
        raise InvalidKeyError("vidcache reference with an attestation or a token layout: vLLM's loader checks "
                              "neither (build vLLM requests with vidcache.vllm, not vidcache.prepare)")
    m, frames = open_ref(rec)
    meta = dict(video_metadata(m, "plugin"))
    meta.update(do_sample_frames=False, video_backend=LOADER_NAME,
                duration=m.sampling.total_num_frames / meta["fps"] if meta["fps"] else 0.0)
    # vLLM's loaders return T x H x W x C numpy; the cache holds T x 3 x H x W (a view, not a copy).
    return frames.permute(0, 2, 3, 1).numpy(), meta


@VIDEO_LOADER_REGISTRY.register(LOADER_NAME)
class VidcacheVideoLoader(VideoLoader):
    @classmethod
    def load_bytes(cls, data: bytes, **kwargs):
        own = kwargs.pop(FALLBACK_KEY, None)
        if is_reference(data):
            return load_reference(data)
        fallback = own or envs.VLLM_VIDEO_LOADER_BACKEND
        if fallback == LOADER_NAME:
            raise ValueError(f"VLLM_VIDEO_LOADER_BACKEND={LOADER_NAME} leaves no decoder for non-vidcache videos: "
                             "leave it unset (opencv) and select vidcache with media_io_kwargs")
        return VIDEO_LOADER_REGISTRY.load(fallback).load_bytes(data, **kwargs)


def register() -> None:
    """The ``vllm.general_plugins`` entry point: importing this module registered the loader."""
