"""Peak RSS of decode + sample + resize against ``estimate_peak_bytes`` (the pre-decode refusal bound).

Each measurement runs in a fresh interpreter: it imports everything and decodes a tiny clip first, so the
baseline includes the libraries, then resets the kernel's high-water mark (``/proc/self/clear_refs``) and
decodes the big clip; growth = VmHWM - baseline VmRSS.  Clips are flat-colour (tiny files, huge frames: the
decompression-bomb case).  Linux only.

    .venv/bin/python benchmarks/decode_memory.py [--sizes 4000 8000] [--threads 1 2 8] [--dir /tmp/vc-mem]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import json, sys
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
path, tiny, decoder, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
import torch
torch.set_num_threads(1)                     # as in prewarm workers
from vidcache import VideoOptions
from vidcache.loader.build import decode_sample_resize, estimate_peak_bytes
from vidcache.loader.decode import probe
decode_sample_resize(tiny, VideoOptions(), decoder=decoder)   # load every lazily imported code path
open("/proc/self/clear_refs", "w").write("5")                 # reset VmHWM to the current RSS
base = status("VmRSS:")
frames, built = decode_sample_resize(path, VideoOptions(), decoder=decoder, decoder_threads=threads,
                                     max_decoded_bytes=1 << 62)
peak = status("VmHWM:")
n, _, h, w = frames.shape
info = probe(path)
est = estimate_peak_bytes(n, info.height, info.width, h, w, bytes_per_sample=2 if info.bit_depth > 8 else 1,
                          threads=built.provenance["decoder_threads"],
                          stream_frames=built.source.num_frames_from_decoder)
print(json.dumps({"n": n, "growth": peak - base, "estimate": est, "base": base,
                  "decoder": built.provenance["decoder"]}))
"""

# name -> (ffmpeg encoder args, suffix)
CODECS = {
    "h264": (["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p"], ".mp4"),
    "hevc": (["-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=error"], ".mkv"),
    "mjpeg": (["-c:v", "mjpeg", "-q:v", "20", "-pix_fmt", "yuvj420p"], ".avi"),
    "h264_10bit": (["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p10le"], ".mkv"),
    "av1": (["-c:v", "libsvtav1", "-preset", "12"], ".mkv"),     # decord cannot open it: the PyAV fallback
}


def make_clip(directory: str, codec: str, size: int, frames: int) -> str:
    args, suffix = CODECS[codec]
    path = os.path.join(directory, f"{codec}_{size}_{frames}{suffix}")
    if not os.path.exists(path):
        src = f"color=c=gray:size={size}x{size}:rate=25,drawbox=x=t*400:y=100:w=500:h=500:c=red:t=fill"
        subprocess.run(["ffmpeg", "-y", "-v", "error", "-f", "lavfi", "-i", src, "-frames:v", str(frames), *args,
                        path], check=True, env={**os.environ, "SVT_LOG": "1"})
    return path


def measure(path: str, tiny: str, threads: int, decoder: str = "decord") -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, path, tiny, decoder, str(threads)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[4000, 8000])
    ap.add_argument("--threads", type=int, nargs="+", default=[2])
    ap.add_argument("--codecs", nargs="+", default=list(CODECS))
    ap.add_argument("--frames", type=int, default=8, help="clip length (25 fps; 8 frames -> 4 sampled)")
    ap.add_argument("--dir", default="/tmp/vc-mem")
    a = ap.parse_args()
    from _common import report  # here, so tests can import this module without benchmarks/ on sys.path
    os.makedirs(a.dir, exist_ok=True)
    tiny = make_clip(a.dir, "h264", 64, 8)
    rows = []
    for codec in a.codecs:
        for size in a.sizes:
            path = make_clip(a.dir, codec, size, a.frames)
            for t in a.threads:
                r = measure(path, tiny, t)
                name = (f"{codec} {size}x{size} n={r['n']} threads={t} ({r['decoder']}, "
                        f"{os.path.getsize(path) // 1000} kB)")
                growth, est = r["growth"] / 2**20, r["estimate"] / 2**20
                rows.append((name, f"growth {growth:7.0f} MiB  estimate {est:7.0f} MiB  ratio {est / growth:.2f}"))
    report("peak RSS growth of decode_sample_resize vs estimate_peak_bytes", rows)


if __name__ == "__main__":
    main()
