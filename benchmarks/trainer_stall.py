"""Trainer stall on a fresh node, with and without read-ahead (issue 31), in one run.

    .venv/bin/python benchmarks/trainer_stall.py [--clips 128] [--batch 2] [--depth 8] [--step-factor 1.5] [--thread-moto]

A node A prewarms ``--clips`` clips (the camera-like 1280x720 H.264 clips of ``camera_clips.py`` and the
generated test clips, Qwen2.5-VL at 2 fps) into an S3 tier: moto on loopback in a process of its own, as a
real endpoint is.  Then a trainer loop on a *fresh* node directory consumes one batch of ``--batch`` samples per
step: it reads each sample's frames (``h.frames()``, what ``train_inputs`` reads), then "trains" for ``step_s``
(a sleep: the GPU's time, when the host's cores are free).  The wait is the time from the start of a step until
its batch's frames are in hand.

``step_s`` is set where the stall without read-ahead is large: ``--step-factor`` times the mean time a batch's
first reads take on a fresh node (measured first, on a node of its own), so that without read-ahead about
1 / (1 + factor) of the wall time is spent waiting (40% at 1.5).  Both loops then run, each on a fresh node:

* without: every first read pulls from S3 (download + decode of the compact object) when the trainer asks;
* with: ``vidcache.read_ahead(samples, depth=--depth)`` pulls the next samples' entries in the background.

Prints, per loop, the wait per step (p50 / p99) and the fraction of the wall time spent waiting, over every step
(the headline: the first step is counted, and nothing can be ahead of it when read-ahead starts with the loop)
and over the steps after the first (the steady state; Miles' data source starts reading ahead when it is built,
before the first rollout).  The last line reads ``stall: X% with read-ahead, Y% without``.  Never asserts on time.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import clips as test_clips, report  # noqa: E402
from camera_clips import make as camera_clips  # noqa: E402
from shared_tier_read import moto_s3  # noqa: E402

import vidcache  # noqa: E402
from vidcache import VideoCache, VideoOptions  # noqa: E402

OPTS = VideoOptions(family="qwen2_5_vl", fps=2.0)


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def run_loop(node: str, shared: str, s3: dict, ekeys: list[str], batch: int, step_s: float, ahead: bool,
             depth: int = 0) -> dict:
    c = VideoCache(node, shared=shared, shared_storage_options=s3)
    samples = [[vidcache.from_key(k, c)] for k in ekeys]
    ra = vidcache.read_ahead(samples, depth=depth) if ahead else None
    source = iter(ra) if ra is not None else iter(samples)
    waits = []
    t_start = time.perf_counter()
    for _ in range(0, len(samples), batch):
        t = time.perf_counter()
        for _ in range(batch):
            (h,) = next(source)
            h.frames()
        waits.append(time.perf_counter() - t)
        time.sleep(step_s)                          # the training step
    wall = time.perf_counter() - t_start
    counts = dict(ra.counts) if ra is not None else None
    if ra is not None:
        ra.close()
    c.close()
    return {"waits": waits, "wall": wall, "stall": sum(waits) / wall, "counts": counts,
            "steady": sum(waits[1:]) / (wall - waits[0] - step_s) if len(waits) > 1 else float("nan")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=128, help="entries in the tier (and samples in the epoch)")
    ap.add_argument("--depth", type=int, default=8, help="samples read ahead (default: four batches of 2)")
    ap.add_argument("--batch", type=int, default=2, help="samples per step")
    ap.add_argument("--step-factor", type=float, default=1.5,
                    help="step time / a batch's first-read time without read-ahead")
    ap.add_argument("--thread-moto", action="store_true", help="moto in a thread of this process instead")
    ap.add_argument("--work", help="working directory (default: a temporary one, removed)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="vidcache-stall-")
    try:
        cams = camera_clips(os.path.join(work, "camera"))
        n_small = max(0, args.clips - len(cams))
        sources = (cams + test_clips(os.path.join(work, "clips"), n_small))[:args.clips]
        with moto_s3(process=not args.thread_moto) as (shared, s3):
            a = VideoCache(os.path.join(work, "node-a"), shared=shared, shared_storage_options=s3)
            ekeys = [a.ensure(p, OPTS).key for p in sources]
            nbytes = sum(a.manifest(k).frames.nbytes for k in ekeys)
            a.close()
            # Spread the big clips over the epoch, as a shuffled sampler would (one in every len/4 samples).
            big, small = ekeys[:len(cams)], ekeys[len(cams):]
            every = max(1, len(ekeys) // max(1, len(big)))
            order = []
            for i in range(len(ekeys)):
                src = big if (i % every == 0 and big) or not small else small
                order.append(src.pop(0))
            ekeys = order
            # Calibrate: a batch's first reads on a fresh node, no read-ahead, no step.
            cal = run_loop(os.path.join(work, "node-cal"), shared, s3, ekeys, args.batch, 0.0, ahead=False)
            step_s = args.step_factor * statistics.mean(cal["waits"])
            out = {}
            for name, ahead in (("without", False), ("with", True)):
                out[name] = run_loop(os.path.join(work, f"node-{name}"), shared, s3, ekeys, args.batch, step_s, ahead,
                                     args.depth)
        rows = [("entries / frame bytes", f"{len(ekeys)} / {nbytes / 1e6:.0f} MB (S3 on moto, "
                 f"{'a thread' if args.thread_moto else 'its own process'})"),
                ("batch / steps / read-ahead depth", f"{args.batch} / {len(out['with']['waits'])} / {args.depth}"),
                ("a batch's first reads (calibration, mean)", f"{statistics.mean(cal['waits']) * 1e3:.0f} ms"),
                ("step time (simulated training)", f"{step_s * 1e3:.0f} ms")]
        for name in ("without", "with"):
            r = out[name]
            rows += [(f"{name} read-ahead: wait per step p50 / p99",
                      f"{pct(r['waits'], .5) * 1e3:.1f} / {pct(r['waits'], .99) * 1e3:.1f} ms"),
                     (f"{name} read-ahead: wall time spent waiting", f"{100 * r['stall']:.1f}% of {r['wall']:.1f} s"),
                     (f"{name} read-ahead: the same after the first step", f"{100 * r['steady']:.1f}%")]
        rows.append(("read-ahead's pulls", str(out["with"]["counts"])))
        report(f"trainer stall on a fresh node ({os.cpu_count()} cores)", rows)
        print(f"stall: {100 * out['with']['stall']:.1f}% with read-ahead, {100 * out['without']['stall']:.1f}% without")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
