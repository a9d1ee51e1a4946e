"""Target size and resize, exactly as qwen-vl-utils 0.0.14 ``fetch_video`` does them."""
from __future__ import annotations

import torch
from qwen_vl_utils import vision_process as qvu
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as TF

from ..errors import AspectRatioError, OptionsError
from ..options import FRAME_FACTOR, VIDEO_MAX_TOKEN_NUM, VideoOptions


def target_size(opts: VideoOptions, nframes: int, height: int, width: int) -> tuple[int, int]:
    r = opts.resolved()
    f = r.size_factor
    if max(height, width) / max(min(height, width), 1) > qvu.MAX_RATIO:
        raise AspectRatioError(
            f"aspect ratio {max(height, width) / min(height, width):.1f} of {width}x{height} exceeds {qvu.MAX_RATIO}")
    # The per-frame cap follows the *model* factor, as in qwen-vl-utils; only the grid uses size_factor.
    frame_max = VIDEO_MAX_TOKEN_NUM * opts.factor * opts.factor
    max_pixels = max(min(frame_max, r.total_pixels / nframes * FRAME_FACTOR), int(r.min_pixels * 1.05))
    if r.max_pixels is not None:
        max_pixels = min(r.max_pixels, max_pixels)
    try:
        if r.resized_height is not None:
            h, w = qvu.smart_resize(r.resized_height, r.resized_width, factor=f)
        else:
            h, w = qvu.smart_resize(height, width, factor=f, min_pixels=r.min_pixels, max_pixels=max_pixels)
    except ValueError as e:
        raise AspectRatioError(str(e)) from None
    except AssertionError:
        raise OptionsError(f"max_pixels {max_pixels} is below min_pixels {r.min_pixels}; "
                           "lower min_pixels as well") from None
    if h <= 0 or w <= 0:
        raise AspectRatioError(f"{width}x{height} is too thin for a {f}-pixel grid within the pixel budget")
    return h, w


def resize_frames(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 TCHW -> uint8 TCHW.  torchvision returns the input itself when the size already matches."""
    out = TF.resize(frames, list(size), interpolation=InterpolationMode.BICUBIC, antialias=True)
    assert out.dtype == torch.uint8
    return out


def aspect_distortion(src_w: int, src_h: int, out_w: int, out_h: int) -> float:
    """How much a resize stretched the picture: ``(out_w / out_h) / (src_w / src_h)``.

    1.0 is undistorted; above 1 the frames came out relatively wider than the source, below 1
    narrower.  E.g. 1280x720 (16:9) on the 224 grid becomes 1120x448 (2.5:1): 2.5 / (16/9) = 1.406,
    while Qwen3-VL's own 32 grid gives 1152x640: 1.8 / (16/9) = 1.0125.
    """
    if min(src_w, src_h, out_w, out_h) <= 0:
        raise ValueError(f"sizes must be positive, got {src_w}x{src_h} -> {out_w}x{out_h}")
    return (out_w / out_h) / (src_w / src_h)
