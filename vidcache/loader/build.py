"""Decode, sample and resize one video into canonical uint8 frames plus metadata."""
from __future__ import annotations

import torch

from ..errors import FrameBudgetError
from ..options import VideoOptions
from .decode import open_reader
from .resize import resize_frames, target_size
from .sample import select_frames

DEFAULT_MAX_DECODED_BYTES = 8 << 30


def decode_sample_resize(path: str, options: VideoOptions, decoder: str = "decord",
                         max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
                         decoder_threads: int = 0) -> tuple[torch.Tensor, dict]:
    info, reader = open_reader(path, decoder, decoder_threads)
    sel = select_frames(options, reader.num_frames, reader.avg_fps)
    n = len(sel.frame_indices)
    h, w = target_size(options, n, info.height, info.width)
    need = n * 3 * (info.height * info.width + h * w)
    if need > max_decoded_bytes:
        raise FrameBudgetError(f"{n} frames of {info.width}x{info.height} -> {w}x{h} need {need} bytes, "
                               f"over the {max_decoded_bytes}-byte budget")
    raw = reader.get_frames(sel.frame_indices)
    if raw.shape[0] != n:
        raise FrameBudgetError(f"decoder returned {raw.shape[0]} frames, expected {n}")
    if (raw.shape[2], raw.shape[3]) != (info.height, info.width):  # the decoder's size is what qwen-vl-utils sees
        h, w = target_size(options, n, raw.shape[2], raw.shape[3])
    frames = resize_frames(raw, (h, w)).contiguous()
    rate = info.fps_rational
    video = {
        "fps": float(reader.avg_fps),
        "fps_rational": f"{rate.numerator}/{rate.denominator}" if rate else None,
        "total_num_frames": sel.total_num_frames,
        "frame_indices": sel.frame_indices,
        "sample_fps": sel.sample_fps,
        "num_frames": n, "height": h, "width": w,
        "source": {"codec": info.codec, "width": int(raw.shape[3]), "height": int(raw.shape[2]),
                   "num_frames": reader.num_frames},
    }
    provenance = {"decoder": reader.name, "decoder_version": reader.version}
    return frames, {"video": video, "provenance": provenance}
