"""What SGLang does to a video, and how vidcache configures it: the SGLang facts, each in one place.

On the facts floor, beside ``vidcache/sglang/`` rather than in it (it imports only ``families``), because the trainer side
(``processing``: ``MODES``), the options preset (``VideoOptions.for_stock_sglang``), the CLI, ``sglang-config``,
``check-server``, ``vidcache serve`` and the Miles adapters all read these.  The facts every engine shares (the
frozen files' rate and format, a presigned URL's lifetime) are ``vidcache.serving``'s.

``VERIFIED_SGLANG_VERSIONS`` is the one list of SGLang releases whose own processor code vidcache has
run its parity suites against (tests/sglang/test_sglang_parity.py, stock and plugin mode, in one environment
per release: scripts/setup_peer_env.sh with ``SGLANG_VERSION``).  ``vidcache check-server`` refuses any
other release unless it is named explicitly (``--allow-unverified-sglang VERSION``).
"""
from __future__ import annotations

import math

from .families import FAMILIES

# SGLang releases whose Qwen-VL processor was run through the parity suites, in both modes.  0.5.16's stock mode
# needs its own config (it forwards the whole video config to transformers 5.12.1, which refuses the keys its
# processor does not declare: ``refused_video_keys`` below; docs/sglang.md, "SGLang versions").
VERIFIED_SGLANG_VERSIONS = ("0.5.16", "0.5.23")

MODES = ("plugin", "stock")

# SGLang 0.5.16 forwards its whole --mm-process-config video dict to the HF video processor (0.5.23 drops its
# own keys first), and its transformers (5.12.1; 0.5.16 does not import with 5.19+) refuses every key that
# family's processor does not declare (TypeError, HTTP 500 on every request).  Those keys are left out of its
# config; 0.5.16 then applies its fixed defaults for them (qwen_vl.py: VIDEO_MIN_PIXELS, VIDEO_MAX_PIXELS), except
# the total budget, which it reads from an environment variable at import (named VIDEO_MAX_PIXELS).
SGLANG_FORWARDS_VIDEO_CONFIG = frozenset({"0.5.16"})
HF_REFUSED_VIDEO_KEYS = {"qwen2_vl": ("total_pixels",), "qwen2_5_vl": ("total_pixels",),
                         "qwen3_vl": ("min_pixels", "max_pixels", "total_pixels")}
SGLANG_TOTAL_PIXELS_ENV = {"0.5.16": "VIDEO_MAX_PIXELS"}
SGLANG_0516_DEFAULT_PIXELS = (128 * 28 * 28, 768 * 28 * 28)     # its preprocess_video's min/max without config

# SGLang's preprocess_video resizes every video to multiples of this (smart_resize, every family) ...
SGLANG_RESIZE_FACTOR = 28
# ... and the HF video processor then to multiples of the family's grid (patch x merge): both are identities only
# on lcm(28, grid), so stock mode needs frames there: 28 for Qwen2/2.5-VL, lcm(28, 32) = 224 for Qwen3-VL (aspect
# distortion is the price).


def stock_grid(family: str) -> int:
    """The grid stock SGLang leaves frames of ``family`` alone on (``SGLANG_RESIZE_FACTOR`` and the family's)."""
    return math.lcm(SGLANG_RESIZE_FACTOR, FAMILIES[family].grid)


def stock_distorts(family: str) -> bool:
    """Whether stock SGLang needs a coarser grid than the family's own (its frames then move, and distort)."""
    return stock_grid(family) != FAMILIES[family].grid


STOCK_QWEN3_GRID = stock_grid("qwen3_vl")     # in help texts: the one such grid today
# --mm-process-config pixel bounds that make SGLang's smart_resize an identity on frames already sized.
SGLANG_MIN_PIXELS = SGLANG_RESIZE_FACTOR * SGLANG_RESIZE_FACTOR          # never upscale
SGLANG_MAX_PIXELS = 16384 * SGLANG_RESIZE_FACTOR * SGLANG_RESIZE_FACTOR  # never downscale

# SGLang's FPS_MAX_FRAMES (qwen_vl.py), and the max_frames --mm-process-config keeps: more frames are re-sampled.
SGLANG_MAX_FRAMES = 768

# SGLang's default --media-url-max-file-size-mb (64), in bytes: the largest file it downloads by URL.
SGLANG_URL_CAP = 64 << 20

