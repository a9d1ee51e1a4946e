"""``vidcache sglang-config``: the server flags that make SGLang 0.5.23 reproduce the cache.

Frozen files hold exactly the sampled frames, stamped at ``FROZEN_FPS``.  With
this config SGLang's sampler computes ``nframes = N / 2 * 2 = N`` and
``linspace(0, N-1, N)`` (every frame once), its factor-28 ``smart_resize`` is
the identity on frames already on the grid (the pixel bounds are opened wide),
and ``do_resize: false`` reaches the HF processor through ``videos_kwargs`` so
its own resize is skipped too.
"""
from __future__ import annotations

import json

from ..loader.frozen import FROZEN_FPS
from ..options import FPS_MAX_FRAMES, PATCH_SIZE

PLUGIN_PACKAGE = "vidcache.sglang.plugin"
MODES = ("stock", "plugin")


def mm_process_config() -> dict:
    return {"video": {
        "fps": float(FROZEN_FPS),
        "max_frames": FPS_MAX_FRAMES,
        "min_pixels": 28 * 28,                    # never upscale: frames are already sized
        "max_pixels": 16384 * 28 * 28,            # never downscale
        "total_pixels": FPS_MAX_FRAMES * 16384 * 28 * 28,
        "do_resize": False,                       # forwarded to the HF video processor
    }}


def sglang_config(family: str, mode: str = "stock", cache: str | None = None) -> dict:
    if family not in PATCH_SIZE:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(PATCH_SIZE)}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    cfg = mm_process_config()
    out = {
        "family": family,
        "mode": mode,
        "mm_process_config": cfg,
        "server_args": ["--mm-process-config", json.dumps(cfg, separators=(",", ":"))],
        "env": {},
        "notes": [],
    }
    if mode == "plugin":
        out["env"]["SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE"] = PLUGIN_PACKAGE
        out["notes"].append("vidcache must be importable by the SGLang server; the plugin reads frames and "
                            "metadata from the cache directory named in each request's video URI.")
    else:
        if family == "qwen2_5_vl":
            out["notes"].append("stock SGLang 0.5.23 passes no video_metadata: second_per_grid_ts is always 2/24. "
                                "Use --mode plugin for the model's intended 2/sample_fps.")
        if family == "qwen3_vl":
            out["notes"].append("stock SGLang 0.5.23 derives Qwen3-VL timestamps from the frozen file "
                                f"({float(FROZEN_FPS)} fps), not from the original video. Use --mode plugin for "
                                "the original timestamps.")
    if cache:
        out["cache"] = cache
    return out
