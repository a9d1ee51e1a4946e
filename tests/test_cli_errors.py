"""User errors, help and speed of the CLI, run as users run it (subprocesses; issue 13 items 3 and 4).

Every user error: exit 1, ``vidcache: error: [kind] ...``, no traceback, and nothing created."""
import argparse
import errno
import json
import os
import subprocess
import sys

import pytest

from support.cli import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def refused(r, kind, *words):
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert r.stderr.startswith(f"vidcache: error: [{kind}] "), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and all(w in r.stderr for w in words), r.stderr[-2000:]


def nothing_created(tmp_path, *keep):
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)


@pytest.fixture
def ds(tmp_path, videos):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "<video>", "videos": [videos["ffv1_10_small"]]}) + "\n")
    return p


def test_missing_dataset(tmp_path):
    refused(run_cli(["prewarm", str(tmp_path / "nope.jsonl")], tmp_path / "node"), "config", "dataset not found",
            "nope.jsonl")
    nothing_created(tmp_path)


def test_bad_multimodal_keys(tmp_path, ds):
    refused(run_cli(["prewarm", str(ds), "--multimodal-keys", "{video: videos}"], tmp_path / "node"), "config",
            "--multimodal-keys is not JSON")
    refused(run_cli(["prewarm", str(ds), "--multimodal-keys", '["videos"]'], tmp_path / "node"), "config",
            "JSON object")
    nothing_created(tmp_path, "d.jsonl")


def test_ray_without_ray_names_the_extra(tmp_path, ds):
    stub = tmp_path / "stub"
    (stub / "ray").mkdir(parents=True)          # a Python where Ray does not import
    (stub / "ray" / "__init__.py").write_text("raise ImportError(\"No module named 'ray'\")\n")
    refused(run_cli(["prewarm", str(ds), "--ray"], tmp_path / "node", pythonpath=str(stub)), "backend_unavailable",
            "pip install 'ray[default]>=2.40'", "/path/to/vidcache[ray]")
    nothing_created(tmp_path, "d.jsonl", "stub")


@pytest.mark.parametrize("where", ["missing-dir/f.jsonl", "."])
def test_an_unwritable_failures_path_is_refused_up_front(tmp_path, ds, where):
    refused(run_cli(["prewarm", str(ds), "--failures", str(tmp_path / where)], tmp_path / "node"), "config",
            "--failures")
    nothing_created(tmp_path, "d.jsonl")


@pytest.mark.parametrize("cmd", [["prewarm", "DS"], ["gc"]])
@pytest.mark.parametrize("size", ["0", "-5", "0.4"])
def test_a_local_budget_of_zero_or_below_is_refused(tmp_path, ds, cmd, size):
    """A budget of 0 would evict every entry as it is written: a tier that silently keeps nothing (D30)."""
    args = [str(ds) if a == "DS" else a for a in cmd] + ["--max-local-bytes", size]
    refused(run_cli(args, tmp_path / "node"), "config", "--max-local-bytes", "above 0 bytes")
    nothing_created(tmp_path, "d.jsonl")


def test_a_local_budget_below_one_entry_warns_once(tmp_path, ds):
    # an entry: ~1 MB
    r = run_cli(["prewarm", str(ds), "--no-progress", "--max-local-bytes", "100000"], tmp_path / "node")
    assert r.returncode == 0 and "1 new" in r.stdout, r.stderr[-2000:]
    assert r.stderr.count("is below one entry") == 1 and "100000 bytes" in r.stderr, r.stderr[-2000:]
    # what the warning says
    assert json.loads(run_cli(["stats", "--json"], tmp_path / "node").stdout)["local"]["entries"] == 0
    # room for it: kept
    r = run_cli(["prewarm", str(ds), "--no-progress", "--max-local-bytes", "100MB"], tmp_path / "node")
    assert r.returncode == 0 and "below one entry" not in r.stderr, r.stderr[-2000:]
    assert json.loads(run_cli(["stats", "--json"], tmp_path / "node").stdout)["local"]["entries"] == 1


