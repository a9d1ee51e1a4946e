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
"""
from __future__ import annotations

import json

# The vLLM release (and the transformers it was run with) the exactness tests ran against; another release may
# move any of the facts below, so check-server names it.
VERIFIED_VLLM_VERSIONS = ("0.34.0",)
VLLM_TRANSFORMERS_PIN = {"0.34.0": "5.22.2"}      # the overlay's; vLLM 0.34.0 pins transformers>=5.16.1,<5.23
LOADER_NAME = "vidcache"                           # VIDEO_LOADER_REGISTRY name of vidcache.vllm.loader
PLUGIN_ENTRY_POINT = ("vllm.general_plugins", "vidcache", "vidcache.vllm.loader:register")

# Engine settings (LLM(...) / AsyncEngineArgs keywords): the one fact.
ENGINE_KWARGS = {"mm_device_do_normalize": False,
                 "media_io_kwargs": {"video": {"video_backend": LOADER_NAME}}}
# Per request (TokensPrompt["mm_processor_kwargs"], or the chat request's "mm_processor_kwargs" field).
MM_PROCESSOR_KWARGS = {"do_sample_frames": False, "do_resize": False}


def engine_kwargs() -> dict:
    """A fresh copy of ``ENGINE_KWARGS``, to splat into ``vllm.LLM(model, **engine_kwargs())``."""
    return json.loads(json.dumps(ENGINE_KWARGS))


def serve_flags() -> list[str]:
    """``ENGINE_KWARGS`` as ``vllm serve`` flags (the same fact, in the CLI's spelling)."""
    out = []
    for k, v in ENGINE_KWARGS.items():
        name = k.replace("_", "-")
        if isinstance(v, bool):          # vLLM's bool flags are argparse.BooleanOptionalAction: --x / --no-x
            out.append(f"--{name}" if v else f"--no-{name}")
        else:
            out += [f"--{name}", json.dumps(v, separators=(",", ":"))]
    return out


def settings_problems(model_config: dict) -> list[str]:
    """What differs from ``ENGINE_KWARGS`` in a server's reported model config (vLLM's ``/server_info``
    ``vllm_config.model_config``, or its ``multimodal_config`` part); [] when all match."""
    mm = model_config.get("multimodal_config", model_config) or {}
    out = []
    if mm.get("mm_device_do_normalize") is not False:
        out.append(f"mm_device_do_normalize is {mm.get('mm_device_do_normalize')!r}, must be False (vLLM then "
                   "normalises on the GPU with other rounding than the trainer's)")
    backend = ((mm.get("media_io_kwargs") or {}).get("video") or {}).get("video_backend")
    if backend != LOADER_NAME:
        out.append(f"media_io_kwargs video_backend is {backend!r}, must be {LOADER_NAME!r} (vidcache's loader)")
    return out
