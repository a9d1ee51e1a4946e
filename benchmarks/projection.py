"""On-paper projection: prewarming 116k clips on 8 nodes x 64 cores, from rates measured here.

    .venv/bin/python benchmarks/projection.py [--clips 116000 --nodes 8 --cores 64] [--repeat 2]
                                              [--rate-per-core R --bytes-per-entry B]   # e.g. from ray_scaling.py

Measures, on this machine, one clip profile end to end with vidcache's own pipeline: a generated 30 s
1280x720 h264 clip (ffmpeg testsrc2, 30 fps, x264 veryfast) prewarmed with ``VideoOptions(family=
"qwen2_5_vl", fps=2.0)`` (qwen-vl-utils defaults) by ``prewarm(..., workers=1)`` with ``decoder_threads=1``
into a shared directory tier, once per shared layout: seconds per clip on one core, and the bytes the entry
puts into the shared tier.  Before (``raw``): the frames, plus in stock mode one frozen file per served entry
(measured with ``local_frozen_path``); after (``compact``, issue 17): one MagicYUV object that stock mode
reads too.

Then, on paper:
  wall time    = clips / (rate per core x nodes x cores)
  shared bytes = clips x (entry bytes + manifest)  [+ clips x frozen bytes, if every entry is served in stock mode]
  needed write bandwidth into the shared tier = shared bytes / wall time
Assumptions (stated in the output): throughput scales linearly with cores (one decode per core,
decoder_threads=1, CPU-bound, no shared-tier, network or source-read bottleneck, the same per-core speed
as this shared 2-core VM), every clip has this profile, and nothing is already cached.  A synthetic
test pattern decodes faster than camera footage at typical bitrates, so the wall time is a lower bound.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time

from _common import report
from vidcache import VideoCache, VideoOptions
from vidcache.prewarming import prewarm


def make_clip(path: str, width: int, height: int, seconds: float, fps: int = 30) -> str:
    subprocess.run(["ffmpeg", "-y", "-v", "error", "-f", "lavfi", "-i", f"testsrc2=size={width}x{height}:rate={fps}",
                    "-frames:v", str(int(seconds * fps)), "-c:v", "libx264", "-preset", "veryfast",
                    "-pix_fmt", "yuv420p", path], check=True)
    return path


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def duration(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def project(rows: list, label: str, clips: int, cores: int, rate: float, entry_bytes: float,
            frozen_bytes: float | None, manifest_bytes: float) -> None:
    wall = clips / (rate * cores)
    shared = clips * (entry_bytes + manifest_bytes)
    rows += [
        (f"{label}: wall time on {cores} cores", f"{duration(wall)}  ({clips} / ({rate:.3f} x {cores}) s)"),
        (f"{label}: shared tier, entries (frames + manifests)",
         f"{human(shared)}  ({human(entry_bytes)} + {human(manifest_bytes)} per entry)"),
        (f"{label}:   write bandwidth into the shared tier", f"{human(shared / wall)}/s sustained"),
    ]
    if frozen_bytes is not None:
        rows += [
            (f"{label}: + frozen files, all served in stock mode",
             f"{human(clips * frozen_bytes)}  ({human(frozen_bytes)} each); total {human(shared + clips * frozen_bytes)}"),
        ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=116_000)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--cores", type=int, default=64, help="cores per node")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the measured 720p clip")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rate-per-core", type=float, help="another profile's measured videos/s per core")
    ap.add_argument("--bytes-per-entry", type=float, help="... and its average entry bytes")
    ap.add_argument("--label", default="given profile", help="a name for that profile")
    a = ap.parse_args()
    cores = a.nodes * a.cores
    work = tempfile.mkdtemp(prefix="vc-bench-")
    try:
        t = time.perf_counter()
        src = make_clip(os.path.join(work, "clip720p.mp4"), 1280, 720, a.seconds)
        t_gen = time.perf_counter() - t
        ds = os.path.join(work, "d.jsonl")
        with open(ds, "w") as f:
            f.write(json.dumps({"prompt": "<video>", "videos": [src]}) + "\n")
        opts = VideoOptions(family="qwen2_5_vl", fps=2.0)
        measured = {}
        for layout in ("raw", "compact"):          # before / after issue 17: what one entry puts in the tier
            best = float("inf")
            for i in range(a.repeat):
                shared = os.path.join(work, f"shared-{layout}-{i}")
                cache = VideoCache(os.path.join(work, f"c-{layout}-{i}"), shared=shared, decoder_threads=1,
                                   shared_layout=layout)
                t = time.perf_counter()
                s = prewarm(ds, cache, opts, workers=1, progress=False)
                best = min(best, time.perf_counter() - t)
                assert s.new == 1 and s.failed == 0, s.line()
            tier_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(shared) for f in fs
                             if "/meta/" not in os.path.join(d, f) and "/src/" not in os.path.join(d, f))
            measured[layout] = (best, tier_bytes, cache)
        cache = measured["raw"][2]
        key = cache.entries()[0]
        m = cache.require_manifest(key)
        entry = m.frames.nbytes
        manifest_bytes = len(m.to_json())
        from vidcache.serving import SERVING_FORMAT
        from vidcache.sglang.frozen import local_frozen_path
        t = time.perf_counter()
        frozen = os.path.getsize(local_frozen_path(cache, key, SERVING_FORMAT))   # written and verified once
        t_frozen = time.perf_counter() - t
        (raw_s, raw_tier, _), (cmp_s, cmp_tier, _) = measured["raw"], measured["compact"]

        rows = [
            ("measured clip", f"1280x720 h264 {a.seconds:g} s 30 fps, {os.path.getsize(src) / 1e6:.1f} MB "
                              f"(generated in {t_gen:.1f} s)"),
            ("options", "VideoOptions(family='qwen2_5_vl', fps=2.0): qwen-vl-utils defaults"),
            ("entry", f"{tuple(m.frames.shape)} uint8 = {human(entry)}; manifest {human(manifest_bytes)}"),
            ("prewarm, 1 worker, decoder_threads=1, raw shared tier (best of "
             f"{a.repeat})", f"{raw_s:.2f} s per clip = {1 / raw_s:.3f} videos/s per core"),
            ("prewarm, same, compact shared tier", f"{cmp_s:.2f} s per clip = {1 / cmp_s:.3f} videos/s per core "
                                                   f"({cmp_s / raw_s:.2f}x the raw layout's time)"),
            (f"frozen file ({SERVING_FORMAT}, stock mode's serving format)",
             f"{human(frozen)} = {frozen / entry:.2f}x the frames; made + verified in {t_frozen:.1f} s"),
            ("shared tier per entry, raw layout", f"{human(raw_tier)} = {raw_tier / entry:.2f}x the frames "
                                                  f"(+ {frozen / entry:.2f}x frozen in stock mode)"),
            ("shared tier per entry, compact layout", f"{human(cmp_tier)} = {cmp_tier / entry:.2f}x the frames "
                                                      "(stock mode reads the same object)"),
        ]
        project(rows, "before (raw)", a.clips, cores, 1 / raw_s, raw_tier - manifest_bytes, frozen, manifest_bytes)
        project(rows, "after (compact)", a.clips, cores, 1 / cmp_s, cmp_tier - manifest_bytes, None,
                manifest_bytes)
        rows.append(("  per node: its own LMDB copies of what it built",
                     f"{human(a.clips / a.nodes * (entry + manifest_bytes))} (without a max_local_bytes budget)"))
        if a.rate_per_core:
            project(rows, a.label, a.clips, cores, a.rate_per_core, a.bytes_per_entry or 0, None,
                    manifest_bytes)
        report(f"on paper: {a.clips} clips on {a.nodes} nodes x {a.cores} cores = {cores} cores "
               f"(measured on {os.cpu_count()} shared cores of this VM)", rows)
        print("\n  Assumptions: linear scaling per core at this VM's per-core speed (one decode per core,\n"
              "  decoder_threads=1, CPU-bound: no shared-tier, network or source-read bottleneck), every clip\n"
              "  has the measured profile, nothing cached yet.  The required shared-tier write bandwidth above\n"
              "  is what the linear wall time presumes; a slower tier stretches the run to bytes / bandwidth.")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
