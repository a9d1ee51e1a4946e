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

import math

from ..errors import OptionsError
from ..options import FPS_MAX_FRAMES, PATCH_SIZE
from ..processing import FROZEN_FPS, MODES

PLUGIN_PACKAGE = "vidcache.sglang.plugin"
SGLANG_URL_CAP = 64 << 20          # SGLang 0.5.23's default --media-url-max-file-size-mb (64), in bytes
STOCK_QWEN3_GRID = 224             # lcm(28, 32): the only Qwen3-VL grid stock SGLang's double resize keeps


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


def stock_parity_problems(manifest) -> list[str]:
    """Why stock SGLang with :func:`mm_process_config` would NOT reproduce this entry (empty: it will).

    Stock SGLang re-samples and re-sizes whatever it decodes; both are identities only
    when the frozen file has at most ``max_frames`` frames and every frame is on its
    28-pixel grid (and, for Qwen3-VL, also on the model's 32 grid: ``do_resize: false``
    then finds nothing to do) within its pixel bounds.
    """
    family = manifest.family
    n, h, w = manifest.num_frames, manifest.height, manifest.width
    cfg = mm_process_config()["video"]
    out = []
    if n > cfg["max_frames"] or n % 2:
        out.append(f"{n} frames: stock SGLang keeps an even count of at most {cfg['max_frames']} and would "
                   f"re-sample them. Fix: max_frames/nframes <= {cfg['max_frames']}, or mode='plugin'.")
    need = SGLANG_RESIZE_FACTOR if family != "qwen3_vl" else STOCK_QWEN3_GRID
    if h % need or w % need:
        if family == "qwen3_vl":
            out.append(f"{w}x{h} Qwen3-VL frames are on the model's own 32 grid, and stock SGLang would resize "
                       "them to multiples of 28 before the model's 32. Fix: mode='plugin' (recommended: it "
                       "serves these faithful frames as they are), or VideoOptions.for_stock_sglang(...) / "
                       f"size_factor={STOCK_QWEN3_GRID}, which distorts the aspect ratio (a 16:9 1280x720 clip "
                       "becomes 1120x448, 2.5:1; see README).")
        else:
            out.append(f"{w}x{h} frames are not on a {need}-pixel grid: stock SGLang resizes every video to "
                       f"multiples of {SGLANG_RESIZE_FACTOR}. Fix: size_factor={need}, or mode='plugin'.")
    if not cfg["min_pixels"] <= h * w <= cfg["max_pixels"]:
        out.append(f"{w}x{h} frames are outside stock SGLang's pixel bounds [{cfg['min_pixels']}, "
                   f"{cfg['max_pixels']}]. Fix: smaller resized_height/resized_width or max_pixels, "
                   "or mode='plugin'.")
    return out


def check_stock_parity(manifest) -> None:
    """Refuse (``OptionsError``) an entry that stock SGLang cannot reproduce bit-exactly."""
    problems = stock_parity_problems(manifest)
    if problems:
        raise OptionsError(f"cache entry {manifest.key} ({manifest.family}) cannot be served "
                           "in stock mode: " + " ".join(problems))


def url_cap_args(largest_bytes: int) -> list[str]:
    """The server argument that lets SGLang download a frozen file of ``largest_bytes`` by URL."""
    if largest_bytes <= SGLANG_URL_CAP:
        return []
    return ["--media-url-max-file-size-mb", str(math.ceil(largest_bytes / (1 << 20)) + 1)]


def sglang_config(family: str, mode: str = "stock", cache=None) -> dict:
    """The SGLang server configuration for ``family`` in ``mode``.  With ``cache`` (a ``VideoCache``),
    stock mode also lifts SGLang's URL download cap when the largest frozen file needs it."""
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
        out["env"]["VIDCACHE_DIR"] = "<a node-local directory on each SGLang node (never NFS)>"
        out["env"]["VIDCACHE_SHARED"] = (cache.config.shared if cache is not None and cache.config.shared
                                         else "<the cluster's shared tier: NFS path or s3://bucket/prefix>")
        out["notes"].append("vidcache must be importable by the SGLang server; the plugin resolves each "
                            "reference through this node's VIDCACHE_DIR + VIDCACHE_SHARED (never a path named in "
                            "a request) and refuses references to any other cache.")
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
    if cache is not None:
        # No node path: this config is copied to the SGLang nodes, which have their own VIDCACHE_DIR.
        out["cache"] = {"shared": cache.config.shared, "identity": cache.identity}
        if mode == "stock":
            extra = url_cap_args(largest_frozen_bytes(cache))
            out["server_args"] += extra
            if extra:
                out["notes"].append(f"the largest frozen file exceeds SGLang's {SGLANG_URL_CAP >> 20} MiB URL "
                                    f"download cap: {' '.join(extra)} lifts it")
    return out


def largest_frozen_bytes(cache) -> int:
    """The largest frozen file this cache may send: published ones, else an upper bound from the raw
    frames (lossless compression of noisy frames can approach the raw size)."""
    from .. import keys
    store = cache.store
    sizes = [store.size(k) or 0 for k in store.keys(keys.FROZEN)]
    for key in cache.entries():
        m = cache.manifest(key)
        if m is not None:
            sizes.append(m.frames.nbytes)
    return max(sizes, default=0)
