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

from ..errors import OptionsError
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


SGLANG_RESIZE_FACTOR = 28      # stock preprocess_video's smart_resize factor, for every family


def stock_parity_problems(manifest: dict) -> list[str]:
    """Why stock SGLang with :func:`mm_process_config` would NOT reproduce this entry (empty: it will).

    Stock SGLang re-samples and re-sizes whatever it decodes; both are identities only
    when the frozen file has at most ``max_frames`` frames and every frame is on its
    28-pixel grid (and, for Qwen3-VL, also on the model's 32 grid: ``do_resize: false``
    then finds nothing to do) within its pixel bounds.
    """
    v, family = manifest["video"], manifest["options"]["family"]
    n, h, w = v["num_frames"], v["height"], v["width"]
    cfg = mm_process_config()["video"]
    out = []
    if n > cfg["max_frames"] or n % 2:
        out.append(f"{n} frames: stock SGLang keeps an even count of at most {cfg['max_frames']} and would "
                   f"re-sample them. Fix: max_frames/nframes <= {cfg['max_frames']}, or mode='plugin'.")
    need = SGLANG_RESIZE_FACTOR if family != "qwen3_vl" else 224     # lcm(28, 32)
    if h % need or w % need:
        out.append(f"{w}x{h} frames are not on a {need}-pixel grid: stock SGLang resizes every video to "
                   f"multiples of {SGLANG_RESIZE_FACTOR}" + (" before Qwen3-VL's 32" if family == "qwen3_vl" else "")
                   + f". Fix: size_factor={need}" + (" (the qwen3_vl default)" if family == "qwen3_vl" else "")
                   + ", or mode='plugin'.")
    if not cfg["min_pixels"] <= h * w <= cfg["max_pixels"]:
        out.append(f"{w}x{h} frames are outside stock SGLang's pixel bounds [{cfg['min_pixels']}, "
                   f"{cfg['max_pixels']}]. Fix: smaller resized_height/resized_width or max_pixels, "
                   "or mode='plugin'.")
    return out


def check_stock_parity(manifest: dict) -> None:
    """Refuse (``OptionsError``) an entry that stock SGLang cannot reproduce bit-exactly."""
    problems = stock_parity_problems(manifest)
    if problems:
        raise OptionsError(f"cache entry {manifest['key']} ({manifest['options']['family']}) cannot be served "
                           "in stock mode: " + " ".join(problems))


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
        "server_requirements": [],
    }
    if mode == "plugin":
        out["env"]["SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE"] = PLUGIN_PACKAGE
        out["notes"].append("vidcache must be importable by the SGLang server; the plugin reads frames and "
                            "metadata from the cache directory named in each request's video URI.")
    else:
        # Measured on an H200: torchcodec 0.17 (SGLang 0.5.23's pin) sends frames NVDEC declines (every
        # lossless RGB stream) through 8-bit YUV444 on the GPU (max error 2); 0.16.0 copies them exactly.
        out["server_requirements"].append("torchcodec==0.16.0")
        out["notes"].append("on GPU servers stock mode needs torchcodec 0.16.0: with 0.17.0 (SGLang 0.5.23's pin) "
                            "frozen frames decode inexactly on CUDA (max error 2). Plugin mode does not decode.")
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
