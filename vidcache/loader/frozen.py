"""Frozen files: a lossless RGB video of exactly the cached frames, for SGLang.

Two formats, both intra-only, lossless for RGB and verified bit-exact with
decord, torchcodec and PyAV (benchmarks/formats.py):
  ``ffv1``     FFV1 bgr0 in Matroska: the smallest (the default).
  ``utvideo``  UT Video gbrp in NUT: ~1.5x larger, ~5x faster to decode, which is
               what stock SGLang pays on every request.
Any YUV format would round-trip inexactly.  Files are stamped at a fixed rate
so that SGLang's fps sampler, configured by ``vidcache sglang-config``, selects
every stored frame once; at 2 fps Matroska's 1 ms timebase is exact too.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from ..errors import FrozenFileError

FROZEN_FPS = Fraction(2)        # the fps SGLang's sampler is configured with (stock mode)


@dataclass(frozen=True)
class FrozenFormat:
    name: str
    container: str
    suffix: str
    codec: str
    pix_fmt: str
    media_type: str


FORMATS = {
    "ffv1": FrozenFormat("ffv1", "matroska", ".mkv", "ffv1", "bgr0", "video/x-matroska"),
    "utvideo": FrozenFormat("utvideo", "nut", ".nut", "utvideo", "gbrp", "video/x-nut"),
}
DEFAULT_FORMAT = "ffv1"


def write_frozen(frames: torch.Tensor, path: str, fmt: str = DEFAULT_FORMAT, rate: Fraction = FROZEN_FPS,
                 verify=None) -> None:
    """Write uint8 TCHW RGB ``frames`` to ``path`` atomically: temp file, ``verify(tmp)``, rename."""
    import av

    f = FORMATS[fmt]
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"expected uint8 TCHW RGB frames, got {tuple(frames.shape)} {frames.dtype}")
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".frozen-", suffix=os.path.splitext(path)[1], dir=d)
    os.close(fd)
    try:
        thwc = frames.permute(0, 2, 3, 1).contiguous().numpy()
        with av.open(tmp, "w", format=f.container) as c:
            s = c.add_stream(f.codec, rate=rate)
            s.height, s.width = thwc.shape[1:3]
            s.pix_fmt = f.pix_fmt
            if f.container == "nut":
                s.time_base = 1 / rate
            for fr in thwc:
                for p in s.encode(av.VideoFrame.from_ndarray(fr, format="rgb24")):
                    c.mux(p)
            for p in s.encode():
                c.mux(p)
        if verify is not None:
            verify(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def decode_all(path: str, decoder: str) -> tuple[torch.Tensor, float]:
    """All frames of ``path`` as uint8 TCHW, plus the fps the decoder reports."""
    if decoder == "decord":
        import decord
        vr = decord.VideoReader(path, ctx=decord.cpu(0))
        arr = vr.get_batch(list(range(len(vr)))).asnumpy()
        return torch.from_numpy(np.ascontiguousarray(arr)).permute(0, 3, 1, 2), vr.get_avg_fps()
    if decoder == "torchcodec":
        from torchcodec.decoders import VideoDecoder
        dec = VideoDecoder(path, num_ffmpeg_threads=1)
        return dec.get_frames_in_range(0, dec.metadata.num_frames).data, float(dec.metadata.average_fps)
    if decoder == "pyav":
        import av
        with av.open(path) as c:
            s = c.streams.video[0]
            arr = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(s)])
            fps = float(s.average_rate)
        return torch.from_numpy(arr).permute(0, 3, 1, 2), fps
    raise ValueError(f"unknown decoder {decoder!r}")


def available_decoders() -> list[str]:
    names = ["decord", "pyav"]
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401
        names.insert(1, "torchcodec")
    except Exception:  # torchcodec missing, or its FFmpeg/torch libraries do not load
        pass
    return names


def verify_frozen(path: str, frames: torch.Tensor, rate: Fraction = FROZEN_FPS,
                  decoders: list[str] | None = None) -> dict:
    """Re-decode ``path`` with every available decoder; raise unless all give ``frames`` bit-exactly."""
    report = {}
    for name in decoders or available_decoders():
        got, fps = decode_all(path, name)
        if got.shape != frames.shape or not torch.equal(got, frames):
            diff = "shape " + str(tuple(got.shape)) if got.shape != frames.shape else \
                f"max |diff| {int((got.int() - frames.int()).abs().max())}"
            raise FrozenFileError(f"{name} re-decodes {path} inexactly ({diff})")
        if fps != float(rate):
            raise FrozenFileError(f"{name} reports {fps} fps for {path}, expected exactly {float(rate)}")
        report[name] = fps
    return report
