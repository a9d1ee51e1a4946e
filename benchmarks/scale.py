"""How each command's cost grows with the number of entries (issue 50): a node-local tier alone, and behind a
shared tier as a directory and as S3 (moto's server on loopback, in a process of its own), each holding ``n``
entries.

    nice .venv/bin/python benchmarks/scale.py [--sizes 1000,10000,100000] [--tiers local,dir,s3] [--limit 900]
        [--json out.json] [--baseline] [--cold] [--nframes N]

Entries are small (8 frames of 28x28, 37.6 kB; ``OPTION_FLAGS``) but written through the cache's write path: one
real clip is decoded once
(``decode_sample_resize``, for its ``Built`` record), then each entry is the ``ensure`` write of that clip's
frames with its first bytes changed per entry, under the key of a source file of its own (``build_manifest``;
manifest, blob and source record set through the stores as ``ensure`` sets them: the shared tier first, in its
raw layout, then LMDB: see ``fill``).  So each entry has a distinct blob, a distinct source and a sealed
manifest, and ``prewarm`` / ``pull`` find the entries by their sources as they would after a real prewarm.

Each command runs as a user runs it, ``python -m vidcache.cli`` in a process of its own; its wall time, its
private memory (RssAnon) at exit and its peak (sampled every 20 ms, summed over its process tree: its forked walk
and any workers), and its peak RSS (``VmHWM``, which counts the LMDB pages it touched: file-backed, reclaimable)
are recorded, and for ``ls`` the time to its first entry's line too.  Per tier and size: ``ls`` (first entry, whole),
``stats``, ``verify`` (every entry; with a shared tier, ``verify --shared``: every entry of the shared tier) and
``verify --sample 100``, ``prewarm`` re-run with every entry cached (its planning only: no decode), ``pull`` of
1% of the rows and of all of them on fresh nodes (shared tiers), ``gc`` to half the local tier's bytes, and
(local) ``LazyVideoDataset`` init on the rows.  ``--cold`` (root) runs each read-only command first with the
page cache dropped, then again, and prints the ratio: what the disk costs it once the LMDB file outgrows memory.
A command still running after ``--limit`` seconds is ended and recorded as a lower bound.  The growth from one
size to the next is printed as the exponent k of time ~ n^k (k near 1: O(n); near 2: O(n^2)).  Never asserts on time.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# this checkout's vidcache, before an installed one (the venv may hold another checkout's, editable)
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import report  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Entries of 8 frames of 28x28 (37.6 kB of frames each): the options' defaults would resize them to 1.35 MB each,
# 135 GB at 10^5.  ``prewarm`` and ``pull`` are given the same options (``OPTION_FLAGS``) to find them.
# ``--nframes N`` makes them N frames (2: 4.7 kB; what makes 10^6 entries fit this VM's disk, 48 GB at 8 frames).
OPTION_FLAGS = ["--resized-height", "28", "--resized-width", "28"]


def _options():
    from vidcache import VideoOptions
    nframes = OPTION_FLAGS[OPTION_FLAGS.index("--nframes") + 1] if "--nframes" in OPTION_FLAGS else None
    return VideoOptions(resized_height=28, resized_width=28, **({"nframes": int(nframes)} if nframes else {}))


def fill(node: str, shared: str | None, src_dir: str, n: int, data: str) -> tuple[float, int]:
    """``n`` entries in the tiers and a JSONL of one row per source; the seconds it took, the frame bytes."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from vidcache import VideoCache, keys
    from vidcache.digest import Digest
    from vidcache.loader.build import decode_sample_resize
    from vidcache.loader.fetch import fingerprint
    from vidcache.manifest import SourceRecord, build_manifest
    from vidcache.testing.videos import make_video

    t0 = time.perf_counter()
    opts = _options()
    os.makedirs(src_dir, exist_ok=True)
    clip = make_video(os.path.join(src_dir, "template.mp4"), width=28, height=28, fps=2, n_frames=4, seed=0)
    frames, built = decode_sample_resize(clip, opts)
    base = frames.numpy().copy()
    # The raw shared layout (frames as they are, no compact object): a compact object per entry costs an encode
    # that would make 10^5 entries take hours on two cores; the commands measured read both layouts alike but
    # for verify, which decodes each compact object (its per-entry cost is measured at small n in verify_cost.py).
    c = VideoCache(node, shared=shared, shared_layout="raw")
    pool = ThreadPoolExecutor(8)         # the shared tier's writes of many entries at once, as prewarm's workers

    def commit(batch: list[dict]) -> None:
        if c.shared is not None:           # the shared tier first (TieredStore.set_many's order), then LMDB
            list(pool.map(c.shared.set_many, batch))
        c.local.set_many({k: v for items in batch for k, v in items.items()})   # one transaction

    batch: list = []
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
            batch.append({keys.cas(str(blob)): man.frames.encode(raw), keys.ac(key): man.to_json(), **record})
            if len(batch) >= 1000:
                commit(batch)
                batch = []
            rows.write(json.dumps({"prompt": "<video>", "videos": [src]}) + "\n")
    if batch:
        commit(batch)
    pool.shutdown()
    c.close()
    return time.perf_counter() - t0, n * base.nbytes


