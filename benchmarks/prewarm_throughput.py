"""(a) prewarm, 1 worker, vs bare qwen-vl-utils fetch_video on the same videos (target overhead <= 1.2x);
(b) prewarm with 2 workers vs 1 (target >= 1.7x).  All runs in this process, on the same files."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile

import torch

from _common import best_of, clips, report
from vidcache import VideoCache, VideoOptions
from vidcache.prewarming import prewarm


def _spin(n: int) -> None:
    s = 0
    for i in range(n):
        s += i * i


def cpu_ceiling(n: int = 20_000_000) -> float:
    """How much faster 2 CPU-bound processes finish than 1 on this machine (2.0 on two free cores)."""
    import multiprocessing as mp

    def run(k):
        ps = [mp.get_context("fork").Process(target=_spin, args=(n // k,)) for _ in range(k)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
    return best_of(lambda: run(1), 2) / best_of(lambda: run(2), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--videos", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="vc-bench-")
    paths = clips(os.path.join(work, "v"), a.videos)
    ds = os.path.join(work, "d.jsonl")
    with open(ds, "w") as f:
        for p in paths:
            f.write(json.dumps({"prompt": "<video>", "videos": [p]}) + "\n")

    import qwen_vl_utils.vision_process as qvu
    qvu.get_video_reader_backend = lambda: "decord"
    torch.set_num_threads(1)      # the same single intra-op thread a prewarm worker uses

    def bare():
        for p in paths:
            qvu.fetch_video({"type": "video", "video": p}, image_patch_size=14)

    n_runs = [0]

    def run(workers):
        def go():
            # A new directory per run: LMDB environments are shared per path within a process, so a
            # directory removed and re-created under an open environment would still serve its old entries.
            n_runs[0] += 1
            d = os.path.join(work, f"cache{workers}-{n_runs[0]}")
            cache = VideoCache(d)
            s = prewarm(ds, cache, VideoOptions(), workers=workers, progress=False)
            assert s.new == len(paths) and s.failed == 0, s
            cache.close()
            shutil.rmtree(d, ignore_errors=True)
        return go

    t_bare = best_of(bare, a.repeat)
    t1 = best_of(run(1), a.repeat)
    t2 = best_of(run(2), a.repeat)
    ceiling = cpu_ceiling()
    report(f"prewarm throughput ({a.videos} clips, 320x240..480x270, 4 s each; {os.cpu_count()} cores)", [
        ("bare fetch_video (decord, 1 thread)", f"{t_bare:.2f} s  ({a.videos / t_bare:.2f} videos/s)"),
        ("prewarm --workers 1", f"{t1:.2f} s  ({a.videos / t1:.2f} videos/s)"),
        ("prewarm --workers 2", f"{t2:.2f} s  ({a.videos / t2:.2f} videos/s)"),
        ("(a) overhead: prewarm 1 worker / bare  [target <= 1.2]", f"{t1 / t_bare:.2f}x"),
        ("(b) speed-up: 2 workers vs 1          [target >= 1.7]", f"{t1 / t2:.2f}x"),
        ("    machine ceiling: 2 pure-CPU processes vs 1", f"{ceiling:.2f}x"),
    ])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