# Measured on an H200: torchcodec 0.17 (SGLang 0.5.23's pin) sends frames NVDEC declines (every lossless
# RGB stream) through 8-bit YUV444 on the GPU (max error 2); 0.16.0 copies them exactly.
STOCK_GPU_TORCHCODEC = "0.16.0"


# --- the vision tower SGLang computes -------------------------------------------------------------------------
# The families whose SGLang model code (its own implementation, ``--model-impl auto``/``sglang``) computes the vision
# tower otherwise than the original model and transformers (every trainer): SGLang's Qwen2.5-VL gives its
# full-attention blocks one sequence per *video* (``cu_seqlens`` of ``t*h*w``: srt/models/qwen2_5_vl.py, 0.5.16
# :465-473, 0.5.23 :548-557), the model attends within each temporal patch (``h*w``).  Measured on SGLang 0.5.23's
# real server: 1.6-2.6 nats/token with identical inputs and positions.  Qwen2-VL (``compute_cu_seqlens_from_grid``:
# per frame) and Qwen3-VL (``qwen3_vl.py:968``: per frame) attend as the model does.  Upstream: SGLang #12261 (the
# Qwen2.5-VL fix) closed unmerged.  The releases listed are the ones whose code was read and run.
VISION_ACROSS_FRAMES = {"qwen2_5_vl": ("0.5.16", "0.5.23")}
TRAINER_VISION = "per_temporal_patch"       # transformers' (get_vision_cu_seqlens, merge_temporal=False)
SGLANG_VISION = "across_frames"             # SGLang's own Qwen2.5-VL, above
# Two ways to make SGLang compute the original tower, chosen by ``sglang-config --vision``:
#   package       vidcache's external model package (a subclass of SGLang's class; keeps SGLang's fast path: radix
#                 cache and chunked prefill for multimodal requests).  The default in plugin mode, where vidcache
#                 is on the servers anyway, and the plugin reports it to check-server.
#   transformers  SGLang's ``--model-impl transformers`` (configuration only: no vidcache code on the server; the
#                 default in stock mode).  SGLang 0.5.23 then disables the radix cache and chunked prefill for
#                 multimodal requests, so a GRPO group's samples no longer share their prompt's prefill.
MODEL_PACKAGE = "vidcache.sglang.models"
MODEL_PACKAGE_ENV = "SGLANG_EXTERNAL_MODEL_PACKAGE"
VISION_FIXES = ("package", "transformers")
TRANSFORMERS_IMPL_ARGS = ("--model-impl", "transformers")


def default_vision_fix(mode: str) -> str:
    return "package" if mode == "plugin" else "transformers"


def vision_differs(family: str) -> bool:
    """Whether SGLang's own model code for ``family`` attends otherwise than the trainer (``VISION_ACROSS_FRAMES``),
    whatever the release: one not listed is taken to keep the listed releases' code (unverified: check-server
    says so)."""
    return family in VISION_ACROSS_FRAMES


def server_vision(family: str, model_impl: str | None, model_package: str | None) -> str:
    """The vision attention a server computes for ``family``: ``TRAINER_VISION`` when it runs transformers' code
    (``--model-impl transformers``) or vidcache's model package, or when SGLang's own code attends as the trainer;
    else ``SGLANG_VISION``."""
    if not vision_differs(family):
        return TRAINER_VISION
    if str(model_impl or "").lower() == "transformers" or model_package == MODEL_PACKAGE:
        return TRAINER_VISION
    return SGLANG_VISION


def default_mode(family: str) -> str:
    """Qwen3-VL's faithful (32-grid) frames only survive SGLang through the plugin; the 28-grid
    families are served exactly by stock SGLang too."""
    return "plugin" if stock_distorts(family) else "stock"


def refused_video_keys(family: str | None, sglang_version: str) -> tuple[str, ...]:
    """The --mm-process-config video keys that SGLang ``sglang_version`` would hand to an HF processor that
    refuses them (``family`` None: the keys every family refuses)."""
    if sglang_version not in SGLANG_FORWARDS_VIDEO_CONFIG:
        return ()
    if family is None:
        return tuple(sorted(set.intersection(*(set(v) for v in HF_REFUSED_VIDEO_KEYS.values()))))
    return HF_REFUSED_VIDEO_KEYS[family]


def stock_pixel_bounds(family: str, sglang_version: str | None = None) -> tuple[int, int]:
    """The per-frame pixel range stock SGLang leaves alone: the configured one, or where the config cannot carry
    the bounds to that release (``refused_video_keys``), its fixed defaults."""
    if sglang_version is not None and "min_pixels" in refused_video_keys(family, sglang_version):
        return SGLANG_0516_DEFAULT_PIXELS
    return SGLANG_MIN_PIXELS, SGLANG_MAX_PIXELS


