"""How each command's cost grows with the number of entries (issue 50), on a node-local tier behind a directory
shared tier, both holding ``n`` entries.

    nice .venv/bin/python benchmarks/scale.py [--sizes 1000,10000,100000] [--work DIR]

Entries are small (2 frames of 28x28) but written through the cache's write path: one real clip is decoded once
(``decode_sample_resize``, for its ``Built`` record), then each entry is the ``ensure`` write of that clip's
frames with its first bytes changed per entry, under the key of a source file of its own (``build_manifest``;
manifest, blob and source record set through the tiered store as ``ensure`` sets them, in the shared tier's raw
layout: see ``fill``).  So each entry has a distinct blob, a distinct source and a sealed manifest,
and ``prewarm`` / ``pull`` find the entries by their sources as they would after a real prewarm.

Each command runs as a user runs it, ``python -m vidcache.cli`` in a process of its own; its wall time and the
process's peak RSS (``VmHWM``) are recorded, and for ``ls`` the time to its first line too.  In order, per size:
``ls`` (first line, whole), ``stats``, ``verify`` (every entry of both tiers), ``prewarm`` re-run with every entry
cached (its planning only: no decode), ``pull`` of 1% of the rows and of all of them on fresh nodes, ``gc`` to
half the local tier's bytes, and ``LazyVideoDataset`` init on the rows.  The growth from one size to the next is
printed as the exponent k of time ~ n^k (k near 1: O(n); near 2: O(n^2)).  Never asserts on time.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def fill(node: str, shared: str, src_dir: str, n: int, data: str) -> tuple[float, int]:
    """``n`` entries in both tiers and a JSONL of one row per source; the seconds it took, the frame bytes."""
    import numpy as np
    import torch

    from vidcache import VideoCache, VideoOptions, keys
    from vidcache.digest import Digest
    from vidcache.loader.build import decode_sample_resize
    from vidcache.loader.fetch import fingerprint
    from vidcache.manifest import SourceRecord, build_manifest
    from vidcache.testing.videos import make_video

    t0 = time.perf_counter()
    opts = VideoOptions()
    os.makedirs(src_dir, exist_ok=True)
    clip = make_video(os.path.join(src_dir, "template.mp4"), width=28, height=28, fps=2, n_frames=4, seed=0)
    frames, built = decode_sample_resize(clip, opts)
    base = frames.numpy().copy()
    # The raw shared layout (frames as they are, no compact object): a compact object per entry costs an encode
    # that would make 10^5 entries take hours on two cores; the commands measured read both layouts alike but
    # for verify, which decodes each compact object (its per-entry cost is measured at small n in verify_cost.py).
    c = VideoCache(node, shared=shared, shared_layout="raw")
    batch: dict = {}
    with open(data, "w") as rows:
        for i in range(n):
            src = os.path.join(src_dir, f"s{i:07d}.mp4")
            with open(src, "wb") as f:
                f.write(b"vidcache scale source %d\n" % i)
            with open(src, "rb") as f:
                digest = Digest.of(f.read())
            fr = base.copy()
            fr.reshape(-1)[:8] = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)   # a blob of its own
            raw = memoryview(fr).cast("B")
            blob = Digest.of(raw)
            key = keys.cache_key(digest, opts)
            man = build_manifest(key, digest, opts, blob, tuple(fr.shape), c.config.encoding, built,
                                 {"created_unix": round(time.time(), 3)})
            record = {keys.src(src): SourceRecord.of(src, fingerprint(src, c.config.limits), digest).to_json()}
            items = {keys.cas(str(blob)): man.frames.encode(raw), keys.ac(key): man.to_json(), **record}
            batch.update(items)
            if len(batch) >= 3000:                    # a few transactions, as prewarm's workers commit
                c.store.set_many(batch)               # both tiers: the shared one first, LMDB in one transaction
                batch = {}
            rows.write(json.dumps({"prompt": "<video>", "videos": [src]}) + "\n")
    if batch:
        c.store.set_many(batch)
    c.close()
    return time.perf_counter() - t0, n * base.nbytes


# ``vidcache ARGS`` as ``python -m vidcache.cli`` runs it, then the process's peak RSS (VmHWM: per address space,
# so not the parent's, which ``ru_maxrss`` carries over exec) on stderr's last line.
CLI_CHILD = r"""
import runpy, sys
sys.argv = ["vidcache"] + sys.argv[1:]
try:
    runpy.run_module("vidcache.cli", run_name="__main__")
