"""Issue 51 item 7: output for a person, driven through the CLI on fresh nodes: ``gc`` and ``inspect`` print a
summary (``--json`` for machines), ``ls`` without a cache says how to point at one, an all-cached prewarm prints
no rate, failures come in row order (the failures file with fixed keys, newline-ended), ``pull --strict`` fails
a pre-job check when rows are not cached, and a closed pipe ends a command quietly."""
import json
import os
import subprocess
import sys

import pytest

from support.cli import ROOT, run_cli


def ok(r):
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.fixture
def dataset(tmp_path, videos):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n"
                         for n in ("ffv1_10_small", "mjpeg_24")))
    return p


def test_gc_prints_a_line_and_json_on_request(tmp_path, dataset):
    node = tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset), "--no-progress"], node))
    out = ok(run_cli(["gc", "--max-local-bytes", "20GB"], node)).stdout
    assert out.startswith("gc: nothing evicted: the local tier uses ") and "20.0 GB budget" in out, out
    out = ok(run_cli(["gc", "--max-local-bytes", "1kB"], node)).stdout
    assert out.startswith("gc: evicted 2 entries (") and "freed " in out and "{" not in out, out
    report = json.loads(ok(run_cli(["gc", "--max-local-bytes", "1kB", "--json"], node)).stdout)
    assert report == {"evicted": 0, "freed_bytes": 0, "used_bytes": report["used_bytes"], "entries_evicted": 0}


def test_inspect_prints_a_summary_and_the_manifest_with_json(tmp_path, dataset, videos):
    node = tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset), "--no-progress"], node))
    out = ok(run_cli(["inspect", videos["mjpeg_24"]], node)).stdout
    lines = out.splitlines()
    assert [ln.split(":")[0] for ln in lines[:-1]] == ["key", "source", "family", "frames", "tokens", "aspect",
                                                      "decoder"], out
    m = json.loads(ok(run_cli(["inspect", videos["mjpeg_24"], "--json"], node)).stdout)
    assert lines[0].split()[1] == m["key"] and lines[1].split()[1] == videos["mjpeg_24"]
    t, _, h, w = m["frames"]["shape"]
    assert f"{t} x {h} x {w} (T x H x W)" in lines[3] and f"{m['tokens']['video_pad_tokens']} video tokens" in lines[4]
    assert "source 250x170" in lines[5] and m["provenance"]["decoder"] in lines[6]
    assert len(lines) < 10


def test_ls_without_a_cache_says_how_to_point_at_one(tmp_path):
    r = run_cli(["ls"], tmp_path / "nothing-here")
    assert r.returncode == 1 and r.stderr.startswith("vidcache: error: [config] no vidcache cache at ")
    assert "--cache DIR" in r.stderr and "VIDCACHE_DIR=DIR" in r.stderr and "Traceback" not in r.stderr


def test_an_all_cached_prewarm_prints_no_rate(tmp_path, dataset):
    node = tmp_path / "node"
    first = ok(run_cli(["prewarm", str(dataset), "--no-progress"], node)).stdout
    assert "2 new" in first and "videos/s" in first
    again = ok(run_cli(["prewarm", str(dataset), "--no-progress"], node)).stdout
    assert "0 new, 2 hit" in again and "videos/s" not in again, again


def test_failures_are_in_row_order_and_the_file_has_fixed_keys(tmp_path, videos):
    ds = tmp_path / "d.jsonl"
    rows = [{"prompt": "<video>", "videos": [str(tmp_path / f"missing{i}.mp4")]} for i in range(6)]
    rows.insert(3, {"prompt": "<video>", "videos": [videos["ffv1_10_small"]]})
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    r = run_cli(["prewarm", str(ds), "--no-progress", "--workers", "2"], tmp_path / "node")
    assert r.returncode == 1
    shown = [int(ln.split()[1]) for ln in r.stdout.splitlines() if ln.startswith("  row ")]
    assert shown == [0, 1, 2, 4, 5], r.stdout                   # the first five, then "... and 2 more"
    text = (tmp_path / "d.failures.jsonl").read_text()
    assert text.endswith("\n")
    recs = [json.loads(ln) for ln in text.splitlines()]
    assert [rec["row"] for rec in recs] == [0, 1, 2, 4, 5, 6, 7]
    assert all(list(rec)[:5] == ["row", "line", "source", "kind", "error"] for rec in recs), recs


def test_pull_strict_fails_when_rows_are_not_cached(tmp_path, dataset):
    tier = tmp_path / "tier"
    loose = ok(run_cli(["pull", str(dataset)], tmp_path / "a", tier))
    assert "2 not cached" in loose.stdout
    strict = run_cli(["pull", str(dataset), "--strict"], tmp_path / "a", tier)
    assert strict.returncode == 1 and "2 not cached" in strict.stdout
    ok(run_cli(["prewarm", str(dataset), "--no-progress"], tmp_path / "b", tier))
    assert "2 pulled" in ok(run_cli(["pull", str(dataset), "--strict"], tmp_path / "a", tier)).stdout


@pytest.mark.parametrize("cmd", [["inspect", "KEY", "--json"], ["ls"], ["--help"]])
def test_a_closed_pipe_ends_a_command_quietly(tmp_path, dataset, cmd):
    """``vidcache inspect KEY | head``: the reader closed the pipe before the command wrote (deterministic)."""
    node = tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset), "--no-progress"], node))
    key = json.loads(ok(run_cli(["ls", "--json"], node)).stdout)[0]["key"]
    r_fd, w_fd = os.pipe()
    os.close(r_fd)                                       # `head` has gone
    env = {"PATH": os.environ["PATH"], "VIDCACHE_DIR": str(node)}
    try:
        p = subprocess.run([sys.executable, "-m", "vidcache.cli", *[key if a == "KEY" else a for a in cmd]],
                           cwd=ROOT, env=env, stdout=w_fd, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w_fd)
    assert p.returncode == 141 and p.stderr == "", p.stderr
