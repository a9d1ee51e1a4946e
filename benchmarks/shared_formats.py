"""Candidate lossless encodings for one compact shared-tier object per entry (issue 17, phase 1: measure).

    PYTHONPATH=.:<dir with zstandard> .venv/bin/python benchmarks/shared_formats.py [clip ...] [--fps 2]

For each source clip (default: generated 1280x720 h264 clips, ffmpeg lavfi testsrc2 / mandelbrot + temporal
noise, x264 crf 23, i.e. decoded lossy footage as the cache really stores it), the entry's frames are built with
vidcache's own pipeline (qwen2_5_vl, qwen-vl-utils defaults at --fps), then every candidate is encoded and
decoded in memory with PyAV (and zstandard, if importable; it is not a dependency) and checked exact with
numpy's array_equal.  Printed per candidate: size as a ratio to the raw frames, encode and decode throughput in
MB/s of raw frames, 1 and 2 decoder threads.  Never asserts on time.

Measured on the shared 2-core VM (load 4), 20 frames 1008x560 (33.9 MB raw) per clip:
  testsrc2+noise: FFV1 l3 0.48x, enc 15 / dec 12-15 MB/s; UT Video 0.56x, dec 124-142 MB/s;
                  x264rgb qp0 0.51-0.57x, dec 6-21 MB/s; zstd-1 0.60x dec 190 MB/s; zstd-3 on left-predicted
                  planes 0.56x
  mandelbrot:     FFV1 l3 0.26x, dec 12-25 MB/s; UT Video 0.42x, dec 135-166 MB/s; x264rgb qp0 0.33-0.36x,
                  dec 11-59 MB/s; zstd-1 0.56x dec 478 MB/s; zstd-19 0.43x; zstd-3 on left-predicted planes 0.39x
All PyAV candidates decoded exactly.  The conflict this shows: only FFV1 is small enough for <= 0.35x with
stock-mode files included, and it decodes at ~10-25 MB/s per core, slower than decoding the h264 source.
"""
from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from vidcache import VideoOptions
from vidcache.loader.build import decode_sample_resize

try:
    import zstandard
except ImportError:          # optional: the zstd rows are skipped
    zstandard = None

CANDIDATES = {   # name -> (codec, pix_fmt, container, codec options)
    "ffv1 level 3, bgr0": ("ffv1", "bgr0", "matroska", {"level": "3", "g": "1"}),
    "ffv1 level 3, 4 slices": ("ffv1", "bgr0", "matroska", {"level": "3", "g": "1", "slices": "4"}),
    "ffv1 level 3, 4 slices, context 1": ("ffv1", "bgr0", "matroska",
                                          {"level": "3", "g": "1", "slices": "4", "context": "1"}),
    "ffv1 defaults (frozen file)": ("ffv1", "bgr0", "matroska", {}),
    "utvideo gbrp, median (frozen file before MagicYUV)": ("utvideo", "gbrp", "nut", {"pred": "median"}),
    "magicyuv gbrp, gradient (frozen file)": ("magicyuv", "gbrp", "nut", {"pred": "gradient"}),
    "magicyuv gbrp, median": ("magicyuv", "gbrp", "nut", {"pred": "median"}),
    "ffvhuff gbrp, median, context 1": ("ffvhuff", "gbrp", "nut", {"pred": "median", "context": "1"}),
    "x264rgb qp 0 ultrafast": ("libx264rgb", "rgb24", "matroska", {"qp": "0", "preset": "ultrafast"}),
    "x264rgb qp 0 veryfast": ("libx264rgb", "rgb24", "matroska", {"qp": "0", "preset": "veryfast"}),
}
LAVFI = {"testsrc2+noise": "testsrc2=size=1280x720:rate=30,noise=alls=12:allf=t",
         "mandelbrot+noise": "mandelbrot=size=1280x720:rate=30,noise=alls=8:allf=t"}


def frames_of(path: str, fps: float) -> np.ndarray:
    f, _ = decode_sample_resize(path, VideoOptions(family="qwen2_5_vl", fps=fps), "decord", decoder_threads=1)
    return f.permute(0, 2, 3, 1).contiguous().numpy()        # T x H x W x 3


def encode_av(thwc: np.ndarray, codec: str, pix_fmt: str, fmt: str, opts: dict) -> bytes:
    import av
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        s = c.add_stream(codec, rate=2)
        s.pix_fmt, (s.height, s.width), s.options = pix_fmt, thwc.shape[1:3], opts
        for fr in thwc:
            for p in s.encode(av.VideoFrame.from_ndarray(fr, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def decode_av(data: bytes, threads: int) -> np.ndarray:
    import av
    with av.open(io.BytesIO(data)) as c:
        s = c.streams.video[0]
        s.thread_type, s.thread_count = "AUTO", threads
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(s)])


def best(fn, n: int = 2):
    t_best, out = float("inf"), None
    for _ in range(n):
        t = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t)
    return t_best, out


def bench(name: str, thwc: np.ndarray) -> None:
    raw = thwc.tobytes()
    n = len(raw)
    print(f"\n## {name}: {thwc.shape} uint8, raw {n / 1e6:.1f} MB")
    for cand, (codec, pf, fmt, o) in CANDIDATES.items():
        te, data = best(lambda: encode_av(thwc, codec, pf, fmt, o), 1)
        td1, got = best(lambda: decode_av(data, 1))
        td2, _ = best(lambda: decode_av(data, 2))
        exact = got.shape == thwc.shape and np.array_equal(got, thwc)
        print(f"  {cand:36s} {len(data) / n:.3f}x  enc {n / te / 1e6:5.0f} MB/s  dec {n / td1 / 1e6:5.0f} / "
              f"{n / td2 / 1e6:5.0f} MB/s (1/2 threads)  {'EXACT' if exact else 'INEXACT'}")
    if zstandard is None:
        print("  (zstandard not importable: zstd rows skipped)")
        return
    planar = np.ascontiguousarray(thwc.transpose(0, 3, 1, 2))
    left = planar.copy()
    left[..., 1:] -= planar[..., :-1]            # uint8 wraps: exactly invertible by a cumulative sum
    for label, payload in (("raw frames", raw), ("left-predicted planes", left.tobytes())):
        for level in (1, 3, 9, 19):
            te, data = best(lambda: zstandard.ZstdCompressor(level=level).compress(payload), 1)
            td, out = best(lambda: zstandard.ZstdDecompressor().decompress(data))
            assert out == payload
            print(f"  zstd-{level:<2d} {label:29s} {len(data) / n:.3f}x  enc {n / te / 1e6:5.0f} MB/s  "
                  f"dec {n / td / 1e6:5.0f} MB/s (entropy stage only for predicted planes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("clips", nargs="*")
    ap.add_argument("--fps", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=10.0, help="length of the generated clips")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="vc-bench-")
    clips = [(os.path.basename(p), p) for p in a.clips]
    if not clips:
        for name, src in LAVFI.items():
            p = os.path.join(work, name.replace("+", "_") + ".mp4")
            subprocess.run(["ffmpeg", "-y", "-v", "error", "-f", "lavfi", "-i", src, "-frames:v",
                            str(int(30 * a.seconds)), "-c:v", "libx264", "-preset", "veryfast", "-crf", "23",
                            "-pix_fmt", "yuv420p", p], check=True)
            clips.append((name, p))
    for name, p in clips:
        bench(name, frames_of(p, a.fps))


if __name__ == "__main__":
    sys.exit(main())
