"""A fully cached resume of `vidcache prewarm` against the cold run that built the cache, through the CLI as a
user runs it (a fresh node directory, N generated clips, 2 workers), with the time to the command's first line.

    .venv/bin/python benchmarks/resume_speed.py [--n 8]

Last line: `resume: X.XXx the cold run (R s vs C s); first line after F s`.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import clips  # noqa: E402


def timed(cmd, env) -> tuple[float, float, str]:
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stderr.readline()
    t_first = time.monotonic() - t0
    out, err = p.communicate()
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed: {out}{first}{err}")
    return time.monotonic() - t0, t_first, out.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="vidcache-resume-")
    rows = [json.dumps({"prompt": "<video>", "videos": [p]}) for p in clips(os.path.join(d, "clips"), a.n)]
    ds = os.path.join(d, "d.jsonl")
    with open(ds, "w") as f:
        f.write("\n".join(rows) + "\n")
    env = {**os.environ, "VIDCACHE_DIR": os.path.join(d, "node")}
    env.pop("VIDCACHE_SHARED", None)
    cmd = [os.path.join(os.path.dirname(sys.executable), "vidcache"), "prewarm", ds, "--workers", "2", "--no-progress"]
    cold, first_cold, line_cold = timed(cmd, env)
    warm = [timed(cmd, env) for _ in range(3)]
    best, first_warm, line_warm = min(warm)
    print(f"cold:   {cold:.2f} s  (first line after {first_cold:.2f} s)  {line_cold}")
    print(f"resume: {best:.2f} s  (first line after {first_warm:.2f} s, best of 3)  {line_warm}")
    print(f"resume: {best / cold:.2f}x the cold run ({best:.2f} s vs {cold:.2f} s); first line after "
          f"{max(first_cold, first_warm):.2f} s")


if __name__ == "__main__":
    main()