# ``vidcache ARGS`` as ``python -m vidcache.cli`` runs it, then on stderr the process's private memory at exit
# (RssAnon: Python's heap, which seldom shrinks, so about its peak) and its peak RSS: its own (VmHWM:
# per address space, so not the parent's, which ``ru_maxrss`` carries over exec) or its children's, whichever is
# larger (``ls``, ``stats``, ``verify`` and ``gc`` walk LMDB in a forked child: ``vidcache.cli.WALKS``).  A forked
# child that returns writes a line too: ``run`` takes the largest.  The peak RSS counts the LMDB file's pages the
# process mapped (file-backed page cache, shared and reclaimable; the kernel maps up to 64 kB around each page a
# read touches, so a walk of a file in the page cache shows most of the file): the private figure is what grows
# with what a command holds.
CLI_CHILD = r"""
import resource, runpy, sys
sys.argv = ["vidcache"] + sys.argv[1:]
try:
    runpy.run_module("vidcache.cli", run_name="__main__")
finally:
    st = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(("VmHWM", "RssAnon"))}
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    sys.stderr.write("\nscale-hwm-kb %d %d\n" % (max(st["VmHWM"], kids), st["RssAnon"]))
"""


# ``--cold``: each read-only command runs twice, first with the page cache dropped (every LMDB page it touches is
# read from the disk, as when the file is larger than the memory: 10^6 entries on this VM), then again (the file's
# pages as the first run left them).  The ratio is what the disk costs the command.
COLD = False
# ``--baseline``: ``verify`` and ``pull`` of everything also one entry at a time (``--workers 1``, ``--depth 1``),
# and the ratio printed: what checking and pulling entries in threads buys (each is a few round trips).
BASELINE = False


