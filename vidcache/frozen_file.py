"""Frozen frames: lossless video files holding exactly an entry's frames (the format; no cache here).

Two formats, both intra-only, lossless for RGB and verified bit-exact with
decord, torchcodec and PyAV (benchmarks/formats.py):
  ``ffv1``     FFV1 bgr0 in Matroska: the smallest.
  ``magicyuv`` MagicYUV gbrp in NUT, gradient prediction: about as small on decoded camera
               footage, ~20x faster to decode, which is what stock SGLang pays on every request
               and what a node pays to expand a shared-tier entry (``serving.SERVING_FORMAT``,
               ``serving.COMPACT_FORMAT``).
``.nut`` files written before it, as UT Video gbrp, stay valid: every reader takes the codec
from the stream, and a file is checked by its bytes' digest and its frames', never by its codec.
Any YUV format would round-trip inexactly.  Files are stamped at a fixed rate
so that SGLang's fps sampler, configured by ``vidcache sglang-config``, selects
every stored frame once; at 2 fps Matroska's 1 ms timebase is exact too.

Where the files live, and how they are checked, is ``vidcache.sglang.frozen``'s and
the cache's business; this module only writes, decodes and verifies them.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from .encode import write_video
from .errors import FrozenFileError
from .serving import FROZEN_FPS, SERVING_FORMAT
from .store.publish import publish


@dataclass(frozen=True)
class FrozenFormat:
    name: str
    container: str
    suffix: str
    codec: str
    pix_fmt: str
    media_type: str
    options: tuple = ()      # encoder options, as (name, value) pairs


FORMATS = {
    "ffv1": FrozenFormat("ffv1", "matroska", ".mkv", "ffv1", "bgr0", "video/x-matroska"),
    # Gradient prediction: on the benchmark clips 0.291x the raw frames and 530 MB/s to expand (frames_bytes, 2
    # cores), where UT Video (median) was 0.324x and 360 MB/s; MagicYUV's median and left predictions are larger.
    # Exact with decord, torchcodec and PyAV (benchmarks/shared_formats.py, tests/test_frozen_file.py).
    "magicyuv": FrozenFormat("magicyuv", "nut", ".nut", "magicyuv", "gbrp", "video/x-nut", (("pred", "gradient"),)),
}
BY_SUFFIX = {f.suffix: f for f in FORMATS.values()}


def write_frozen(frames: "torch.Tensor", path: str, fmt: str = SERVING_FORMAT, rate: Fraction = FROZEN_FPS,
                 verify=None) -> None:
    """Write uint8 TCHW RGB ``frames`` to ``path`` atomically: temp file, ``verify(tmp)``, publish."""
    import torch
    f = FORMATS[fmt]
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"expected uint8 TCHW RGB frames, got {tuple(frames.shape)} {frames.dtype}")
    thwc = frames.permute(0, 2, 3, 1).contiguous().numpy()

    def fill(tmp: str) -> None:
        write_video(tmp, thwc, codec=f.codec, rate=rate, pix_fmt=f.pix_fmt, container=f.container,
                    options=dict(f.options), exact_time_base=f.container == "nut")
        if verify is not None:
            verify(tmp)
    publish(path, fill)


def decode_all(path: str, decoder: str) -> tuple["torch.Tensor", float]:
    """All frames of ``path`` as uint8 TCHW, plus the fps the decoder reports."""
    import torch
    if decoder == "decord":
        import decord
        try:
            vr = decord.VideoReader(path, ctx=decord.cpu(0))
            arr = vr.get_batch(list(range(len(vr)))).asnumpy()
        except decord.DECORDError as e:      # a bare Exception subclass: say what it is
            raise RuntimeError(f"decord: {str(e).strip().splitlines()[-1][:200]}") from None
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
    """The decoders this node has: a frozen file is checked with each (decord has no aarch64 wheel, so a node
    without it checks with the others; a reader's frames are checked against their digest wherever they land)."""
    names = ["pyav"]
    try:
        import decord  # noqa: F401
        names.insert(0, "decord")
    except ImportError:
        pass
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401
        names.insert(1, "torchcodec")
    except (ImportError, OSError, RuntimeError):  # torchcodec missing, or its FFmpeg/torch libraries do not load
        pass
    return names


def verify_frozen(path: str, frames: "torch.Tensor", rate: Fraction = FROZEN_FPS,
                  decoders: list[str] | None = None) -> dict:
    """Re-decode ``path`` with every available decoder; raise unless all give ``frames`` bit-exactly."""
    import torch
    report = {}
    for name in decoders or available_decoders():
        try:
            got, fps = decode_all(path, name)
        except (RuntimeError, ValueError, OSError) as e:   # decord cannot open a 2-frame NUT, say
            raise FrozenFileError(f"{name} cannot decode {path}: {type(e).__name__}: {str(e)[:200]}") from None
        if got.shape != frames.shape or not torch.equal(got, frames):
            diff = "shape " + str(tuple(got.shape)) if got.shape != frames.shape else \
                f"max |diff| {int((got.int() - frames.int()).abs().max())}"
            raise FrozenFileError(f"{name} re-decodes {path} inexactly ({diff})")
        if fps != float(rate):
            raise FrozenFileError(f"{name} reports {fps} fps for {path}, expected exactly {float(rate)}")
        report[name] = fps
    return report




class Trailing(str):
    """What ``frames_bytes`` met after the last of the entry's frames (bytes that do not decode, more frames): damage
    that spares every frame.  A ``str`` saying what it was."""


def frames_bytes(data, shape: tuple[int, int, int, int]) -> tuple[np.ndarray, Trailing | None]:
    """The uint8 TCHW bytes of ``shape`` that a frozen file (its bytes, or a readable file of them) holds, as a
    flat array of its own, decoded in memory with PyAV (no torch): how a node expands a shared-tier entry; and
    what followed the last frame, when something did (None: the file ends with it).
    The caller checks the frames against the entry's blob digest.

    Only what stands between the frames and the entry is a reason to refuse the file: a frame that does not decode,
    or too few.  Once all ``t`` frames are out, an error (bytes appended: FFmpeg says ``InvalidDataError``) or a
    further frame is reported as ``Trailing``, never raised: the frames are whole, and the digest decides (D55:
    one appended byte made every reader delete an object holding every frame exactly).

    A planar RGB file (gbrp: MagicYUV's, UT Video's) *is* TCHW once its planes are reordered, so each plane is copied
    straight into place: no colour conversion, no transpose, one copy of the frames in all (the slow part
    of a first read was swscale and numpy's reshuffles, not the codec).  Other formats go through rgb24.
    """
    import io

    import av
    t, c, h, w = shape
    # np.empty, not bytearray: a bytearray is zero-filled first, a pass over fresh pages as long as the copy
    # itself (0.09 s of 0.11 s for 146 MB on the 2-core VM; more where page faults are dear, as under gVisor).
    out = np.empty(t * c * h * w, dtype=np.uint8)
    dst = out.reshape(t, c, h, w)
    n, trailing = 0, None
    try:
        # A file (store/prefetch.Prefetch) is decoded as it arrives; bytes, from memory.
        with av.open(data if hasattr(data, "read") else io.BytesIO(data)) as box:
            s = box.streams.video[0]
            s.thread_type = "AUTO"         # slices decode in parallel; exact either way
            broke = []                     # the demuxer's error, met after the frames before it were decoded
            for frame in _decoded(box, s, broke):
                if n == t:
                    trailing = Trailing(f"holds more than the entry's {t} frames")
                    break
                if (frame.height, frame.width) != (h, w):
                    raise FrozenFileError(f"frozen file holds a frame of {frame.height}x{frame.width}, not {h}x{w}")
                if frame.format.name == "gbrp":
                    for ch, p in zip((1, 2, 0), frame.planes):          # planes are G, B, R
                        rows = np.frombuffer(p, dtype=np.uint8).reshape(h, p.line_size)
                        dst[n, ch] = rows[:, :w]                       # line_size may pad each row
                else:
                    dst[n] = frame.to_ndarray(format="rgb24").transpose(2, 0, 1)
                n += 1
            if broke and n == t and trailing is None:
                trailing = Trailing(f"does not decode after its last frame ({broke[0]})")
            elif broke and n != t:
                raise FrozenFileError(f"frozen file does not decode: {broke[0]}")
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        if n != t:
            raise FrozenFileError(f"frozen file does not decode: {type(e).__name__}: {e}") from None
        trailing = Trailing(f"does not decode after its last frame ({type(e).__name__}: {str(e)[:120]})")
    if n != t:
        raise FrozenFileError(f"frozen file holds {n} frames, the entry has {t}")
    return out, trailing


def _decoded(box, stream, broke: list):
    """``stream``'s frames, every one the packets before a demuxer error hold: the decoder is flushed at the
    error, since with slice threads it holds frames back, and an error raised through ``box.decode`` lost them
    (a sound object with bytes appended lost its last frames so).  The error is put in ``broke``."""
    import av
    ctx = stream.codec_context
    try:
        for packet in box.demux(stream):
            if packet.size == 0:
                break                      # the end: flushed below
            yield from ctx.decode(packet)
    except (av.error.FFmpegError, IndexError, ValueError) as e:
        broke.append(f"{type(e).__name__}: {str(e)[:120]}")
    yield from ctx.decode(None)
