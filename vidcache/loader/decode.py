"""Decoders behind one small interface.

decord is the primary decoder because qwen-vl-utils reads videos with it.  Two of its failure modes are
handled here rather than left to the machine:

* **Threads.**  decord feeds FFmpeg one packet and takes back at most one frame per call; with frame
  threading on more than two threads some VP9 WebM streams (libvpx two-pass, alt-ref superframes) then
  get EAGAIN from ``avcodec_send_packet`` and fail ("Thread worker: Error sending packet", dmlc/decord#246).
  FFmpeg's ``threads=0`` means "cores + 1", so the same file decoded on 2 cores and failed on 64.  A thread
  count of 0 is therefore never passed on (it becomes ``DEFAULT_DECODER_THREADS``), and a multi-threaded
  decode that fails is retried once single-threaded.  Decoded bytes do not depend on the thread count
  (tests/scenarios/test_codecs.py checks 1, 2 and 8 threads on every codec of its matrix).
* **Streams decord cannot open** (its bundled FFmpeg 4.1 has no AV1 decoder and cannot size a GIF) fall
  back to ``PyAVReader``, which replays decord's conversion on PyAV's FFmpeg; see that class for what is
  and is not bit-identical.  The reader records ``fallback_from`` and the reason, for the provenance.

PyAV probes the container first: it is cheap and reports the codec and the exact rational frame rate.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

import torch

from ..errors import BackendUnavailableError, DecodeError, UnsupportedCodecError
from ..options import DECODERS

BACKENDS = DECODERS
# What decoder_threads=0 means.  Fixed, never FFmpeg's "auto" (which follows the core count): 2 is the most
# threads at which decord decoded every stream of the codec matrix, including the VP9 that fails at 3+.
DEFAULT_DECODER_THREADS = 2


@dataclass(frozen=True)
class StreamInfo:
    codec: str
    width: int
    height: int
    fps_rational: Fraction | None     # container average rate, exact
    num_frames_from_header: int
    bit_depth: int = 8                 # FFmpeg holds anything above 8 bits in 16-bit samples


def resolve_threads(threads: int) -> int:
    if threads < 0:
        raise ValueError(f"decoder threads must be >= 0, got {threads}")
    return threads or DEFAULT_DECODER_THREADS


def _first_line(e: BaseException) -> str:
    """The useful part of a decoder error: decord prefixes "[12:00:00] src/file.cc:218: " (twice) and puts
    its CHECK message on the last line."""
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return re.sub(r"\[\d\d:\d\d:\d\d\] \S+:\d+: ", "", lines[-1] if lines else type(e).__name__)[:300]


def probe(path: str) -> StreamInfo:
    import av

    try:
        with av.open(path) as c:
            if not c.streams.video:
                raise DecodeError(f"no video stream in {path!r} (streams: {[s.type for s in c.streams]})")
            # av_find_best_stream, as decord picks: skips cover art (attached pictures).
            s = c.streams.best("video")
            rate = Fraction(s.average_rate) if s.average_rate else None
            cc = s.codec_context
            if cc is None:      # FFmpeg has no decoder for it at all (an unknown FourCC, say): nor does decord
                raise UnsupportedCodecError(f"no FFmpeg decoder knows the video stream of {path!r}")
            bits = max((c.bits for c in av.VideoFormat(cc.pix_fmt).components), default=8) if cc.pix_fmt else 8
            return StreamInfo(cc.name, cc.width, cc.height, rate, s.frames, bits)
    except DecodeError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as e:  # InvalidDataError, a missing file, ...
        raise DecodeError(f"not a readable video container: {type(e).__name__}: {e}") from None


class Reader:
    """What every reader provides: ``num_frames`` and ``avg_fps`` (what sampling uses), ``get_frames``
    (uint8 TCHW), ``version``, the thread count it really used, and ``notes`` for the provenance."""
    name = ""
    fallback_from: str | None = None        # set on a fallback reader: the backend that could not open it
    fallback_reason: str | None = None

    def __init__(self, threads: int):
        self.threads, self.notes = threads, {}


class DecordReader(Reader):
    name = "decord"

    def __init__(self, path: str, info: StreamInfo, threads: int):
        super().__init__(threads)
        try:
            import decord
        except ImportError as e:
            raise BackendUnavailableError("decord is not installed: pip install decord") from e
        self._decord, self._path, self._size = decord, path, f"{info.width}x{info.height}"
        try:
            self._vr = decord.VideoReader(path, ctx=decord.cpu(0), num_threads=threads)
        except (decord.DECORDError, RuntimeError) as e:   # its C++ CHECKs, or "Error reading" from Python
            raise UnsupportedCodecError(f"decord cannot open the {info.codec!r} stream: {_first_line(e)}") from None
        self.num_frames = len(self._vr)
        self.avg_fps = self._vr.get_avg_fps()
        self.version = decord.__version__

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        try:
            batch = self._vr.get_batch(indices)
        except self._decord.DECORDError as e:
            if "DECORDArrayCopyFromTo" in str(e):
                # decord 0.6's frame copy fails at some small sizes (16x16, 24x24, 48x16; not 20x20 or 64x16)
                # on any thread count: nothing qwen-vl-utils' decord reader can read either.  Not a damaged
                # stream, so the caller falls back as for a stream decord cannot open.
                raise UnsupportedCodecError(f"decord cannot copy out this stream's {self._size} frames: "
                                            f"{_first_line(e)}") from None
            if self.threads <= 1:
                raise DecodeError(f"decoding failed (truncated or corrupt stream?): {_first_line(e)}") from None
            # decord's send/receive loop fails on some streams with frame threading (module docstring).
            self.notes["retried_single_thread"] = f"{self.threads} threads failed: {_first_line(e)}"
            self.threads = 1
            self._vr = self._decord.VideoReader(self._path, ctx=self._decord.cpu(0), num_threads=1)
            return self.get_frames(indices)
        # dlpack shares decord's buffer: no second full-size copy (see build.py's memory estimate).
        return torch.utils.dlpack.from_dlpack(batch.to_dlpack()).permute(0, 3, 1, 2)


class TorchcodecReader(Reader):
    """An explicit alternative only, never the fallback: on the codec matrix it is not decord-exact for
    10-bit video, fails on MPEG-2 program/transport streams and reports another fps for VFR Matroska."""
    name = "torchcodec"

    def __init__(self, path: str, info: StreamInfo, threads: int):
        super().__init__(threads)
        try:
            import torchcodec
            from torchcodec.decoders import VideoDecoder
        except Exception as e:  # ImportError, or RuntimeError when its FFmpeg/torch libs do not load
            raise BackendUnavailableError(f"torchcodec is not usable here: {e}") from e
        try:
            self._dec = VideoDecoder(path, num_ffmpeg_threads=threads)
        except (RuntimeError, ValueError) as e:
            raise UnsupportedCodecError(f"torchcodec cannot open the {info.codec!r} stream: {e}") from None
        self.num_frames = self._dec.metadata.num_frames
        self.avg_fps = self._dec.metadata.average_fps
        self.version = torchcodec.__version__

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        try:
            return self._dec.get_frames_at(indices=indices).data
        except (RuntimeError, ValueError, IndexError) as e:
            raise DecodeError(f"decoding failed (truncated or corrupt stream?): {e}") from None


class PyAVReader(Reader):
    """decord's semantics on PyAV's own FFmpeg: the fallback for streams decord cannot open.

    * frame count: the number of packets of the stream, which is what ``len(decord.VideoReader)`` returns
      once decord has indexed the file (``VideoReader::IndexKeyframes``); frame ``i`` is the ``i``-th frame
      the decoder outputs, read sequentially (no seeking).  Indices past the last decoded frame get the last
      decoded frame, as decord's cached-frame fallback does; how many is recorded in ``notes``.
    * fps: the stream's ``avg_frame_rate``, the field decord's ``get_avg_fps()`` returns.
    * pixels: decord's filter graph (``FFMPEGThreadedDecoder::SetCodecContext``): the display-matrix
      rotation as ``transpose``, then ``scale=W:H`` to RGB24 with FFmpeg 4.1's default ``bilinear`` flags.
      FFmpeg 7+ honours the frame's chroma siting where 4.1 assumed centred chroma; ``in_v_chr_pos=256``
      restores 4.1's vertical position for vertically subsampled (4:2:0) input.  Measured against decord on
      every stream both can open (tests/scenarios/test_codecs.py): identical for 8-bit 4:2:0 / 4:2:2 / 4:4:4, full
      range, gray, RGB and palette formats, rotated 8-bit; NOT identical for 10-bit 4:2:0, rotated or not
      (FFmpeg 8's swscale rounds some out-of-gamut pixels differently: a few pixels, up to 5 levels).
    """
    name = "pyav"

    def __init__(self, path: str, info: StreamInfo, threads: int):
        import av
        super().__init__(threads)
        self._av, self._path = av, path
        try:
            with av.open(path) as c:
                s = c.streams.best("video")
                # The demuxer's trailing flush packet is empty; decord never sees it (av_read_frame only).
                self.num_frames = sum(1 for p in c.demux(s) if p.size)
                # avg_frame_rate, as decord; where a container has none decord would report NaN and
                # qwen-vl-utils could not sample, so take FFmpeg's guess (r_frame_rate) instead.
                rate = s.average_rate or s.guessed_rate
        except av.error.FFmpegError as e:
            raise DecodeError(f"PyAV cannot read the {info.codec!r} stream: {e}") from None
        if not rate:
            raise DecodeError(f"the {info.codec!r} stream has no frame rate to sample by")
        self.avg_fps = float(rate)
        self._size = (info.width, info.height)
        self.version = f"{av.__version__} (libavcodec {'.'.join(map(str, av.library_versions['libavcodec']))})"

    def _graph(self, frame, time_base):
        rot = -(frame.rotation or 0) % 360            # decord: theta = -av_display_rotation_get(matrix)
        w, h = self._size
        if rot in (90, 270):
            w, h = h, w
        steps = {90: ["transpose=1"], 180: ["transpose=1", "transpose=1"], 270: ["transpose=2"]}.get(rot, [])
        scale = f"scale={w}:{h}:flags=bilinear"
        if round(frame.height / frame.format.chroma_height(frame.height)) == 2:   # 4:2:0, nv12, 4:4:0
            scale += ":in_v_chr_pos=256"
        g = self._av.filter.Graph()
        last = g.add_buffer(width=frame.width, height=frame.height, format=frame.format.name, time_base=time_base)
        for step in steps + [scale, "format=rgb24"]:
            name, _, arg = step.partition("=")
            node = g.add(name, arg)
            last.link_to(node)
            last = node
        sink = g.add("buffersink")
        last.link_to(sink)
        g.configure()
        return g

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        av = self._av
        want: dict[int, list[int]] = {}
        for j, i in enumerate(indices):
            want.setdefault(i, []).append(j)
        out, graph, last, k = None, None, None, -1

        def put(frame, slots):
            nonlocal out
            graph.push(frame)
            rgb = torch.from_numpy(graph.pull().to_ndarray())
            if out is None:
                out = torch.empty((len(indices), *rgb.shape), dtype=torch.uint8)
            for j in slots:
                out[j] = rgb

        try:
            with av.open(self._path) as c:
                s = c.streams.best("video")
                s.thread_count = self.threads
                if self.threads > 1:
                    s.thread_type = "AUTO"
                stop = max(indices)
                for k, frame in enumerate(c.decode(s)):
                    if graph is None:
                        graph = self._graph(frame, s.time_base)
                    if k in want:
                        put(frame, want[k])
                    last = frame
                    if k >= stop:
                        break
                tail = [j for i in want if i > k for j in want[i]]
                if tail:
                    if last is None:
                        raise DecodeError("the video stream has no decodable frames")
                    self.notes["repeated_last_frame"] = len(tail)
                    put(last, tail)
        except av.error.FFmpegError as e:
            raise DecodeError(f"decoding failed (truncated or corrupt stream?): {e}") from None
        return out.permute(0, 3, 1, 2)


_READERS = {"decord": DecordReader, "torchcodec": TorchcodecReader, "pyav": PyAVReader}


def _fallback_reader(path: str, info: StreamInfo, threads: int, why: UnsupportedCodecError) -> "PyAVReader":
    """The reader for a stream decord cannot open (or cannot copy frames out of): ``PyAVReader``, which
    records why; refused above 8 bits."""
    if info.bit_depth > 8:
        # The fallback equals decord's bytes on every 8-bit stream tested (tests/scenarios/test_codecs.py), not on
        # >8-bit ones (FFmpeg 8's swscale vs decord's 4.1: up to 4 levels on 10-bit AV1).  Decoder-
        # dependent bytes under a decoder-free key would break "one key, one set of frames": refuse.
        raise UnsupportedCodecError(
            f"decord cannot read this {info.bit_depth}-bit {info.codec!r} stream, and the fallback decoder is "
            "not bit-exact with decord above 8 bits; transcode it to 8-bit (or H.264/HEVC, which decord "
            "opens) first") from None
    reader = PyAVReader(path, info, threads)
    reader.fallback_from, reader.fallback_reason = "decord", str(why)
    return reader


def open_reader(path: str, backend: str = "decord", threads: int = 0, fallback: bool = True,
                decord_failed: UnsupportedCodecError | None = None):
    """(StreamInfo, reader) for ``path``: the single entry point of every decode.

    With ``fallback``, a stream decord cannot open is read by ``PyAVReader``; the reader's
    ``fallback_from`` / ``fallback_reason`` say so.  ``decord_failed``: decord opened this stream but
    could not copy its frames out (``DecordReader.get_frames``), so go to that fallback at once.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown decoder backend {backend!r}; choose one of {BACKENDS}")
    info = probe(path)
    threads = resolve_threads(threads)
    if decord_failed is not None and fallback and backend == "decord":
        reader = _fallback_reader(path, info, threads, decord_failed)
    else:
        try:
            reader = _READERS[backend](path, info, threads)
        except UnsupportedCodecError as e:
            if not (fallback and backend == "decord"):
                raise
            reader = _fallback_reader(path, info, threads, e)
    if reader.num_frames <= 0:
        raise DecodeError("the video stream has no decodable frames")
    return info, reader
