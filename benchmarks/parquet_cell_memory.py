"""D45: the memory to read one video held as bytes from a parquet file of many such rows in one row group.

The issue's case: 40 rows of 25 MiB (random bytes: a video does not compress), one row group, pyarrow's default
writer (dictionary encoding on, so every value lands in one dictionary page) under each codec.  Each read runs in a
fresh interpreter.  Printed: its peak RSS (``VmHWM``, reset just before the read) less its RSS before the read, and
beside it the whole process's ``ru_maxrss`` (which also keeps the imports' peak, so it cannot be reset; the file is
written by a process of its own, since a child inherits its parent's ``ru_maxrss``).  The read
is ``LazyVideoDataset[i]`` of the last row, as the code reads it now (``parquet_cells``) and as it read it before
(pyarrow's batches alone, ``CELL_BYTES`` set past every row); with ``--plan``, also one ``plan`` of the whole file
(prewarm's first pass over it).

    python benchmarks/parquet_cell_memory.py [--rows 40] [--mib 25] [--codecs none,snappy,zstd,gzip] [--plan]
                                             [--layout flat|list]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys
import vidcache.prompt_files as dataset
from vidcache import VideoOptions
from vidcache.dataset import LazyVideoDataset
path, mode, what = sys.argv[1:4]
if mode == "before":
    dataset.CELL_BYTES = 1 << 62          # no column is read a cell at a time: pyarrow's batches, as before D45
ds = LazyVideoDataset(path, "0" * 16, VideoOptions())


def hwm():
    # The process's peak RSS in KiB: what ru_maxrss reports, but resettable (ru_maxrss also keeps the peak of
    # threads that exited, here the imports', which is above what one read adds)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


with open("/proc/self/clear_refs", "w") as f:    # reset the high-water mark just before the read
    f.write("5")
base = hwm()
if what == "row":
    row = ds[len(ds) - 1]
    assert row.inline, "the row holds no inline video"
    size = max(len(b.data) for b in row.inline.values())
else:
    from vidcache.planning import plan
    tasks, bad = plan(path, VideoOptions())
    assert not bad, bad
    size = max(t.source.size for t in tasks)
peak = hwm()
import resource
print(json.dumps({"base_mib": base / 1024, "peak_mib": peak / 1024, "read_mib": (peak - base) / 1024,
                  "cell_mib": size / 2**20,
                  "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write(path: str, rows: int, mib: float, codec: str, layout: str = "flat") -> None:
    """``layout``: ``flat``, a binary column; ``list``, Miles' rows (``"videos": [bytes]``, a list column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    size = int(mib * 2**20)
    videos = [os.urandom(size) for _ in range(rows)]
    table = pa.table({"prompt": ["<video> what happens?"] * rows,
                      "videos": pa.array(videos, pa.binary()) if layout == "flat" else
                      pa.array([[v] for v in videos], pa.list_(pa.binary()))})
    pq.write_table(table, path, compression=codec, row_group_size=rows)    # the default writer otherwise


def measure(path: str, mode: str, what: str = "row") -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", CHILD, path, mode, what], capture_output=True, text=True, env=env,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def write_apart(path: str, rows: int, mib: float, codec: str, layout: str = "flat") -> None:
    """``write`` in a process of its own: a child inherits its parent's ``ru_maxrss`` (Linux keeps it across fork
    and exec), so the parent that starts the measured children must never hold the table."""
    subprocess.run([sys.executable, os.path.abspath(__file__), "--write", path, "--rows", str(rows), "--mib",
                    str(mib), "--codecs", codec, "--layout", layout], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--mib", type=float, default=25)
    ap.add_argument("--codecs", default="none,snappy,zstd,gzip")
    ap.add_argument("--plan", action="store_true", help="also measure plan() over the whole file")
    ap.add_argument("--layout", choices=("flat", "list"), default="flat",
                    help="the videos as a binary column (flat) or as Miles' rows write them, a list of bytes (list)")
    ap.add_argument("--write", metavar="PATH", help=argparse.SUPPRESS)      # write_apart's child
    args = ap.parse_args()
    if args.write:
        return write(args.write, args.rows, args.mib, args.codecs, args.layout)
    print(f"{args.rows} rows x {args.mib:g} MiB ({args.layout} column), one row group, pyarrow's default writer; "
          "MiB added by the read (peak RSS less RSS before it)")
    print(f"{'codec':8} {'what':5} {'before':>9} {'after':>9} {'ratio':>7} {'after/cell':>10}   "
          "whole process's ru_maxrss, before -> after (imports included)")
    with tempfile.TemporaryDirectory() as d:
        for codec in args.codecs.split(","):
            path = os.path.join(d, f"{codec}.parquet")
            write_apart(path, args.rows, args.mib, codec, args.layout)
            for what in ("row", "plan") if args.plan else ("row",):
                before, after = measure(path, "before", what), measure(path, "after", what)
                print(f"{codec:8} {what:5} {before['read_mib']:9.0f} {after['read_mib']:9.0f} "
                      f"{before['read_mib'] / max(after['read_mib'], 1):6.1f}x "
                      f"{after['read_mib'] / after['cell_mib']:10.2f}   "
                      f"{before['maxrss_mib']:.0f} -> {after['maxrss_mib']:.0f}", flush=True)
            os.unlink(path)


if __name__ == "__main__":
    main()
