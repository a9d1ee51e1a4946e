"""(e) Lazy dataset init on a generated 100k-row JSONL and a 1M-row mixed parquet (image-only, video-only and
image + video rows): time, RSS and decode count (targets <= 5 s, <= 300 MB, 0).  Each init runs in a fresh
interpreter so RSS is the whole process.  Baseline for the parquet, in the same run: reading the file the way
Miles' ``read_file`` does (``iter_batches`` + ``to_pylist`` of every row), before Miles' Dataset would decode
any media."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from _common import report

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from vidcache import VideoOptions
from vidcache.dataset import LazyVideoDataset
from vidcache.identity import local_identity
t1 = time.perf_counter()
# The cache by identity (a string), as a DataLoader worker gets it: no VideoCache, so no torch.
identity = local_identity(sys.argv[2], create=True)
ds = LazyVideoDataset(sys.argv[1], identity, VideoOptions(family="qwen2_5_vl"))
rows = [ds[i] for i in range(0, len(ds), 997)]    # touch rows across the file
t2 = time.perf_counter()
assert all(h.identity == identity for r in rows for h in r.handles)
# A decode needs the decoder module (and decord); if neither was imported, nothing was decoded.
decoder_loaded = "vidcache.loader.build" in sys.modules or "decord" in sys.modules
print(json.dumps({"rows": len(ds), "init_s": t2 - t1, "import_s": t1 - t0, "decodes": 0 if not decoder_loaded else -1,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch_imported": "torch" in sys.modules, "sampled": len(rows)}))
"""


PARQUET_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from vidcache import VideoOptions
from vidcache.dataset import LazyVideoDataset
from vidcache.identity import local_identity
t1 = time.perf_counter()
identity = local_identity(sys.argv[2], create=True)
ds = LazyVideoDataset(sys.argv[1], identity, VideoOptions(family="qwen2_5_vl"), image_key="images")
t_open = time.perf_counter()
rows = [ds[i] for i in range(0, len(ds), 9973)]    # touch rows across the file (every row group)
t2 = time.perf_counter()
assert all(h.identity == identity for r in rows for h in r.handles)
assert sum(bool(r.images) for r in rows) and sum(bool(r.handles) for r in rows)
decoder_loaded = "vidcache.loader.build" in sys.modules or "decord" in sys.modules
print(json.dumps({"rows": len(ds), "init_s": t2 - t1, "open_s": t_open - t1, "import_s": t1 - t0,
                  "decodes": 0 if not decoder_loaded else -1, "sampled": len(rows),
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch_imported": "torch" in sys.modules}))
"""

MILES_READ = r"""
import json, resource, sys, time
import pyarrow.parquet as pq
t1 = time.perf_counter()
pf = pq.ParquetFile(sys.argv[1])
rows = [r for b in pf.iter_batches() for r in b.to_pylist()]      # miles.utils.data.read_file's parquet_reader
t2 = time.perf_counter()
print(json.dumps({"rows": len(rows), "init_s": t2 - t1,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _write_parquet(path: str, n: int, chunk: int = 100_000) -> None:
    """A mixed set: a third image-only, a third video-only, a third image + video (written 100k rows at a time,
    so 10 row groups of 100k, as a writer that streams rows makes them)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = pa.schema([("prompt", pa.string()), ("images", pa.list_(pa.string())),
                        ("videos", pa.list_(pa.string())), ("label", pa.string())])
    with pq.ParquetWriter(path, schema) as w:
        for start in range(0, n, chunk):
            idx = range(start, min(n, start + chunk))
            kind = [i % 3 for i in idx]
            w.write_table(pa.table({
                "prompt": [("<image>" if k != 1 else "") + ("<video>" if k != 0 else "") + f"\nQuestion {i}?"
                           for i, k in zip(idx, kind)],
                "images": [[f"images/{i:07d}.jpg"] if k != 1 else [] for i, k in zip(idx, kind)],
                "videos": [[f"s3://bucket/clips/{i:07d}.mp4"] if k != 0 else [] for i, k in zip(idx, kind)],
                "label": [str(i) for i in idx]}, schema=schema))


def parquet_case(work: str) -> None:
    path = os.path.join(work, "big.parquet")
    _write_parquet(path, 1_000_000)
    run = lambda code, *a: json.loads(subprocess.run([sys.executable, "-c", code, *a], capture_output=True,   # noqa: E731
                                                     text=True, check=True).stdout.strip().splitlines()[-1])
    lazy = run(PARQUET_CHILD, path, os.path.join(work, "cache_pq"))
    eager = run(MILES_READ, path)
    report(f"lazy dataset init ({lazy['rows']} rows, {os.path.getsize(path) / 1e6:.1f} MB parquet, mixed rows)", [
        (f"dataset init + {lazy['sampled']} row reads   [target <= 5 s]", f"{lazy['init_s']:.2f} s "
         f"(open {lazy['open_s']:.3f} s)"),
        ("process max RSS incl. interpreter [target <= 300 MB]", f"{lazy['maxrss_mb']:.0f} MB"),
        ("decodes                        [target 0]", str(lazy["decodes"])),
        ("baseline: Miles' read_file of every row (same run)", f"{eager['init_s']:.2f} s, {eager['maxrss_mb']:.0f} MB"),
        ("ratio lazy / baseline", f"{lazy['init_s'] / eager['init_s']:.3f}x time, "
                                  f"{lazy['maxrss_mb'] / eager['maxrss_mb']:.2f}x RSS"),
        ("imports (vidcache, no torch)", f"{lazy['import_s']:.2f} s; torch imported: {lazy['torch_imported']}"),
    ])


def main() -> None:
    work = tempfile.mkdtemp(prefix="vc-bench-")
    path = os.path.join(work, "big.jsonl")
    with open(path, "w") as f:
        for i in range(100_000):
            if i % 4 == 3:
                row = {"prompt": [{"role": "user", "content": [
                    {"type": "video", "video": f"s3://bucket/clips/{i}.mp4", "fps": 1.0},
                    {"type": "text", "text": f"Question {i}: what happens?"}]}], "label": str(i)}
            else:
                row = {"prompt": f"<video>\nQuestion {i}: what happens?", "videos": [f"videos/{i:06d}.mp4"],
                       "label": str(i)}
            f.write(json.dumps(row) + "\n")
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, path, os.path.join(work, "cache")], capture_output=True,
                         text=True, check=True)
    wall = time.perf_counter() - t
    r = json.loads(out.stdout.strip().splitlines()[-1])
    report(f"lazy dataset init ({r['rows']} rows, {os.path.getsize(path) / 1e6:.1f} MB JSONL)", [
        ("dataset init + 101 row reads   [target <= 5 s]", f"{r['init_s']:.2f} s"),
        ("process max RSS incl. interpreter [target <= 300 MB]", f"{r['maxrss_mb']:.0f} MB"),
        ("decodes                        [target 0]", str(r["decodes"])),
        ("imports (vidcache, no torch)", f"{r['import_s']:.2f} s; torch imported: {r['torch_imported']}"),
        ("child process wall time", f"{wall:.2f} s"),
    ])
    parquet_case(work)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