def drop_page_cache() -> None:
    """Write back and drop the kernel's page cache (root only; the whole machine's, not only this run's)."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
    except PermissionError as e:
        raise SystemExit(f"scale.py --cold: dropping the page cache needs root ({e})") from None


def tree_anon_kb(pid: int) -> int:
    """Private memory (RssAnon, kB) of ``pid`` and its descendants now; what is gone counts 0."""
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            total = next((int(line.split()[1]) for line in f if line.startswith("RssAnon")), 0)
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(k) for k in f.read().split()]
    except OSError:
        return total
    return total + sum(tree_anon_kb(k) for k in kids)


def run(args: list[str], env: dict, limit: float, cold: bool = False) -> dict:
    """``vidcache ARGS`` in a process of its own: wall seconds, peak RSS (MB), seconds to its first entry's line
    (``ls``: the line after the header).  Past ``limit`` seconds it is ended: ``"ended": True``, the time a bound.
    ``cold``: the page cache is dropped first."""
    import threading
    # The disk quiet first: what an earlier command left dirty (pull's 10^5 new entries) is written back now,
    # not during this command's time.
    if cold:
        drop_page_cache()
    else:
        os.sync()
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-c", CLI_CHILD, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=ROOT)
    timer = threading.Timer(limit, p.kill)
    timer.start()
    err = []
    reader = threading.Thread(target=lambda: err.append(p.stderr.read()))
    reader.start()
    # The private memory's peak, sampled every 20 ms over the process tree (its forked walk, workers): RssAnon at exit
    # misses what a command held and freed before it (a list of every key, say).
    peak = [0]

    def sample() -> None:
        while p.poll() is None:
            peak[0] = max(peak[0], tree_anon_kb(p.pid))
            time.sleep(0.02)
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    first = last = None
    lines = 0
    for last in p.stdout:
        lines += 1
        if first is None and lines == (2 if args[0] == "ls" else 1):
            first = time.perf_counter() - t0
    p.wait()
    timer.cancel()
    reader.join()
    sampler.join()
    wall = time.perf_counter() - t0
    err = err[0].decode()
    if p.returncode == -9:
        return {"s": wall, "rss_mb": float("nan"), "anon_mb": float("nan"), "peak_anon_mb": peak[0] / 1024,
                "first_s": first, "lines": lines, "ended": True, "last": None}
    if p.returncode not in (0,) and not (args[0] == "verify" and p.returncode == 1):
        raise SystemExit(f"scale.py: vidcache {' '.join(args)} failed ({p.returncode}): {err[-2000:]}")
    parts = [part.split() for part in err.split("scale-hwm-kb")[1:]]
    hwm, anon = max(int(p[0]) for p in parts), max(int(p[1]) for p in parts)
    return {"s": wall, "rss_mb": hwm / 1024, "anon_mb": anon / 1024, "peak_anon_mb": max(peak[0], anon) / 1024,
            "first_s": first, "lines": lines,
            "last": last.decode(errors="replace").strip()[:200] if last else None}   # its summary line


DATASET_CHILD = r"""
import json, sys, time
from vidcache import VideoOptions
from vidcache.dataset import LazyVideoDataset
from vidcache.identity import local_identity
t = time.perf_counter()
ds = LazyVideoDataset(sys.argv[1], local_identity(sys.argv[2], create=True), VideoOptions())
n = len(ds); ds[n - 1]
st = {l.split(":")[0]: int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(("VmHWM", "RssAnon"))}
print(json.dumps({"s": time.perf_counter() - t, "rss_mb": st["VmHWM"] / 1024, "anon_mb": st["RssAnon"] / 1024}))
"""


def one_size(work: str, n: int, tier: str, s3: dict | None, limit: float, out: dict, save=lambda: None) -> dict:
    """The commands against ``n`` entries on a node alone (``tier="local"``) or behind a shared tier, into
    ``out``; ``save()`` after each (a long size's finished commands are kept if the run is stopped)."""
    d = os.path.join(work, f"{tier}-n{n}")
    shutil.rmtree(d, ignore_errors=True)
    node, data = os.path.join(d, "node"), os.path.join(d, "rows.jsonl")
    shared = {"local": None, "dir": os.path.join(d, "tier"), "s3": f"s3://scale/{tier}-n{n}"}[tier]
    out["fill_s"], frame_bytes = fill(node, shared, os.path.join(d, "src"), n, data)
    out["disk_mb"] = int(subprocess.run(["du", "-sm", d], capture_output=True, text=True).stdout.split()[0])
    save()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDCACHE_")}
    env.update({"PYTHONPATH": ROOT, "VIDCACHE_DIR": node, **(s3 or {})})
    if shared is not None:
        env["VIDCACHE_SHARED"] = shared
    whole = ["--shared"] if shared is not None else []

    def read_only(name: str, args: list[str]) -> dict:
        if COLD:
            out[f"{name} (cold)"] = run(args, env, limit, cold=True)
            save()
        out[name] = run(args, env, limit)
        save()
        return out[name]

    ls = read_only("ls", ["ls"])
    out["ls first entry"] = {"s": ls["first_s"] if ls["first_s"] is not None else float("nan"),
                             "rss_mb": ls["rss_mb"], "anon_mb": ls["anon_mb"], "peak_anon_mb": ls["peak_anon_mb"]}
    read_only("stats", ["stats", "--json"])
    # The commands that stay near their start-up cost before the O(n)/O(bytes) ones, so that a run stopped at a
    # large size keeps them (``--json`` is written after each).
    read_only("verify --sample 100", ["verify", *whole, "--sample", "100"])
    if tier == "local":
        r = subprocess.run([sys.executable, "-c", DATASET_CHILD, data, os.path.join(d, "ds-node")], env=env,
                           cwd=ROOT, capture_output=True, text=True, check=True)
        out["LazyVideoDataset init"] = json.loads(r.stdout)
        save()
    if BASELINE:                          # the same check one entry at a time: the ratio the threads buy
        read_only("verify, one at a time", ["verify", *whole, "--workers", "1"])
    read_only("verify", ["verify", *whole])
    read_only("prewarm re-run", ["prewarm", data, "--no-progress", *OPTION_FLAGS])
    if shared is not None:
        head = os.path.join(d, "rows-1pct.jsonl")
        with open(data) as f, open(head, "w") as g:
            for _, line in zip(range(max(1, n // 100)), f):
                g.write(line)
        out["pull 1%"] = run(["pull", head, *OPTION_FLAGS], {**env, "VIDCACHE_DIR": os.path.join(d, "fresh1")}, limit)
        save()
        if BASELINE:
            out["pull all, one at a time"] = run(["pull", data, "--depth", "1", *OPTION_FLAGS],
                                                 {**env, "VIDCACHE_DIR": os.path.join(d, "fresh3")}, limit)
            save()
        out["pull all"] = run(["pull", data, *OPTION_FLAGS], {**env, "VIDCACHE_DIR": os.path.join(d, "fresh2")}, limit)
        save()
    # gc changes the node: run once (cold under --cold, the case the 10^6 figure is)
    out["gc to half"] = run(["gc", "--max-local-bytes", str(max(1, frame_bytes // 2))], env, limit, cold=COLD)
    save()
    shutil.rmtree(d, ignore_errors=True)
    return out


def cell(r: dict) -> str:
    """One command's figures: time ('>': ended at the limit) / private at exit (sampled peak) / peak RSS."""
    return (f"{'>' if r.get('ended') else ''}{r['s']:.2f} s / {r['anon_mb']:.0f} "
            f"(peak {r.get('peak_anon_mb', math.nan):.0f}) / {r['rss_mb']:.0f} MB")


def growth(ks: list[float]) -> str:
    """A reading of the exponents: start-up bound, about linear, or worse."""
    if not ks:
        return ""
    k = ks[-1]
    return ("flat (start-up bound)" if k < 0.3 else "sub-linear (start-up + O(n))" if k < 0.8 else
            "~O(n)" if k < 1.25 else "O(n log n)?" if k < 1.5 else "worse than O(n log n)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000", help="entry counts, comma-separated")
    ap.add_argument("--tiers", default="local,dir,s3", help="of local (no shared tier), dir, s3")
    ap.add_argument("--limit", type=float, default=900, help="seconds a command may run before it is ended")
    ap.add_argument("--work", help="working directory (default: a temporary one, removed)")
    ap.add_argument("--json", help="write the figures here too (after each command)")
    ap.add_argument("--nframes", type=int, help="frames per entry (default: 8, from the 2 s template clip)")
    ap.add_argument("--cold", action="store_true",
                    help="run each read-only command with the page cache dropped, then again (root: drops the "
                         "whole machine's cache); gc runs cold only")
    ap.add_argument("--baseline", action="store_true",
                    help="also run verify and pull of everything one entry at a time, and print the ratios")
    args = ap.parse_args()
    global COLD, BASELINE
    COLD, BASELINE = args.cold, args.baseline
    if args.nframes:
        OPTION_FLAGS.extend(["--nframes", str(args.nframes)])
    sizes = [int(x) for x in args.sizes.split(",")]
    tiers = args.tiers.split(",")
    work = args.work or tempfile.mkdtemp(prefix="vidcache-scale-")
    s3env = None
    stack = contextlib.ExitStack()
    try:
        if "s3" in tiers:
            from shared_tier_read import moto_s3
            url, opts = stack.enter_context(moto_s3(bucket="scale", process=True))
            s3env = {"AWS_ENDPOINT_URL": opts["endpoint_url"], "AWS_DEFAULT_REGION": "us-east-1",
                     "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
            os.environ.update(s3env)          # fill's own writes
        res: dict = {}
        def save() -> None:
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(res, f, indent=1)

        for tier in tiers:
            for n in sizes:
                one_size(work, n, tier, s3env if tier == "s3" else None, args.limit,
                         res.setdefault(tier, {}).setdefault(n, {}), save)
                print(f"{tier} n={n}: " + json.dumps({k: (round(v, 2) if isinstance(v, (int, float)) else
                                                          {a: round(b, 2) for a, b in v.items()
                                                           if isinstance(b, (int, float))})
                                                      for k, v in res[tier][n].items()}), flush=True)
        for tier in tiers:
            rows = []
            for cmd in [k for k in res[tier][sizes[0]] if k not in ("fill_s", "disk_mb")]:
                cells = [cell(res[tier][n][cmd]) if cmd in res[tier][n] else "not run" for n in sizes]
                ks = [math.log(max(res[tier][b][cmd]["s"], 1e-3) / max(res[tier][a][cmd]["s"], 1e-3)) / math.log(b / a)
                      for a, b in zip(sizes, sizes[1:]) if cmd in res[tier][b]]
                rows.append((cmd, " | ".join(cells) + ("   k=" + ", ".join(f"{k:.2f}" for k in ks) + " "
                                                       + growth(ks) if ks else "")))
            for cmd in [k[:-len(" (cold)")] for k in res[tier][sizes[0]] if k.endswith(" (cold)")]:
                rows.append((f"{cmd}: cold / warm", " | ".join(
                    f"{res[tier][n][cmd + ' (cold)']['s'] / res[tier][n][cmd]['s']:.1f}x"
                    if cmd in res[tier][n] and cmd + " (cold)" in res[tier][n] else "not run" for n in sizes)))
            for cmd in ("verify", "pull all"):
                if f"{cmd}, one at a time" in res[tier][sizes[0]]:
                    rows.append((f"{cmd}: one at a time / threads", " | ".join(
                        f"{res[tier][n][cmd + ', one at a time']['s'] / res[tier][n][cmd]['s']:.1f}x"
                        if cmd in res[tier][n] else "not run" for n in sizes)))
            rows.append(("writing the entries / disk", " | ".join(f"{res[tier][n]['fill_s']:.0f} s / "
                                                                  f"{res[tier][n]['disk_mb']} MB" for n in sizes)))
            report(f"scale, {tier}: time / private at exit (its sampled peak) / peak RSS at "
                   f"n = {', '.join(map(str, sizes))} ({os.cpu_count()} cores)",
                   rows)
    finally:
        stack.close()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
