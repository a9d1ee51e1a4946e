"""A fork after PyAV scaled frames in another thread (``vidcache/loader/forks.py``): with vidcache's loader imported
the child decodes and exits, and its frames equal the parent's; without the rule, on a PyAV that keeps a scaler
per thread, the child hangs (the hazard the rule exists for).  Then the way users meet it: ``prewarm`` with worker
processes in a process whose main thread has read frames through PyAV first."""
import json
import subprocess
import sys
import textwrap

import av.video.frame
import pytest

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, sys, threading
    import numpy as np
    if sys.argv[1] == "rule":
        import vidcache.loader                      # registers the rule
    import av

    def rgb_sum():
        rnd = np.random.RandomState(0).randint(0, 255, (240, 320, 3), np.uint8)
        f = av.VideoFrame.from_ndarray(rnd, format="rgb24").reformat(format="yuv420p")
        return int(f.to_ndarray(format="rgb24").astype(np.int64).sum())

    def child(q):
        q.put(rgb_sum())

    here = rgb_sum()                                # the main thread's scaler, with its slice threads
    out = {}

    def fork_from_a_thread():
        ctx = mp.get_context("fork")
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        p.join(30)
        out["exit"] = p.exitcode
        out["same"] = p.exitcode == 0 and q.get(timeout=5) == here
        if p.exitcode is None:
            p.kill()

    t = threading.Thread(target=fork_from_a_thread)
    t.start()
    t.join()
    print(out)
""")


def _run(mode: str) -> dict:
    r = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return eval(r.stdout.strip().splitlines()[-1])      # noqa: S307  a dict this test printed


def test_a_child_forked_after_pyav_scaled_in_the_main_thread_decodes_and_exits():
    assert _run("rule") == {"exit": 0, "same": True}


@pytest.mark.skipif(not hasattr(av.video.frame, "_thread_local"),
                    reason="this PyAV keeps no scaler per thread: there is no hazard to show")
def test_without_the_rule_that_child_hangs():
    assert _run("none") == {"exit": None, "same": False}


def test_prewarm_with_workers_after_a_pull_in_the_same_process(tmp_path, videos):
    """A user's process, as the suite first met it: ``pull`` brings a shared tier's entries in its threads (each
    compact object decoded through PyAV's scaler), then ``prewarm`` forks its workers (pebble, from its manager
    thread) to build new videos.  In the suite's own process (test_pulling.py, then test_cli_datasets.py's
    in-process ``prewarm``) a worker hung at its start without the rule and the run never ended; in a fresh
    process this sequence did not hang without it, so the two tests above are the ones that show the hazard:
    this one is the sequence, end to end."""
    shared, a, b = tmp_path / "nfs", tmp_path / "a", tmp_path / "b"
    pulled, new = tmp_path / "pulled.jsonl", tmp_path / "new.jsonl"
    for path, names in ((pulled, ("ffv1_10_small", "mpeg4_25_odd")), (new, ("mjpeg_24", "h264_30"))):
        path.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n" for n in names))
    code = textwrap.dedent(f"""
        from vidcache import VideoCache, VideoOptions
        from vidcache.prewarming import prewarm
        from vidcache.pulling import pull
        o = VideoOptions()
        s = prewarm({str(pulled)!r}, VideoCache({str(a)!r}, shared={str(shared)!r}), o, progress=False)
        assert (s.new, s.failed) == (2, 0), s.failures
        b = VideoCache({str(b)!r}, shared={str(shared)!r})
        p = pull({str(pulled)!r}, b, o)
        assert (p.pulled, p.failed) == (2, 0), p.failures
        s = prewarm({str(new)!r}, b, o, workers=2, progress=False)
        print("new", s.new, "failed", s.failed)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "new 2 failed 0" in r.stdout, r.stdout + r.stderr[-2000:]
