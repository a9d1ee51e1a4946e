"""Decode, sample and resize one video into canonical uint8 frames plus metadata."""
from __future__ import annotations

import torch

from ..errors import FrameBudgetError, UnsupportedCodecError
from ..options import DEFAULT_DECODER, VideoOptions
from .decode import open_reader
from .record import Built, Sampling, Source
from .resize import aspect_distortion, resize_frames, target_size
from .sample import select_frames

DEFAULT_MAX_DECODED_BYTES = 8 << 30
# Frames resized per call are capped by the size of their float32 copy (see estimate_peak_bytes).
RESIZE_CHUNK_BYTES = 64 << 20
# Full-size RGB frames' worth of memory FFmpeg and decord hold besides the batch (reference frames, per-frame
# decoder tables, decord's cached frame and filter output), plus one per decoder thread.
DECODER_FRAMES = 10
# Allocator slack and bookkeeping that does not scale with the frames; decord also indexes every packet
# (timestamps plus a pts->index map, under 128 bytes each).
FIXED_OVERHEAD = 64 << 20
PER_PACKET = 128


def estimate_peak_bytes(n: int, height: int, width: int, out_h: int, out_w: int, *,
                        bytes_per_sample: int = 1, threads: int = 1, stream_frames: int = 0) -> int:
    """An upper bound on the RSS growth of decoding ``n`` frames of ``width x height`` and resizing them.

    With ``F = 3 * height * width`` (one full-size RGB24 frame):
    * ``n * F``: the decoded batch (decord's ``get_batch`` buffer, shared with torch through dlpack);
    * ``(DECODER_FRAMES + threads) * F * bytes_per_sample``: FFmpeg's and decord's own frames; or, whichever
      is larger (the decoder is closed before the resize starts),
      ``4 * k * 3 * (H*W + max(H*w, W*h) + h*w)``: one resize chunk of ``k`` frames in float32, because
      torchvision's antialiased bicubic resize of uint8 converts to float32 and runs two separable passes;
    * ``2 * n * 3 * h * w``: the resized frames and the chunk being copied into them;
    * ``FIXED_OVERHEAD + PER_PACKET * stream_frames``: allocator slack and decord's packet index.

    Measured (benchmarks/decode_memory.py: peak RSS growth of a fresh process, flat-colour clips, 4 sampled
    frames resized to 756x756; 1 / 2 / 8 decoder threads), growth vs this estimate in MiB:
        h264  4000x4000:   488 /  484 /  702   vs   764 /  810 / 1084
        h264  8000x8000:  1694 / 2093 / 2811   vs  2824 / 3007 / 4105   (the 189 kB clip of issue 9)
        hevc  8000x8000:  2302 / 2325 / 2925   vs  2824 / 3007 / 4105   (tightest: 1.23x)
        mjpeg 8000x8000:  1554 / 1554 / 1554   vs  2824 / 3007 / 4105
        h264 10-bit 8000: 1762 / 2000 / 3172   vs  4838 / 5204 / 7401
        av1 (PyAV) 8000:  1549 / 1932 / 2248   vs  2824 / 3007 / 4105
        h264 / hevc 1080x1080, 40 sampled frames, 2 threads: 329 / 340 vs 445
    Before this change the same 8000x8000 h264 clip grew by 5,521 MiB (a second copy of the batch from
    ``asnumpy()``, and the whole batch converted to float32 at once) while the old estimate
    ``3 * n * (H*W + h*w)`` said 739 MiB.
    """
    frame = 3 * height * width
    k = chunk_frames(height, width, n)
    decoder = (DECODER_FRAMES + max(1, threads)) * frame * bytes_per_sample
    # One resize chunk in float32: the input copy, the first separable pass (either orientation), the output.
    resize = 4 * k * 3 * (height * width + max(height * out_w, width * out_h) + out_h * out_w)
    # The decoder is closed before the resize starts, so only the larger of the two is live at once.
    fixed = FIXED_OVERHEAD + PER_PACKET * stream_frames
    return n * frame + max(decoder, resize) + 2 * n * 3 * out_h * out_w + fixed


