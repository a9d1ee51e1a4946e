"""(e) Lazy dataset init on a generated 100k-row JSONL: time, RSS and decode count
(targets <= 5 s, <= 300 MB, 0).  The init runs in a fresh interpreter so RSS is the whole process."""
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
from vidcache.config import local_identity
t1 = time.perf_counter()
# The cache by identity (a string), as a DataLoader worker gets it: no VideoCache, so no torch.
identity = local_identity(sys.argv[2], create=True)
ds = LazyVideoDataset(sys.argv[1], identity, VideoOptions(family="qwen2_5_vl"))
rows = [ds[i] for i in range(0, len(ds), 997)]    # touch rows across the file
t2 = time.perf_counter()
assert all(h.tier == identity for r in rows for h in r.handles)
# A decode needs the decoder module (and decord); if neither was imported, nothing was decoded.
decoder_loaded = "vidcache.loader.build" in sys.modules or "decord" in sys.modules
print(json.dumps({"rows": len(ds), "init_s": t2 - t1, "import_s": t1 - t0, "decodes": 0 if not decoder_loaded else -1,
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "torch_imported": "torch" in sys.modules, "sampled": len(rows)}))
"""


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
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
