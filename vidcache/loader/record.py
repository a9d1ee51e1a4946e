"""What the pipeline says about a build: typed, with names that say where each value came from.

``decode_sample_resize`` returns the frames plus a :class:`Built`; the manifest stores its ``source``
and ``sampling`` as they are, so provenance names exist on both sides of the seam (as torchcodec names
``num_frames_from_header`` and ``average_fps_from_header``).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    """What the decoder and the container said about the source video."""
    codec: str
    width_from_decoder: int
    height_from_decoder: int
    num_frames_from_decoder: int               # the stream length sampling used (decord's len())
    average_fps_from_decoder: float            # the rate sampling used (decord's get_avg_fps())
    fps_from_header: str | None                # the container's exact rational rate, "30000/1001"
    num_frames_from_header: int | None = None  # what the container declares (0 or None: it does not say)


@dataclass(frozen=True)
class Sampling:
    frame_indices: tuple[int, ...]             # indices into the decoded stream
    total_num_frames: int                      # frames in the [video_start, video_end] range
    sample_fps: float                          # nframes / total * fps, in qwen-vl-utils' order


@dataclass(frozen=True)
class Built:
    """Everything a build knows besides the frames themselves."""
    source: Source
    sampling: Sampling
    aspect_distortion: float                   # stored W/H over source W/H (loader.resize.aspect_distortion)
    provenance: dict = field(default_factory=dict)   # which decoder really ran, retries: recorded, never keyed