def test_failed_rows_give_their_line_and_the_report_is_written_only_then(tmp_path, videos):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "<video>", "videos": [videos["ffv1_10_small"]]}) + "\n\n"
                 + json.dumps({"prompt": "<video>", "videos": [str(tmp_path / "gone.mp4")]}) + "\n"
                 + "{not json\n")
    r = run_cli(["prewarm", str(p), "--no-progress"], tmp_path / "node")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "row 2 (line 3): [not_found]" in r.stdout and "row 3 (line 4): [bad_row]" in r.stdout
    recs = [json.loads(ln) for ln in (tmp_path / "d.failures.jsonl").read_text().splitlines()]
    assert sorted((f["row"], f["line"], f["kind"]) for f in recs) == [(2, 3, "not_found"), (3, 4, "bad_row")]
    p.write_text(json.dumps({"prompt": "<video>", "videos": [videos["ffv1_10_small"]]}) + "\n")
    assert run_cli(["prewarm", str(p), "--no-progress"], tmp_path / "node").returncode == 0
    assert not (tmp_path / "d.failures.jsonl").exists()           # no failures: no (stale) report


def test_without_a_terminal_prewarm_logs_progress_lines(tmp_path, videos):
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[v]]}) + "\n"
                         for v in ("ffv1_10_small", "mjpeg_24")))
    r = run_cli(["prewarm", str(p), "--log-interval", "0.001"], tmp_path / "node")      # stderr is a pipe here
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("prewarm: ") and " videos (" in ln]
    assert len(lines) >= 2 and lines[-1].startswith("prewarm: 2/2 videos (2 new, 0 hit, 0 failed)")
    assert "\r" not in r.stderr and "it/s" not in r.stderr                  # no tqdm bar


def test_version_and_help_with_defaults_for_every_flag(tmp_path):
    from vidcache import __version__
    from vidcache.cli import build_parser
    r = run_cli(["--version"], tmp_path / "node")
    assert r.returncode == 0 and r.stdout.startswith(f"vidcache {__version__} ")
    ap = build_parser()
    subs = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, p in subs.items():
        for a in p._actions:
            if a.option_strings and a.dest != "help":
                assert a.help, f"vidcache {name} {a.option_strings[0]} has no help"
                if a.default not in (None, False):
                    assert str(a.default) in p.format_help() or "default" in a.help, (name, a.dest)
    text = subs["prewarm"].format_help()
    for flag, default in (("--fps", "default 2.0"), ("--workers", "default: 1"), ("--timeout", "default: 600.0"),
                          ("--min-frames", "default 4"), ("--max-source-mb", "default: 4096")):
        assert default in " ".join(text.split()), (flag, default)


TORCH_FREE = [["--help"], ["stats"], ["ls"], ["ls", "--json"], ["verify"], ["verify", "--embeddings"], ["sglang-config", "--family", "qwen3_vl"],
              ["evict", "0" * 32 + ".1." + "0" * 32], ["gc", "--max-local-bytes", "20GB"], ["doctor", "--fast"]]


def test_manifest_only_commands_do_not_import_torch(tmp_path, ds):
    """The CLI answers fast: commands that only read manifests never import torch (lazy imports)."""
    r = run_cli(["prewarm", str(ds), "--no-progress", "--shared", str(tmp_path / "tier")], tmp_path / "node")
    assert r.returncode == 0
    code = ("import sys\nfrom vidcache.cli import main\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', file=sys.stderr)\nsys.exit(rc)")
    key = json.loads(run_cli(["ls", "--json"], tmp_path / "node").stdout)[0]["key"]
    for args in TORCH_FREE + [["inspect", key], ["inspect", json.loads(ds.read_text())["videos"][0]]]:
        r = run_cli(args, tmp_path / "node", code=code)
        assert r.returncode == 0, (args, r.stderr[-2000:])
        assert r.stderr.strip().endswith("NO-TORCH"), (args, r.stderr[-500:])
    r = run_cli(["inspect", key, "--contact-sheet", str(tmp_path / "s.png")], tmp_path / "node", code=code)
    assert r.returncode == 0 and r.stderr.strip().endswith("TORCH")        # frames: torch, as it should


def test_prewarm_ray_keeps_rays_own_log_lines_out_of_the_terminal(tmp_path, ds):
    """Ray's raylet/gcs/worker lines stay in Ray's log directory: stderr holds vidcache's lines only."""
    r = run_cli(["prewarm", str(ds), "--ray", "--shared", str(tmp_path / "tier")], tmp_path / "node")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "1 new" in r.stdout
    foreign = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("prewarm")]
    assert foreign == [], foreign[:10]
    # Issue 40: the seconds Ray takes to start are announced, not silent
    assert "prewarm: starting Ray (or joining the one running on this machine): a few seconds" in r.stderr


