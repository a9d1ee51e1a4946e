"""What integrity and durability cost on the hot paths.

    .venv/bin/python benchmarks/verify_cost.py [--nframes 16] [--reads 50] [--batch 8] [--repeat 5]

1. Reads: ``frames(key)`` from LMDB (warm page cache, one process) with ``verify_reads="always"`` (the blob's
   xxh3-128 digest on every read) vs ``verify_reads="never"``; the default ``"first"`` checks once per
   process, then costs what ``never`` does.  Into a new tensor, and into a reused one (``out=``), where
   the copy is cheapest and the digest's share largest.
2. LMDB durability checkpoint: LMDB runs with ``sync=False``; ``cache.sync()`` (``env.sync``, an
   fdatasync) after a batch of ``--batch`` entry-sized writes vs the same batch without it.
3. The shared directory tier's publish (``publish_bytes``: temp file, fsync, rename, fsync of the
   directory) vs the same with ``fsync=False``, per object of the same size.

Never asserts on time; reads: medians of interleaved single reads; writes: best of ``--repeat``.  Disk figures are this VM's virtual disk, shared with others.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import torch

from _common import best_of, report
from vidcache import VideoCache, VideoOptions
from vidcache import keys
from vidcache.digest import Digest
from vidcache.store.publish import publish_bytes
from vidcache.testing.videos import make_video


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nframes", type=int, default=16, help="frames per entry (16 at 644x364 = 11.3 MB)")
    ap.add_argument("--reads", type=int, default=50, help="reads per timed round")
    ap.add_argument("--batch", type=int, default=8, help="writes per durability checkpoint")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="vc-bench-")
    try:
        src = make_video(os.path.join(work, "clip.mp4"), codec="h264", width=640, height=360, fps=30,
                         n_frames=max(30, a.nframes), seed=1)
        always = VideoCache(os.path.join(work, "c"), verify_reads="always")
        key = always.ensure(src, VideoOptions(family="qwen2_5_vl", nframes=a.nframes)).key
        never = always.with_settings(verify_reads="never")       # same directory, same LMDB environment
        m = always.require_manifest(key)
        nbytes = m.frames.nbytes
        buf = torch.empty(m.frames.shape, dtype=torch.uint8)
        assert torch.equal(always.frames(key), never.frames(key))

        # Single reads, interleaved (never, always, ...), so bursts of load from other processes on this
        # shared machine hit every variant alike; medians of --reads x --repeat reads each.
        variants = {"never": (never, None), "always": (always, None), "never_out": (never, buf),
                    "always_out": (always, buf)}
        samples = {name: [] for name in variants}
        for _ in range(a.reads * a.repeat):
            for name, (cache, out) in variants.items():
                t0 = time.perf_counter()
                cache.frames(key, out=out)       # a new tensor is dropped at once: the allocator reuses it
                samples[name].append(time.perf_counter() - t0)
        t = {name: statistics.median(v) for name, v in samples.items()}
        with always.read_frames(key) as v:
            hs = []
            for _ in range(a.reads):
                t0 = time.perf_counter()
                Digest.of(v)
                hs.append(time.perf_counter() - t0)
            t_hash = statistics.median(hs)
        gbs = lambda s: f"{nbytes / s / 1e9:.1f} GB/s"   # noqa: E731
        report(f"read path: digest check on every read vs none ({tuple(m.frames.shape)} uint8 = "
               f"{nbytes / 1e6:.1f} MB; medians of {a.repeat * a.reads} reads each)", [
            ("frames(key), verify_reads='never' (= 'first' after 1st)", f"{t['never'] * 1e3:.2f} ms  ({gbs(t['never'])})"),
            ("frames(key), verify_reads='always'", f"{t['always'] * 1e3:.2f} ms  ({gbs(t['always'])})"),
            ("cost of checking, new tensor: always / never", f"{t['always'] / t['never']:.2f}x"),
            ("frames(key, out=buf), 'never'", f"{t['never_out'] * 1e3:.2f} ms  ({gbs(t['never_out'])})"),
            ("frames(key, out=buf), 'always'", f"{t['always_out'] * 1e3:.2f} ms  ({gbs(t['always_out'])})"),
            ("cost of checking, reused buffer: always / never", f"{t['always_out'] / t['never_out']:.2f}x"),
            ("  added per read: always - never (reused buffer)",
             f"{(t['always_out'] - t['never_out']) * 1e3:.2f} ms"),
            ("xxh3-128 of the mapped blob alone", f"{t_hash * 1e3:.2f} ms  ({gbs(t_hash)})"),
        ])

        # --- 2. LMDB durability checkpoint --------------------------------------------------------
        dur = VideoCache(os.path.join(work, "durability"))
        rng = np.random.default_rng(0)
        payloads = [rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes() for _ in range(2)]
        n = [0]

        def batch() -> float:               # entry-sized writes: one transaction each, as ensure() does
            t0 = time.perf_counter()
            for _ in range(a.batch):
                n[0] += 1
                dur.local.set_many({f"cas/bench{n[0]}": payloads[n[0] % 2],
                                    f"ac/bench{n[0]}": b'{"manifest": "stand-in"}'})
            return time.perf_counter() - t0

        def timed_sync() -> float:
            t0 = time.perf_counter()
            dur.sync()
            return time.perf_counter() - t0
        batch()
        dur.sync()                           # warm: map grown, earlier pages on disk
        def drop() -> None:                  # untimed: free the pages for reuse, so the file stays small
            for k in list(dur.local.keys("cas/bench")) + list(dur.local.keys("ac/bench")):
                dur.local.delete(k)
            dur.sync()
        b_nosync = b_sync = s_only = s_each = float("inf")
        for _ in range(a.repeat):
            drop()
            b_nosync = min(b_nosync, batch())
            drop()                           # (untimed: leaves nothing dirty for the next round)
            tb = batch()
            ts = timed_sync()
            b_sync, s_only = min(b_sync, tb + ts), min(s_only, ts)
            t0 = time.perf_counter()         # the alternative: a checkpoint after every write
            for _ in range(a.batch):
                n[0] += 1
                dur.local.set_many({f"cas/bench{n[0]}": payloads[n[0] % 2]})
                dur.sync()
            s_each = min(s_each, time.perf_counter() - t0)
        drop()
        mb = a.batch * nbytes / 1e6
        report(f"LMDB durability checkpoint: cache.sync() after a batch of {a.batch} writes "
               f"({mb:.0f} MB; best of {a.repeat})", [
            ("batch of writes, no sync (LMDB sync=False)", f"{b_nosync * 1e3:.1f} ms  ({b_nosync / a.batch * 1e3:.2f} ms/write)"),
            ("batch of writes + one cache.sync()", f"{b_sync * 1e3:.1f} ms"),
            ("  the cache.sync() alone", f"{s_only * 1e3:.1f} ms per sync  ({s_only / b_nosync:.2f}x the batch's "
                                         "write time)"),
            ("  relative: (batch + sync) / batch", f"{b_sync / b_nosync:.2f}x"),
            (f"a sync after each of the {a.batch} writes (for contrast)",
             f"{s_each * 1e3:.1f} ms  ({s_each / b_nosync:.2f}x the unsynced batch)"),
        ])

        # --- 3. publish on the shared directory tier ---------------------------------------------
        shared = os.path.join(work, "shared")
        os.makedirs(shared)
        m_ = [0]

        def publish(fsync: bool):
            def go():
                for _ in range(a.batch):
                    m_[0] += 1
                    publish_bytes(os.path.join(shared, keys.CAS.rstrip("/"), f"{m_[0] % 256:02x}",
                                               f"obj{m_[0]}"), payloads[m_[0] % 2], fsync=fsync)
            return go
        publish(True)()
        p_sync = p_nosync = float("inf")
        for _ in range(a.repeat):
            p_nosync = min(p_nosync, best_of(publish(False), 1))
            os.sync()                        # untimed: the unsynced round's dirty pages, not the next round's
            p_sync = min(p_sync, best_of(publish(True), 1))
            shutil.rmtree(os.path.join(shared, "cas"))
            os.sync()
        report(f"shared directory tier: publish_bytes of {a.batch} objects of {nbytes / 1e6:.1f} MB "
               f"(best of {a.repeat})", [
            ("fsync=False (temp file + rename)", f"{p_nosync / a.batch * 1e3:.1f} ms/object"),
            ("fsync=True  (+ fsync file and directory; the default)", f"{p_sync / a.batch * 1e3:.1f} ms/object"),
            ("cost of durability: fsync / no fsync", f"{p_sync / p_nosync:.2f}x"),
        ])
        always.close()
        dur.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