def stock_sglang_problems(family: str, grid: int | None, n: int | None = None, h: int | None = None,
                          w: int | None = None, max_frames: int | None = None,
                          sglang_version: str | None = None) -> list[str]:
    """Why stock SGLang, configured by ``vidcache sglang-config``, would NOT reproduce frames of
    ``family`` on the ``grid``-pixel grid (``n`` frames of ``h`` x ``w``, where known); empty: it will.

    Stock SGLang re-samples and re-sizes whatever it decodes; both are identities only when the frozen
    file has an even count of at most ``max_frames`` frames and every frame is on SGLang's 28 grid (and,
    for Qwen3-VL, also on the model's 32 grid) within the configured pixel bounds.  ``grid``: the options'
    resolved ``size_factor`` (None: not known, only the frames' shape is checked).  ``sglang_version``: the
    server's release, where its pixel bounds differ (``stock_pixel_bounds``).
    """
    max_frames = SGLANG_MAX_FRAMES if max_frames is None else max_frames
    out = []
    if n is not None and (n > max_frames or n % 2):
        out.append(f"{n} frames: stock SGLang keeps an even count of at most {max_frames} and would "
                   f"re-sample them. Fix: max_frames/nframes <= {max_frames}, or mode='plugin'.")
    need = stock_grid(family)
    off_grid = (grid is not None and grid % need) or (h is not None and (h % need or w % need))
    if off_grid:
        shape = f"{w}x{h} " if h is not None else ""
        where = f"on the {grid}-pixel grid" if grid is not None else f"not on a {need}-pixel grid"
        if stock_distorts(family):
            own = FAMILIES[family].grid
            out.append(f"{shape}{family} frames {where} (stock SGLang needs a multiple of {need}): "
                       f"it resizes them to multiples of {SGLANG_RESIZE_FACTOR} before the model's {own}. Fix: mode='plugin' (recommended: it serves "
                       "these faithful frames as they are), or VideoOptions.for_stock_sglang(...) / "
                       f"size_factor={need}, which distorts the aspect ratio (a 16:9 1280x720 clip "
                       "becomes 1120x448, 2.5:1; see README).")
        else:
            out.append(f"{shape}frames {where} (stock SGLang needs a multiple of {need}): it resizes "
                       f"every video to multiples of {SGLANG_RESIZE_FACTOR}. Fix: size_factor={need}, or mode='plugin'.")
    lo, hi = stock_pixel_bounds(family, sglang_version)
    if h is not None and not lo <= h * w <= hi:
        release = f"SGLang {sglang_version}'s" if (lo, hi) != (SGLANG_MIN_PIXELS, SGLANG_MAX_PIXELS) else "stock SGLang's"
        out.append(f"{w}x{h} frames are outside {release} pixel bounds [{lo}, {hi}]. Fix: resized_height/"
                   "resized_width or min_pixels/max_pixels within them, or mode='plugin'.")
    return out


# --- `vidcache serve`, the frozen-file server (sglang/server.py) ------------------------------------------
DEFAULT_WORKERS = 16
DEFAULT_TIMEOUT_S = 30.0
# A total deadline for the request head: a per-read timeout alone lets a client that drips a
# byte every few seconds keep its connection forever.  A real head is one small write.
DEFAULT_HEADER_TIMEOUT_S = 10.0
# The slowest average a response body may go out at (after timeout_s of grace), so a client
# that reads a trickle cannot hold a worker forever; 1 MiB/s is far below any real link.
DEFAULT_MIN_RATE = 1 << 20
# Connections one client address may hold at once (reading its head, or in a worker), so one
# client cannot fill the pool or the table of connections being read.
DEFAULT_MAX_PER_CLIENT = 32
# Workers one client address may occupy at once (a request being served, or queued for a worker).  The
# connection cap above is larger than the pool, so without this one address with slow readers (a GET it
# reads a trickle of: up to timeout + size / min_rate, ~37 s for a 7.5 MB file) held every worker and
# every other client waited that long.  Half the pool (at least one): what one address cannot take stays
# for the others.  (Two hostile addresses can still fill it; this bounds one, as the cap above does.)


def default_max_workers_per_client(workers: int) -> int:
    return max(1, workers // 2)