def test_long_commands_say_what_they_do_before_the_heavy_imports(tmp_path, ds):
    """Issue 33: `prewarm` and `demo` print their first line before torch, the decoders or the encoder are
    imported (an import hook notes each as it happens, in order with the command's own lines); a fully cached
    resume never imports the decoders at all."""
    code = ("import sys, builtins\nfrom vidcache.cli import main\n"
            "seen = set()\n_imp = builtins.__import__\n"
            "def hook(name, *a, **k):\n"
            "    top = name.split('.')[0]\n"
            "    if top in ('torch', 'decord', 'av', 'torchvision') and top not in seen and top not in sys.modules:\n"
            "        seen.add(top); print(f'IMPORTING {top}', file=sys.stderr, flush=True)\n"
            "    return _imp(name, *a, **k)\n"
            "builtins.__import__ = hook\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\nsys.exit(rc)")
    for args, first in ((["prewarm", str(ds), "--no-progress"], "prewarm: cache"),
                        (["demo", "--dir", str(tmp_path / "demo"), "--videos", "1", "--rows", "1"], "demo: writing")):
        r = run_cli(args, tmp_path / "node", code=code)
        assert r.returncode == 0, r.stderr[-2000:]
        lines = r.stderr.splitlines()
        assert lines and lines[0].startswith(first), lines[:5]
        assert any(ln.startswith("IMPORTING") for ln in lines), lines      # the heavy imports do come, later
    r = run_cli(["prewarm", str(ds), "--no-progress"], tmp_path / "node", code=code)      # everything cached: a resume
    assert r.returncode == 0 and "0 new, 1 hit" in r.stdout, r.stdout + r.stderr
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("IMPORTING")], r.stderr


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_killing_a_verb_stops_its_forked_child(tmp_path, hung_endpoint, how):
    """D36: the verbs that walk LMDB work in a forked child; killing the pid the user started (kill, timeout, a
    scheduler) stops the child too, within seconds, whether the parent could forward the signal (SIGTERM) or
    not (SIGKILL: the child's parent-death signal).  The child here waits on a shared tier that never answers."""
    import signal
    import time

    import psutil
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "VIDCACHE_DIR": str(tmp_path / "node"),
           "VIDCACHE_SHARED": "s3://bucket/tier", "AWS_ENDPOINT_URL": hung_endpoint, "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1", "VIDCACHE_SHARED_TIMEOUT_S": "300"}
    proc = subprocess.Popen([sys.executable, "-m", "vidcache.cli", "ls"], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 60
    while not parent.children() and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = parent.children()
    time.sleep(1.0)                                     # the child is at work (waiting on the tier)
    assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    proc.send_signal(getattr(signal, how))
    proc.wait(timeout=30)
    gone, alive = psutil.wait_procs([child], timeout=10)
    assert not alive, f"the child outlived its parent's {how}"


# D41: on a brand-new node, the first write is the node directory's; a full disk there failed with a raw OSError.
FULL_DISK_AT_THE_NODE = """
import errno, os, sys
node = os.path.abspath(os.environ["VIDCACHE_DIR"])
real_mkdir = os.mkdir
def mkdir(p, *a, **k):      # the disk is full: no directory can be made under the node's path
    q = os.path.abspath(os.fsdecode(p))
    if q == node or q.startswith(node + os.sep):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), p)
    return real_mkdir(p, *a, **k)
os.mkdir = mkdir
from vidcache.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("shared", [False, True])
def test_a_brand_new_node_on_a_full_disk_is_no_space(tmp_path, ds, shared):
    args = ["prewarm", str(ds)] + (["--shared", str(tmp_path / "tier")] if shared else [])
    r = run_cli(args, tmp_path / "node", code=FULL_DISK_AT_THE_NODE)
    refused(r, "no_space", "no space left", str(tmp_path / "node"))
    assert not (tmp_path / "node").exists()


def test_an_lmdb_directory_on_a_full_disk_is_no_space(tmp_path, monkeypatch):
    from vidcache.errors import NoSpaceError
    from vidcache.store.lmdb import LMDBStore

    def full(p, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), p)
    monkeypatch.setattr(os, "mkdir", full)
    with pytest.raises(NoSpaceError, match="no space left to create the LMDB directory"):
        LMDBStore(tmp_path / "node" / "lmdb").set_many({"cas/a": b"x"})
