"""A plugin node's first read of a compact S3 entry (the SGLang plugin's ``load_ref``) vs ``frames(key)`` on a
fresh node, in the same run (issue 30: the plugin's read did not stream before).

    .venv/bin/python benchmarks/plugin_first_read.py [--entries 4] [--repeat 5]

Node A builds ``--entries`` entries from generated 640x360 h264 clips into S3 on a moto server in a process
of its own (compact layout: one MagicYUV object per entry).  Then, ``--repeat`` rounds, interleaved: a fresh
node directory reads every entry once through ``VideoCache.frames(key)``, and another fresh one through the
plugin's ``load_ref`` (its node cache from ``VIDCACHE_DIR`` / ``VIDCACHE_SHARED``, as in an SGLang server).
Both fetch the manifest and the object side by side and decode the object as it arrives.  Best of
``--repeat``; the ratio should be 1.0 within noise.  Never asserts on time.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import fsspec

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import report  # noqa: E402
from shared_tier_read import moto_s3  # noqa: E402

from vidcache import VideoCache, VideoOptions, node  # noqa: E402
from vidcache.testing.videos import make_video  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    from vidcache.sglang.plugin.qwen_vl import load_ref
    opts = VideoOptions(nframes=8)
    with tempfile.TemporaryDirectory() as work, moto_s3(process=True) as (shared, so):
        # The plugin's cache comes from the environment, so the endpoint goes into fsspec's own configuration
        # (both readers see the same one).
        fsspec.config.conf.setdefault("s3", {}).update(so)
        sources = [make_video(os.path.join(work, f"c{i}.mp4"), codec="h264", width=640, height=360, fps=30,
                              n_frames=90, seed=i) for i in range(a.entries)]
        node_a = VideoCache(os.path.join(work, "a"), shared=shared)
        ekeys = [node_a.ensure(s, opts).key for s in sources]
        tier = node_a.identity
        nbytes = sum(node_a.require_manifest(k).frames.nbytes for k in ekeys)
        node_a.close()

        def by_frames(i: int) -> float:
            b = VideoCache(os.path.join(work, f"f{i}"), shared=shared)
            b.local.exists_many(["meta/open"])        # the LMDB environment opened outside the timing
            t = time.perf_counter()
            for k in ekeys:
                b.frames(k)
            d = time.perf_counter() - t
            b.close()
            return d

        def by_plugin(i: int) -> float:
            os.environ["VIDCACHE_DIR"], os.environ["VIDCACHE_SHARED"] = os.path.join(work, f"p{i}"), shared
            c = node.node_cache()
            c.local.exists_many(["meta/open"])
            t = time.perf_counter()
            for k in ekeys:
                load_ref({"tier": tier, "key": k})
            d = time.perf_counter() - t
            c.close()
            return d

        best_f = best_p = float("inf")
        for i in range(a.repeat):
            best_f = min(best_f, by_frames(i))
            best_p = min(best_p, by_plugin(i))
        report("a plugin node's first read vs frames(key), S3 on moto (own process)", [
            ("entries, frame bytes", f"{a.entries}, {nbytes / 2**20:.1f} MiB"),
            ("fresh node, frames(key), first read of all", f"{best_f * 1e3:8.1f} ms"),
            ("fresh node, plugin load_ref, first read of all", f"{best_p * 1e3:8.1f} ms"),
            ("ratio plugin / frames(key)", f"{best_p / best_f:.2f}"),
        ])


if __name__ == "__main__":
    main()
