"""Frame selection exactly as qwen-vl-utils 0.0.14 ``_read_video_decord`` does it.

The arithmetic is qwen-vl-utils' own (``calculate_video_frame_range``,
``smart_nframes``), called with every default written out, so nothing here
reads the environment.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from qwen_vl_utils import vision_process as qvu

from ..errors import OptionsError, TooFewFramesError
from ..options import VideoOptions


@dataclass(frozen=True)
class FrameSelection:
    frame_indices: list[int]       # indices into the decoded stream
    total_num_frames: int          # length of the [start, end] range, as qwen-vl-utils reports it
    sample_fps: float              # nframes / total * fps, computed in qwen-vl-utils' order


def _qvu_element(opts: VideoOptions) -> dict:
    r = opts.resolved()
    ele: dict = {"min_frames": r.min_frames}
    if r.nframes is not None:
        ele["nframes"] = r.nframes
    else:
        ele["fps"] = r.fps
    if r.max_frames is not None:
        ele["max_frames"] = r.max_frames
    if r.video_start is not None:
        ele["video_start"] = r.video_start
    if r.video_end is not None:
        ele["video_end"] = r.video_end
    return ele


def select_frames(opts: VideoOptions, total_frames: int, video_fps: float) -> FrameSelection:
    ele = _qvu_element(opts)
    try:
        start, end, total = qvu.calculate_video_frame_range(ele, total_frames, video_fps)
    except ValueError as e:
        raise OptionsError(f"video_start/video_end do not fit this video: {e}") from None
    try:
        nframes = qvu.smart_nframes(ele, total_frames=total, video_fps=video_fps)
    except ValueError as e:
        # qwen-vl-utils says one thing for two causes: an explicit nframes above the frames in range, or a
        # video (or range) too short for the 2 frames every sample needs.  Name the one that applies.
        asked = ele.get("nframes")
        need = f"ask for nframes={asked}" if asked is not None and asked > total else "need at least 2 sampled frames"
        raise TooFewFramesError(f"video has {total} frame(s) in range but the options {need} "
                                f"(qwen-vl-utils: {e})") from None
    idx = torch.linspace(start, end, nframes).round().long().tolist()
    sample_fps = nframes / max(total, 1e-6) * video_fps
    return FrameSelection(idx, total, sample_fps)
