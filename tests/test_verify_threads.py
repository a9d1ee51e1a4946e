"""``vidcache verify`` checks ``VERIFY_WORKERS`` entries at once (a shared tier's check is round trips) and prints
them in the listing's order, at most ``2 * VERIFY_WORKERS`` ahead of the line printed; ``--repair`` checks one at
a time.  The CLI's own runs of ``verify`` (tier down, S3, corruption) are in test_cli_cluster.py,
test_corruption.py, test_s3_faults.py and test_shared_tier.py."""
import random
import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from vidcache.cli import entries

from support.cli import run_cli


def ok(r):
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return r


@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 40), workers=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_results_come_in_order_and_at_most_a_window_ahead(n, workers, seed):
    rnd = random.Random(seed)
    delays = [rnd.random() * 0.003 for _ in range(n)]
    started, lock = [], threading.Lock()

    def check(key):
        with lock:
            started.append(key)
        time.sleep(delays[key])
        return [f"p{key}"] if key % 3 == 0 else []

    got = []
    for key, problems in entries._checked_in_order(check, list(range(n)), workers):
        with lock:
            ahead = len(started) - len(got)
        assert ahead <= max(1, 2 * workers), (ahead, workers)
        got.append((key, problems))
    assert got == [(k, [f"p{k}"] if k % 3 == 0 else []) for k in range(n)]


def test_checks_run_at_once_in_threads_and_one_at_a_time_for_repair():
    barrier = threading.Barrier(4, timeout=30)       # passed only by four checks under way together
    names = []

    def check(key):
        barrier.wait()
        names.append(threading.current_thread().name)
        return []

    assert [k for k, _ in entries._checked_in_order(check, list(range(8)), 4)] == list(range(8))
    assert len(names) == 8 and all(n.startswith("vidcache-verify") for n in names)
    here = []
    list(entries._checked_in_order(lambda k: here.append(threading.current_thread()) or [], list(range(3)), 1))
    assert here == [threading.current_thread()] * 3


def test_cli_verify_prints_every_entry_in_listing_order(tmp_path, videos):
    """More entries than the window, on a fresh node behind a directory tier, as a user runs it: one OK line per
    entry, in ``ls``' key order, and the count."""
    import json
    names = ["ffv1_10_small", "mjpeg_24", "h264_30", "mpeg4_25_odd"]
    data = tmp_path / "d.jsonl"
    rows = [{"prompt": "<video>", "videos": [{"type": "video", "video": videos[n], "nframes": f}]}
            for n in names for f in (2, 4, 6, 8, 10)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    node, tier = tmp_path / "node", tmp_path / "nfs"
    ok(run_cli(["prewarm", str(data), "--no-progress"], node, tier))
    listed = [e["key"] for e in json.loads(ok(run_cli(["ls", "--json"], node, tier)).stdout)]
    r = ok(run_cli(["verify", "--shared"], node, tier))
    lines = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("OK ")]
    assert len(listed) == len(rows) > 2 * entries.VERIFY_WORKERS
    assert lines == sorted(listed) and f"verify: {len(rows)} ok, 0 bad" in r.stdout, r.stdout
    assert ok(run_cli(["verify", "--shared", "--workers", "1"], node, tier)).stdout == r.stdout