finally:
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
    sys.stderr.write("\nscale-hwm-kb %s\n" % hwm)
"""


def run(args: list[str], env: dict) -> dict:
    """``vidcache ARGS`` in a process of its own: wall seconds, peak RSS (MB), seconds to its first line of output."""
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", CLI_CHILD, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=ROOT)
    first = None
    lines = 0
    for _ in p.stdout:
        lines += 1
        if first is None:
            first = time.perf_counter() - t0
    err = p.stderr.read()
    p.wait()
    wall = time.perf_counter() - t0
    if p.returncode not in (0,) and not (args[0] == "verify" and p.returncode == 1):
        raise SystemExit(f"scale.py: vidcache {' '.join(args)} failed ({p.returncode}): {err.decode()[-2000:]}")
    hwm = int(err.decode().rsplit("scale-hwm-kb", 1)[1].split()[0])
    return {"s": wall, "rss_mb": hwm / 1024, "first_s": first, "lines": lines}


DATASET_CHILD = r"""
import json, sys, time
from vidcache import VideoOptions
from vidcache.dataset import LazyVideoDataset
from vidcache.identity import local_identity
t = time.perf_counter()
ds = LazyVideoDataset(sys.argv[1], local_identity(sys.argv[2], create=True), VideoOptions())
n = len(ds); ds[n - 1]
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"s": time.perf_counter() - t, "rss_mb": int(hwm) / 1024}))
"""


def one_size(work: str, n: int) -> dict:
    d = os.path.join(work, f"n{n}")
    shutil.rmtree(d, ignore_errors=True)
    node, shared, data = os.path.join(d, "node"), os.path.join(d, "tier"), os.path.join(d, "rows.jsonl")
    out = {}
    out["fill_s"], frame_bytes = fill(node, shared, os.path.join(d, "src"), n, data)
    env = {**os.environ, "PYTHONPATH": ROOT, "VIDCACHE_DIR": node, "VIDCACHE_SHARED": shared}
    ls = run(["ls"], env)
    out["ls first line"] = {"s": ls["first_s"], "rss_mb": ls["rss_mb"]}
    out["ls"] = ls
    out["stats"] = run(["stats", "--json"], env)
    out["verify"] = run(["verify"], env)
    out["prewarm re-run"] = run(["prewarm", data, "--no-progress"], env)
    head = os.path.join(d, "rows-1pct.jsonl")
    with open(data) as f, open(head, "w") as g:
        for i, line in zip(range(max(1, n // 100)), f):
            g.write(line)
    out["pull 1%"] = run(["pull", head], {**env, "VIDCACHE_DIR": os.path.join(d, "fresh1")})
    out["pull all"] = run(["pull", data], {**env, "VIDCACHE_DIR": os.path.join(d, "fresh2")})
    out["gc to half"] = run(["gc", "--max-local-bytes", str(max(1, frame_bytes // 2))], env)
    r = subprocess.run([sys.executable, "-c", DATASET_CHILD, data, os.path.join(d, "ds-node")], env=env, cwd=ROOT,
                       capture_output=True, text=True, check=True)
    out["LazyVideoDataset init"] = json.loads(r.stdout)
    shutil.rmtree(d, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000", help="entry counts, comma-separated")
    ap.add_argument("--work", help="working directory (default: a temporary one, removed)")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    work = args.work or tempfile.mkdtemp(prefix="vidcache-scale-")
    try:
        res = {}
        for n in sizes:
            res[n] = one_size(work, n)
            print(f"n={n}: " + json.dumps({k: (round(v, 2) if isinstance(v, float) else
                                               {a: round(b, 2) for a, b in v.items() if isinstance(b, float)})
                                           for k, v in res[n].items()}), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        rows = []
        for cmd in [k for k in res[sizes[0]] if k != "fill_s"]:
            cells = [f"{res[n][cmd]['s']:.2f} s / {res[n][cmd]['rss_mb']:.0f} MB" for n in sizes]
            ks = [math.log(max(res[b][cmd]["s"], 1e-3) / max(res[a][cmd]["s"], 1e-3)) / math.log(b / a)
                  for a, b in zip(sizes, sizes[1:])]
            rows.append((cmd, " | ".join(cells) + ("   k=" + ", ".join(f"{k:.2f}" for k in ks) if ks else "")))
        rows.append(("writing the entries", " | ".join(f"{res[n]['fill_s']:.0f} s" for n in sizes)))
        report(f"scale: time / peak RSS at n = {', '.join(map(str, sizes))} ({os.cpu_count()} cores)", rows)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
