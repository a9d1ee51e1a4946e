import json
import os
import signal
import subprocess
import sys
import time

import pytest

import vidcache

from vidcache import VideoCache, VideoOptions
from vidcache.cli import main as cli
from vidcache.prewarming import prewarm
from vidcache.testing.videos import make_video

from support.cli import run_cli


def _write(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return str(path)


def _entries_are_whole(cache):
    """Every manifest names a blob that is present and hashes to its digest."""
    keys = cache.entries()
    for k in keys:
        assert cache.verify(k) == [], k
    return keys


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory, videos):
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.mp4").write_bytes(b"")
    good = open(videos["h264_30"], "rb").read()
    (d / "truncated.mp4").write_bytes(good[: len(good) // 3])
    (d / "notvideo.mp4").write_bytes(b"this is a text file, not a video\n" * 100)
    make_video(str(d / "av1.mkv"), codec="av1", width=64, height=48, fps=10, n_frames=10)
    make_video(str(d / "thin.mkv"), codec="ffv1", width=1206, height=6, fps=10, n_frames=10)   # ratio 201
    make_video(str(d / "oneframe.mkv"), codec="ffv1", width=64, height=48, fps=10, n_frames=1)
    return d


def test_bad_input_mix(tmp_path, videos, bad_inputs):
    d = bad_inputs
    rows = [
        {"prompt": "<video>", "videos": [videos["h264_30"]]},
        {"prompt": "<video>", "videos": [str(d / "missing.mp4")]},
        {"prompt": "<video>", "videos": ["http://127.0.0.1:9/refused.mp4"]},
        {"prompt": "<video>", "videos": [str(d / "empty.mp4")]},
        {"prompt": "<video>", "videos": [str(d / "truncated.mp4")]},
        {"prompt": "<video>", "videos": [str(d / "notvideo.mp4")]},
        {"prompt": "<video>", "videos": [str(d / "av1.mkv")]},
        {"prompt": "<video>", "videos": [str(d / "thin.mkv")]},
        {"prompt": "<video>", "videos": [str(d / "oneframe.mkv")]},
        {"prompt": "<video> <video>", "videos": [videos["mjpeg_24"]]},      # malformed row
        {"prompt": "<video>", "videos": [videos["ffv1_10_small"]]},
    ]
    ds = _write(tmp_path / "mix.jsonl", rows)
    cache = VideoCache(tmp_path / "cache")
    fails = tmp_path / "fails.jsonl"
    s = prewarm(ds, cache, VideoOptions(), workers=2, failures_path=str(fails), progress=False)
    assert (s.new, s.failed) == (3, 8)                 # AV1 lands through the fallback decoder
    got = {r["row"]: r for r in map(json.loads, open(fails))}
    kinds = {i: got[i]["kind"] for i in got}
    assert kinds == {1: "not_found", 2: "unavailable", 3: "empty", 4: "decode", 5: "decode",
                     7: "aspect_ratio", 8: "too_few_frames", 9: "bad_row"}, kinds
    assert "missing.mp4" in got[1]["error"] and "0 bytes" in got[3]["error"]
    assert all(got[i]["source"] for i in got if i != 9)
    assert len(_entries_are_whole(cache)) == 3     # the good rows landed, nothing partial for the bad ones
    assert cache.stats()["blobs"] == 3


def test_too_few_frames_names_its_cause_from_the_cli(tmp_path, videos, bad_inputs):
    """CLI only, fresh node: qwen-vl-utils gives one message for two causes; the failure names the right one."""
    rows = [{"prompt": "<video>", "videos": [{"type": "video", "video": videos["h264_30"], "nframes": 100000}]},
            {"prompt": "<video>", "videos": [str(bad_inputs / "oneframe.mkv")]}]
    ds = _write(tmp_path / "d.jsonl", rows)
    r = run_cli(["prewarm", ds], tmp_path / "node")
    assert r.returncode == 1, r.stdout + r.stderr
    got = {f["row"]: f for f in map(json.loads, open(tmp_path / "d.failures.jsonl"))}
    assert {f["kind"] for f in got.values()} == {"too_few_frames"}
    assert "ask for nframes=100000" in got[0]["error"] and "at least 2" not in got[0]["error"]
    assert "need at least 2 sampled frames" in got[1]["error"] and "1 frame(s) in range" in got[1]["error"]


def test_hung_or_ballooning_decoder_costs_one_row(tmp_path, videos):
    big = make_video(str(tmp_path / "big.mp4"), codec="h264", width=1280, height=720, fps=30, n_frames=90)
    ds = _write(tmp_path / "d.jsonl", [{"prompt": "<video>", "videos": [big]},
                                       {"prompt": "<video>", "videos": [videos["h264_30"]]}])
    opts = VideoOptions(nframes=90, min_pixels=3136, max_pixels=1280 * 720)
    # By default the decode budget sits inside the watchdog's limit: the big video is refused before decoding.
    s = prewarm(ds, VideoCache(tmp_path / "c0"), opts, workers=1, max_worker_memory=600 << 20, progress=False)
    assert (s.new, s.failed) == (1, 1) and s.failures[0]["kind"] == "too_large"
    assert s.failures[0]["source"] == big
    # With the budget lifted, the watchdog is what stops it: the worker is killed, the other row lands.
    cache = VideoCache(tmp_path / "cache", max_decoded_bytes=8 << 30)
    s = prewarm(ds, cache, opts, workers=1, max_worker_memory=250 << 20, progress=False)
    assert (s.new, s.failed) == (1, 1) and s.failures[0]["kind"] == "memory"
    cache2 = VideoCache(tmp_path / "cache2")
    s = prewarm(ds, cache2, VideoOptions(nframes=90), workers=1, timeout_s=0.05, progress=False)
    assert s.failed >= 1 and {f["kind"] for f in s.failures} == {"timeout"}
    assert "killed" in s.failures[0]["error"]
    _entries_are_whole(cache2)


def test_resume_skips_present_entries_and_cli_exit_codes(tmp_path, videos, capsys):
    ds = _write(tmp_path / "d.jsonl", [{"prompt": "<video>", "videos": [videos[n]]}
                                       for n in ("h264_30", "mjpeg_24", "ffv1_10_small")])
    c = str(tmp_path / "cache")
    assert cli(["prewarm", ds, "--cache", c, "--workers", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "3 new, 0 hit, 0 failed" in out
    assert cli(["prewarm", ds, "--cache", c, "--no-progress"]) == 0
    assert "0 new, 3 hit, 0 failed" in capsys.readouterr().out
    # Frames built in worker processes (one intra-op thread) equal an in-process build.
    from vidcache.loader.build import decode_sample_resize
    import torch
    h = vidcache.lazy(videos["h264_30"], VideoOptions(), VideoCache(c))
    assert torch.equal(h.frames(), decode_sample_resize(videos["h264_30"], VideoOptions())[0])
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": "<video>", "videos": [str(tmp_path / "nope.mp4")]},
                                          {"prompt": "<video>", "videos": [videos["h264_30"]]}])
    assert cli(["prewarm", bad, "--cache", c, "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "0 new, 1 hit, 1 failed" in out and "not_found" in out
    assert cli(["prewarm", bad, "--cache", c, "--no-progress", "--allow-failures"]) == 0
    assert os.path.exists(str(tmp_path / "bad.failures.jsonl"))


def test_concurrent_prewarms_on_one_cache(tmp_path, videos):
    names = ["h264_30", "h264_ntsc", "mpeg4_25_odd", "mjpeg_24", "hevc_25", "ffv1_10_small"]
    ds = _write(tmp_path / "d.jsonl", [{"prompt": "<video>", "videos": [videos[n]]} for n in names])
    c = str(tmp_path / "cache")
    cmd = [sys.executable, "-m", "vidcache.cli", "prewarm", ds, "--cache", c, "--workers", "2", "--no-progress"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    keys = _entries_are_whole(VideoCache(c))
    assert len(keys) == len(names)
    assert "0 new, 6 hit" in subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout


_SLOW_WRITER = r"""
import sys, time
from vidcache import VideoCache, VideoOptions
from vidcache.store.lmdb import LMDBStore

class SlowStore(LMDBStore):
    def set_many(self, items):
        # Pause *inside* the write transaction, after the blob and before the manifest.
        with self._begin(write=True) as txn:
            for k, v in items.items():
                txn.put(k.encode(), v)
                if k.startswith("cas/"):
                    open(sys.argv[3], "w").write("in txn")
                    time.sleep(60)

cache = VideoCache(sys.argv[1], store=SlowStore(sys.argv[1] + "/lmdb"))
cache.ensure(sys.argv[2], VideoOptions())
"""


def test_kill_9_during_a_write_leaves_nothing_visible(tmp_path, videos):
    c = str(tmp_path / "cache")
    VideoCache(c).ensure(videos["ffv1_10_small"], VideoOptions())      # an earlier, complete entry
    flag = tmp_path / "flag"
    p = subprocess.Popen([sys.executable, "-c", _SLOW_WRITER, c, videos["h264_30"], str(flag)])
    deadline = time.time() + 120
    while not flag.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert flag.exists(), "writer never reached the transaction"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    cache = VideoCache(c)
    keys = _entries_are_whole(cache)
    assert len(keys) == 1 and cache.stats()["blobs"] == 1       # the killed write is invisible
    assert cache.ensure(videos["h264_30"], VideoOptions()).status == "new"   # and the cache still takes writes
    assert len(_entries_are_whole(cache)) == 2


def _prewarm_under_way(tmp_path, n: int, backend_args: list[str]):
    """A CLI prewarm of ``n`` fresh 10 s clips on a fresh node, in a session of its own (so SIGINT can go to its
    whole process group, as a terminal sends it), returned once a progress line says work is under way:
    (process, command, environment)."""
    import json
    import os
    import re
    import subprocess
    import sys
    import time

    from vidcache.testing.videos import make_video
    rows = [json.dumps({"prompt": "<video>", "videos": [make_video(
        str(tmp_path / f"v{i:02d}.mp4"), codec="h264", width=320, height=240, fps=25, n_frames=250, seed=i)]})
        for i in range(n)]
    ds = tmp_path / "d.jsonl"
    ds.write_text("\n".join(rows) + "\n")
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env["VIDCACHE_DIR"] = str(tmp_path / "node")
    cmd = [sys.executable, "-m", "vidcache.cli", "prewarm", str(ds), "--log-interval", "0.2"] + backend_args
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    line = ""
    while not re.match(rf"prewarm( \(ray\))?: [1-9][0-9]*/{n} ", line):    # a progress line: work is under way
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "prewarm ended before it could be interrupted"
        assert time.monotonic() < deadline
    return proc, cmd, env


@pytest.mark.parametrize("backend", ["local", "ray"])
def test_ctrl_c_stops_a_cli_prewarm_with_a_summary_and_a_rerun_completes(tmp_path, backend):
    """Issue 33, CLI only, on a fresh node: Ctrl-C (SIGINT to the whole process group, as a terminal sends it)
    during a 20-row prewarm stops scheduling, lets the rows in flight finish or abandons them, prints the summary
    saying "interrupted", exits 130 within 5 s with no traceback, and leaves nothing partial: the re-run builds
    exactly the rest, and verify passes every entry."""
    import os
    import signal
    import subprocess
    import sys
    import time

    proc, cmd, env = _prewarm_under_way(tmp_path, 20, ["--workers", "2"] if backend == "local" else ["--ray"])
    os.killpg(proc.pid, signal.SIGINT)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert took < 5, took
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    summary = next(ln for ln in out.splitlines() if ln.startswith("prewarm:"))
    assert "interrupted" in summary, out
    built = int(summary.split()[1])
    assert built < 20
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"prewarm: {20 - built} new, {built} hit, 0 failed" in r.stdout, r.stdout
    v = run_cli(["verify"], inherit=(), env=env, timeout=600)
    assert v.returncode == 0 and "verify: 20 ok, 0 bad" in v.stdout, v.stdout + v.stderr


def test_a_second_ctrl_c_stops_a_cli_prewarm_at_once_and_loses_nothing(tmp_path):
    """Issue 33, CLI only, on a fresh node: Ctrl-C twice (the second before the rows in flight finish) stops
    without waiting for them: exit 130, one line saying so, no traceback; nothing partial is left (the re-run
    builds the rest, verify passes every entry)."""
    import os
    import re
    import signal
    import subprocess
    import sys

    proc, cmd, env = _prewarm_under_way(tmp_path, 8, ["--workers", "2"])
    os.killpg(proc.pid, signal.SIGINT)
    line = ""
    while "Ctrl-C again to stop now" not in line:                   # the first press was taken
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "prewarm ended before the second press"
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "vidcache prewarm: interrupted" in err, err
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and re.search(r"prewarm: \d+ new, \d+ hit, 0 failed", r.stdout), r.stdout + r.stderr
    v = run_cli(["verify"], inherit=(), env=env, timeout=600)
    assert v.returncode == 0 and "verify: 8 ok, 0 bad" in v.stdout, v.stdout + v.stderr