def chunk_frames(height: int, width: int, n: int) -> int:
    """Frames per resize call: at least one, at most RESIZE_CHUNK_BYTES of float32 input."""
    return max(1, min(n, RESIZE_CHUNK_BYTES // (3 * height * width * 4)))


def _resize_chunked(raw: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """``resize_frames`` a few frames at a time into one output.

    Each frame is resized independently, so the result is the same bytes as one call over the whole batch
    (tests/scenarios/test_codecs.py checks it against qwen-vl-utils with a one-frame chunk); only the float32
    intermediates shrink from the whole batch to one chunk.
    """
    n, c, height, width = raw.shape
    out = torch.empty((n, c, *size), dtype=torch.uint8)
    k = chunk_frames(height, width, n)
    for i in range(0, n, k):
        out[i:i + k] = resize_frames(raw[i:i + k], size)
    return out


def _provenance(reader) -> dict:
    """Which decoder really produced the frames, recorded in the manifest (never keyed)."""
    out = {"decoder": reader.name, "decoder_version": reader.version, "decoder_threads": reader.threads}
    if reader.fallback_from:
        out.update(fallback_from=reader.fallback_from, fallback_reason=reader.fallback_reason)
    out.update(reader.notes)       # e.g. retried_single_thread, repeated_last_frame
    return out


def decode_sample_resize(path: str, options: VideoOptions, decoder: str = DEFAULT_DECODER,
                         max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
                         decoder_threads: int = 0, fallback: bool = True) -> tuple[torch.Tensor, Built]:
    """Canonical frames of ``path`` plus the :class:`Built` record the manifest is made from.

    ``max_decoded_bytes`` bounds ``estimate_peak_bytes``: a video that cannot fit is refused with
    ``FrameBudgetError`` (kind ``too_large``) before any frame is decoded.  ``decoder_threads=0`` is a
    fixed default, never the machine's core count (see loader.decode).
    """
    info, held = _open(path, decoder, decoder_threads, fallback=fallback)
    name, threads = held[0].name, held[0].threads
    try:
        return _build(info, held, options, max_decoded_bytes)
    except UnsupportedCodecError as e:     # decord opened the stream but cannot copy its frames out
        if not (fallback and name == "decord"):
            raise
        # Through open_reader again, the one entry point of every decode (tests count decodes there).
        return _build(*_open(path, decoder, threads, fallback=True, decord_failed=e), options, max_decoded_bytes)


def _open(path: str, decoder: str, threads: int, **kw) -> tuple:
    """``open_reader``'s (info, reader), the reader in a list that ``_build`` empties: no frame here keeps it
    (and its decoded frames) alive through the resize, which ``estimate_peak_bytes`` counts on."""
    info, reader = open_reader(path, decoder, threads, **kw)
    return info, [reader]


def _build(info, held: list, options: VideoOptions, max_decoded_bytes: int) -> tuple[torch.Tensor, Built]:
    reader = held.pop()
    num_frames, avg_fps = reader.num_frames, reader.avg_fps
    sel = select_frames(options, num_frames, avg_fps)
    n = len(sel.frame_indices)
    # The coded size; decord outputs the display orientation, so a 90/270 rotation swaps it (below).
    src_h, src_w = info.height, info.width
    h, w = target_size(options, n, src_h, src_w)
    need = estimate_peak_bytes(n, src_h, src_w, h, w,
                               bytes_per_sample=2 if info.bit_depth > 8 else 1, threads=reader.threads,
                               stream_frames=num_frames)
    if need > max_decoded_bytes:
        raise FrameBudgetError(f"{n} frames of {src_w}x{src_h} -> {w}x{h} need about {need} bytes to decode "
                               f"and resize, over the {max_decoded_bytes}-byte budget")
    raw = reader.get_frames(sel.frame_indices)
    provenance = _provenance(reader)      # after decoding: a retry changes the thread count
    del reader          # frees the decoder's frames before the resize allocates (estimate_peak_bytes)
    if raw.shape[0] != n:
        raise FrameBudgetError(f"decoder returned {raw.shape[0]} frames, expected {n}")
    if (raw.shape[2], raw.shape[3]) != (src_h, src_w):  # the decoder's size is what qwen-vl-utils sees
        h, w = target_size(options, n, raw.shape[2], raw.shape[3])
    dec_h, dec_w = int(raw.shape[2]), int(raw.shape[3])
    frames = _resize_chunked(raw, (h, w))
    del raw
    rate = info.fps_rational
    source = Source(codec=info.codec, width_from_decoder=dec_w, height_from_decoder=dec_h,
                    num_frames_from_decoder=num_frames, average_fps_from_decoder=float(avg_fps),
                    fps_from_header=f"{rate.numerator}/{rate.denominator}" if rate else None,
                    num_frames_from_header=int(info.num_frames_from_header or 0) or None)
    sampling = Sampling(tuple(sel.frame_indices), sel.total_num_frames, sel.sample_fps)
    return frames, Built(source, sampling, aspect_distortion(dec_w, dec_h, w, h), provenance)
