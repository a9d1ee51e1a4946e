"""Decoders behind one small interface.  The backend is always named, never auto-selected.

PyAV probes the container first (it is cheap and reports the codec and the
exact rational frame rate); the pinned backend then decodes the frames.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from ..errors import BackendUnavailableError, DecodeError, UnsupportedCodecError

BACKENDS = ("decord", "torchcodec")
_decord_lock = threading.Lock()


@dataclass(frozen=True)
class StreamInfo:
    codec: str
    width: int
    height: int
    fps_rational: Fraction | None     # container average rate, exact
    num_frames_from_header: int


def probe(path: str) -> StreamInfo:
    import av

    try:
        with av.open(path) as c:
            if not c.streams.video:
                raise DecodeError(f"no video stream in {path!r} (streams: {[s.type for s in c.streams]})")
            s = c.streams.video[0]
            rate = Fraction(s.average_rate) if s.average_rate else None
            return StreamInfo(s.codec_context.name, s.codec_context.width, s.codec_context.height, rate, s.frames)
    except DecodeError:
        raise
    except Exception as e:  # av.error.InvalidDataError and friends
        raise DecodeError(f"not a readable video container: {type(e).__name__}: {e}") from None


class DecordReader:
    name = "decord"

    def __init__(self, path: str, info: StreamInfo, threads: int = 0):
        try:
            import decord
        except ImportError as e:
            raise BackendUnavailableError("decord is not installed: pip install decord") from e
        try:
            # threads=0 lets FFmpeg pick; decoded bytes do not depend on the thread count.
            self._vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=threads)
        except Exception as e:
            raise UnsupportedCodecError(
                f"decord cannot open the {info.codec!r} stream: {str(e).splitlines()[0][:200]}") from None
        self.num_frames = len(self._vr)
        self.avg_fps = self._vr.get_avg_fps()
        self.version = decord.__version__

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        try:
            batch = self._vr.get_batch(indices).asnumpy()
        except Exception as e:
            raise DecodeError(f"decoding failed (truncated or corrupt stream?): {str(e).splitlines()[0][:200]}") from None
        return torch.from_numpy(np.ascontiguousarray(batch)).permute(0, 3, 1, 2)


class TorchcodecReader:
    name = "torchcodec"

    def __init__(self, path: str, info: StreamInfo, threads: int = 0):
        try:
            import torchcodec
            from torchcodec.decoders import VideoDecoder
        except Exception as e:  # ImportError, or RuntimeError when its FFmpeg/torch libs do not load
            raise BackendUnavailableError(f"torchcodec is not usable here: {e}") from e
        try:
            self._dec = VideoDecoder(path, num_ffmpeg_threads=threads)
        except Exception as e:
            raise UnsupportedCodecError(f"torchcodec cannot open the {info.codec!r} stream: {e}") from None
        self.num_frames = self._dec.metadata.num_frames
        self.avg_fps = self._dec.metadata.average_fps
        self.version = torchcodec.__version__

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        try:
            return self._dec.get_frames_at(indices=indices).data
        except Exception as e:
            raise DecodeError(f"decoding failed (truncated or corrupt stream?): {e}") from None


def open_reader(path: str, backend: str = "decord", threads: int = 0):
    if backend not in BACKENDS:
        raise ValueError(f"unknown decoder backend {backend!r}; choose one of {BACKENDS}")
    info = probe(path)
    reader = (DecordReader if backend == "decord" else TorchcodecReader)(path, info, threads)
    if reader.num_frames <= 0:
        raise DecodeError("the video stream has no decodable frames")
    return info, reader
