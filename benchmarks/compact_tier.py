"""The shared tier's compact layout (issue 17) against the raw layout, in one run.

    .venv/bin/python benchmarks/compact_tier.py [--clips DIR] [--repeat 3] [--s3 | --only-s3]

Clips: the 4 generated test clips of ``_common.clips`` (320x240 to 480x270, 4 s) and the 4 camera-like 720p /
1080p H.264 clips of ``camera_clips.py`` (10 s, 30 fps, panning textured scene with sensor noise), built with
Qwen2.5-VL defaults at 2 fps.  For each layout (``raw``: the frames' bytes, plus the MagicYUV frozen file a
stock-mode cluster also publishes; ``compact``: one MagicYUV object, which stock mode reads too):

* shared-tier bytes per entry / raw frame bytes (target <= 0.35, stock-mode files included);
* node A's write of an entry (``ensure`` from a fetched source, with the compact encode + verify) vs raw;
* node B's first read (fresh local tier: pull, decode, digest check, LMDB write) against
  - decoding and resizing the source with qwen-vl-utils ``fetch_video`` (decord, one thread; target >= 5x),
  - a plain ``fsspec`` ``cat_file`` of the same shared object(s) (target >= 0.5);
  timed twice: until ``frames()`` returns (the local copy is staged in LMDB and its commit runs behind the
  read: store/backfill.py), and until that commit is done too (``close()`` waits for it), one fresh node per
  entry; and an "epoch": one fresh node reading every entry in turn, closed at the end (every commit included),
  against a ``cat`` of all the objects in turn;
Best of ``--repeat``; a directory tier (this machine's page cache: the worst case for any fixed cost), and S3 on
a moto server over loopback with ``--s3`` (a thread of this process; ``--s3-process``: a process of
its own).  Never asserts on time.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid

import fsspec
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import clips as test_clips, report  # noqa: E402
from camera_clips import make as camera_clips  # noqa: E402

from vidcache import VideoCache, VideoOptions, keys  # noqa: E402
from vidcache.frozen_file import FORMATS  # noqa: E402
from vidcache.serving import SERVING_FORMAT  # noqa: E402

OPTS = VideoOptions(family="qwen2_5_vl", fps=2.0)


def shared_bytes(cache: VideoCache, key: str, stock: bool) -> int:
    """What the tier holds for ``key``: its frames (compact or raw) and, for a stock cluster, its frozen file."""
    m = cache.manifest(key)
    sh = cache.shared
    n = (sh.size(keys.ac(key)) or 0) + (sh.size(keys.cas(m.frames.blob)) or 0)
    frozen = sh.size(keys.frozen(key, FORMATS[SERVING_FORMAT].suffix))
    if frozen is None and stock:          # the raw layout publishes it on the first stock request
        from vidcache.sglang.frozen import published_frozen_key
        published_frozen_key(cache, key)
        frozen = sh.size(keys.frozen(key, FORMATS[SERVING_FORMAT].suffix))
    return n + (frozen or 0)


def first_read(shared: str, opts: dict, entry_keys: list[str], work: str) -> tuple[float, float]:
    """A fresh node's first read of ``entry_keys`` in turn: (until the last ``frames()`` returned, until every
    local commit is done as well)."""
    b = VideoCache(os.path.join(work, "b-" + uuid.uuid4().hex[:8]), shared=shared, shared_storage_options=opts)
    b.identity
    t = time.perf_counter()
    for key in entry_keys:
        b.frames(key)
    served = time.perf_counter() - t
    b.close()                             # waits for the local commits
    return served, time.perf_counter() - t


def best(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return min(r[0] for r in runs), min(r[1] for r in runs)


def cat(shared: str, opts: dict, cache: VideoCache, key: str) -> float:
    """A plain read of the objects a first read fetches: the manifest, and the compact object or the raw blob."""
    fs, root = fsspec.core.url_to_fs(shared, **opts)
    m = cache.manifest(key)
    compact = cache.config.shared_layout == "compact" and cache.shared.exists_many([cache.compact.key(key)])[0]
    objs = [keys.ac(key), cache.compact.key(key) if compact else keys.cas(m.frames.blob)]
    t = time.perf_counter()
    for k in objs:
        fs.cat_file(cache.shared._path(k))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clips", default=os.path.join(tempfile.gettempdir(), "vidcache-bench-clips"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--s3", action="store_true", help="also the S3 tier (moto on loopback)")
    ap.add_argument("--only-s3", action="store_true", help="the S3 tier alone")
    ap.add_argument("--s3-process", action="store_true",
                    help="moto in a process of its own (as a real endpoint is), not a thread of this one")
    args = ap.parse_args()
    sources = test_clips(os.path.join(args.clips, "test"), 4) + camera_clips(os.path.join(args.clips, "camera"))

    import qwen_vl_utils.vision_process as qvu
    qvu.get_video_reader_backend = lambda: "decord"
    torch.set_num_threads(1)

    def decode_from_source(p):
        t = time.perf_counter()
        qvu.fetch_video({"type": "video", "video": p, "fps": 2.0}, image_patch_size=14)
        return time.perf_counter() - t

    t_source = {p: min(decode_from_source(p) for _ in range(args.repeat)) for p in sources}
    tiers = ([] if args.only_s3 else [("dir", None)]) + ([("s3", "s3")] if args.s3 or args.only_s3 else [])
    work = tempfile.mkdtemp(prefix="vidcache-compact-")
    try:
        for tier_name, kind in tiers:
            ctx = contextlib.nullcontext((None, {}))
            if kind == "s3":
                from shared_tier_read import moto_s3
                ctx = moto_s3(process=args.s3_process)
            with ctx as (s3_url, s3_opts):
                rows, totals = [], {}
                for layout in ("raw", "compact"):
                    shared = (s3_url + "/" + layout) if kind == "s3" else os.path.join(work, tier_name, layout)
                    a = VideoCache(os.path.join(work, f"a-{tier_name}-{layout}"), shared=shared,
                                   shared_storage_options=s3_opts or {}, shared_layout=layout)
                    raw_b = tier_b = write_t = read_t = commit_t = cat_t = src_t = 0.0
                    entry_keys = []
                    for p in sources:
                        t = time.perf_counter()
                        key = a.ensure(p, OPTS).key
                        write_t += time.perf_counter() - t
                        entry_keys.append(key)
                        raw_b += a.manifest(key).frames.nbytes
                        tier_b += shared_bytes(a, key, stock=False)
                        # Reads before the stock-mode frozen file exists: in the raw layout a reader would
                        # expand that file (it holds the same frames) rather than pull the raw blob.
                        served, committed = best([first_read(shared, s3_opts or {}, [key], work)
                                                  for _ in range(args.repeat)])
                        read_t, commit_t = read_t + served, commit_t + committed
                        cat_t += min(cat(shared, s3_opts or {}, a, key) for _ in range(args.repeat))
                        src_t += t_source[p]
                    totals[layout] = write_t
                    epoch_served, epoch_t = best([first_read(shared, s3_opts or {}, entry_keys, work)
                                                  for _ in range(args.repeat)])
                    epoch_cat = min(sum(cat(shared, s3_opts or {}, a, k) for k in entry_keys)
                                    for _ in range(args.repeat))
                    # Last: once the raw layout's stock-mode frozen files exist, its readers expand them.
                    stock_b = sum(shared_bytes(a, k, stock=True) for k in entry_keys)
                    rows += [
                        (f"{layout}: shared bytes / raw frames (plugin cluster)", f"{tier_b / raw_b:.3f}"),
                        (f"{layout}: shared bytes / raw frames (stock cluster)", f"{stock_b / raw_b:.3f}"),
                        (f"{layout}: node B first read, total over {len(sources)} clips (served / committed)",
                         f"{read_t:.3f} s / {commit_t:.3f} s"),
                        (f"{layout}: decode+resize from source / first read (>= 5; served, committed)",
                         f"{src_t / read_t:.1f}x, {src_t / commit_t:.1f}x"),
                        (f"{layout}: fsspec cat of the same objects, total", f"{cat_t:.3f} s"),
                        (f"{layout}: fsspec cat / first read (>= 0.5; served, committed)",
                         f"{cat_t / read_t:.3f}, {cat_t / commit_t:.3f}"),
                        (f"{layout}: epoch (one node B reads all, closes) / cat of all (served, committed)",
                         f"{epoch_cat / epoch_served:.3f}, {epoch_cat / epoch_t:.3f}"),
                        (f"{layout}: node A write of all entries (fetch, decode, encode, publish)", f"{write_t:.2f} s"),
                    ]
                rows.append(("compact / raw: node A write time", f"{totals['compact'] / totals['raw']:.2f}x"))
                where = tier_name + (", moto in its own process" if kind == "s3" and args.s3_process else "")
                report(f"compact vs raw shared tier ({where}; {len(sources)} clips, Qwen2.5-VL at 2 fps; "
                       f"{os.cpu_count()} cores)", rows)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
