"""How long a CLI call takes, as a ratio to a bare ``python -c "import torch"`` in the same run (issue 13:
commands that read manifests must not import torch; target <= 0.3x).

    python benchmarks/cli_speed.py [--repeat 5]

Builds a one-entry cache with a directory shared tier, then times each command in a fresh interpreter
(median of --repeat runs; the baseline is timed interleaved with the commands, so load shifts hit both)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def timed(cmd: list[str], env: dict) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {r.stderr[-1000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    from benchmarks._common import clips
    with tempfile.TemporaryDirectory() as d:
        clip = clips(os.path.join(d, "clips"), 1, seconds=2.0)[0]
        ds = os.path.join(d, "d.jsonl")
        with open(ds, "w") as f:
            f.write(json.dumps({"prompt": "<video>", "videos": [clip]}) + "\n")
        env = {**os.environ, "VIDCACHE_DIR": os.path.join(d, "node"), "VIDCACHE_SHARED": os.path.join(d, "tier"),
               "PYTHONPATH": ROOT}
        vc = [sys.executable, "-m", "vidcache.cli"]
        timed(vc + ["prewarm", ds, "--no-progress"], env)
        key = json.loads(subprocess.run(vc + ["ls", "--json"], env=env, cwd=ROOT, capture_output=True,
                                        text=True).stdout)[0]["key"]
        commands = {"--help": ["--help"], "stats": ["stats"], "ls": ["ls"], "verify": ["verify"],
                    "inspect KEY": ["inspect", key], "inspect SOURCE": ["inspect", clip],
                    "sglang-config": ["sglang-config", "--family", "qwen3_vl"],
                    "evict (local)": ["evict", key], "gc 20GB": ["gc", "--max-local-bytes", "20GB"],
                    "doctor --fast": ["doctor", "--fast"], "doctor": ["doctor"]}
        base, times = [], {n: [] for n in commands}
        for _ in range(a.repeat):
            base.append(timed([sys.executable, "-c", "import torch"], env))
            for name, args in commands.items():
                times[name].append(timed(vc + args, env))
                if name == "evict (local)":
                    timed(vc + ["prewarm", ds, "--no-progress"], env)      # put it back (a hit from the tier)
        b = statistics.median(base)
        print(f"baseline: python -c 'import torch' median {b:.2f} s over {a.repeat} runs")
        print(f"{'command':<16} {'median s':>9} {'ratio':>7} {'worst':>7}")
        worst = {}
        for name, ts in times.items():
            m = statistics.median(ts)
            worst[name] = max(t / bt for t, bt in zip(ts, base))     # each run against the baseline beside it
            print(f"{name:<16} {m:>9.2f} {m / b:>6.2f}x {worst[name]:>6.2f}x")
        print(f"stats/ls worst of {a.repeat}: {max(worst['stats'], worst['ls']):.2f}x a bare import torch (target 0.3x)")


if __name__ == "__main__":
    main()
