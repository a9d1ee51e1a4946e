"""Read-ahead (``vidcache.readahead``) and the one-pull-per-node rule under it (``VideoCache.bring_local``,
``store/single_flight``): entries land in a fresh node's local tier before they are read, exactly; the window is
bounded; a pull is never repeated by another thread or process of the node; a failure reaches the read, not the
thread; a corrupt object is never kept; close and kill -9 leave the local tier sound; the CLI's ``pull``."""
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import vidcache
from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.compact import CompactLayout
from vidcache.errors import CorruptManifestError, NotCachedError
from vidcache.store.single_flight import SingleFlight

from support.cli import run_cli
from support.damage import flip_seen_by_decoder

CLIPS = ("ffv1_10_small", "mjpeg_24", "h264_30", "mpeg4_25_odd")


def until(cond, timeout=60.0):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not met in time"
        time.sleep(0.02)


def _in_this_process(monkeypatch):
    """Pulls in this process's threads (``readahead.IN_WORKER`` off), where a test patches the pull itself."""
    from vidcache import readahead
    monkeypatch.setattr(readahead, "IN_WORKER", False)


def at_its_bound(ahead, timeout=60.0):
    """Wait until ``ahead``'s thread is blocked on its bound (waiting on its own condition, which it only does
    once every sample it took is in the window and the window is full) and every pull it started has ended.
    From then on nothing changes until the reader moves, so what the test counts next is the bound's doing, not
    the clock's.  Fails the test after ``timeout``."""
    end = time.monotonic() + timeout
    with ahead._cond:
        # The read-ahead thread is the only waiter on its condition besides the reader (this thread, which
        # holds the lock here): a waiter listed while we hold the lock is that thread, parked.
        while not ahead._cond._waiters:
            assert ahead._thread.is_alive(), f"read-ahead ran to the end of its samples: {ahead.counts}"
            assert time.monotonic() < end, f"read-ahead never stopped at its bound: {ahead.counts}"
            ahead._cond.wait(0.05)            # it notifies on each sample it adds; this also rechecks
        pulls = [f for s in ahead._window for f in s.pulls]
    for f in pulls:
        f.exception(max(0.0, end - time.monotonic()))     # TimeoutError fails the test


@pytest.fixture
def tier(node_a, tmp_path, videos):
    """A directory tier that node A filled with 4 compact entries: (shared path, keys, node A's frames)."""
    shared, a = node_a.shared, node_a.cache
    ks = [a.ensure(videos[n], VideoOptions()).key for n in CLIPS]
    frames = {k: a.frames(k) for k in ks}
    a.close()
    return shared, ks, frames


def local_blobs(cache, ks):
    return [cache.local.exists_many([K.cas(cache.manifest(k).frames.blob)])[0] for k in ks]


def test_entries_land_locally_before_they_are_read_and_are_exact(tmp_path, tier):
    shared, ks, frames = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    handles = [vidcache.from_key(k, b) for k in ks]
    assert not any(local_blobs(b, ks))
    ahead = vidcache.read_ahead(handles, depth=8)
    until(lambda: ahead.counts["pulled"] == len(ks))
    ahead.close()
    b.sync()
    assert all(local_blobs(b, ks))
    # The shared tier goes away: the node's own copies are whole, and exact.
    os.rename(shared, shared + ".gone")
    for k in ks:
        assert torch.equal(_local_frames(b, k), frames[k])


def _local_frames(cache, key):
    """``key``'s frames from the local tier alone (no shared tier is consulted)."""
    m = cache.manifest(key)
    with cache.local.read(K.cas(m.frames.blob)) as v:
        assert v is not None
        return torch.frombuffer(bytearray(m.frames.decode(v)), dtype=torch.uint8).reshape(m.frames.shape)


def test_iterating_yields_the_samples_in_order_each_a_local_hit(tmp_path, tier, monkeypatch):
    shared, ks, frames = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    samples = [[vidcache.from_key(k, b)] for k in ks]
    pulls = []
    real = CompactLayout.prefetch
    monkeypatch.setattr(CompactLayout, "prefetch", lambda self, key: pulls.append(key) or real(self, key))
    seen = []
    with vidcache.read_ahead(samples, depth=2, workers=1) as ahead:
        for s in ahead:
            (h,) = s
            assert b.local.exists_many([K.cas(h.manifest.frames.blob)])[0]     # here before the read
            assert torch.equal(h.frames(), frames[h.key])
            seen.append(h.key)
    assert seen == ks
    # one pull each, by read-ahead's worker process (issue 50): the reads, in this process, pulled nothing
    assert pulls == [] and ahead.counts["pulled"] == len(ks)


def test_the_window_is_bounded_by_samples_and_by_bytes(tmp_path, tier):
    shared, ks, _ = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    handles = [vidcache.from_key(k, b) for k in ks]
    # max_bytes of 1: one sample ahead at a time, whatever its size
    with vidcache.read_ahead(handles, depth=64, max_bytes=1) as ahead:
        at_its_bound(ahead)
        assert ahead.counts["pulled"] == 1 and local_blobs(b, ks) == [True, False, False, False]
        next(ahead)
        at_its_bound(ahead)
        assert ahead.counts["pulled"] == 2
    c = VideoCache(tmp_path / "c", shared=shared)
    with vidcache.read_ahead([vidcache.from_key(k, c) for k in ks], depth=2) as ahead:
        at_its_bound(ahead)
        assert ahead.counts["pulled"] == 2          # depth 2: two samples ahead of a reader that has read none


def test_a_byte_bound_above_the_default_is_kept_without_a_budget(tmp_path, tier):
    shared, ks, _ = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    with vidcache.read_ahead([vidcache.from_key(k, b) for k in ks], max_bytes=8 << 30) as ahead:
        until(lambda: ahead.counts["pulled"] == len(ks))
    assert ahead.max_bytes == 8 << 30


def test_a_failed_pull_is_tried_again_when_a_later_sample_asks(tmp_path, tier, monkeypatch):
    """A pull that failed (a tier outage) is not remembered as the key's pull: the next sample naming the key
    pulls it again."""
    _in_this_process(monkeypatch)
    from vidcache.errors import SharedUnavailableError
    shared, ks, frames = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    real, calls = CompactLayout.expand, []
    k, other = ks[0], ks[1]

    def flaky(self, m, value=None, **kw):
        calls.append(m.key)
        if calls.count(k) == 1 and m.key == k:     # k's first pull (other's may start first: two workers)
            raise SharedUnavailableError("the tier is down for a moment")
        return real(self, m, value, **kw)
    monkeypatch.setattr(CompactLayout, "expand", flaky)
    samples = [[vidcache.from_key(x, b)] for x in (k, other, k)]
    with vidcache.read_ahead(samples, depth=1) as ahead:
        next(ahead)                               # its pull failed
        assert ahead.counts["failed"] == 1 and local_blobs(b, [k]) == [False]
        next(ahead)                               # the failed pull has ended: the third sample asks anew
        next(ahead)
    b.sync()
    assert ahead.counts["pulled"] == 2 and local_blobs(b, [k]) == [True], ahead.counts
    assert sorted(calls) == sorted([k, other, k]), calls


def test_a_local_budget_halves_the_window(tmp_path, tier):
    shared, ks, _ = tier
    sizes = [VideoCache(tmp_path / "x", shared=shared).manifest(k).frames.nbytes for k in ks]
    budget = 2 * sizes[0]                     # half of it: room for the first sample only
    b = VideoCache(tmp_path / "b", shared=shared, max_local_bytes=budget)
    with vidcache.read_ahead([vidcache.from_key(k, b) for k in ks], depth=64) as ahead:
        at_its_bound(ahead)
        assert ahead.counts["pulled"] == 1 and ahead.max_bytes == budget // 2


def test_one_pull_per_key_for_many_samples_and_threads(tmp_path, tier, monkeypatch):
    _in_this_process(monkeypatch)
    shared, ks, frames = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    pulls = []
    real = CompactLayout.expand

    def slow_expand(self, m, value=None, **kw):
        pulls.append(m.key)
        time.sleep(0.3)                       # a slow tier: the other askers arrive while it is under way
        return real(self, m, value, **kw)
    monkeypatch.setattr(CompactLayout, "expand", slow_expand)
    k = ks[0]
    # the same video in 6 samples of one read-ahead, two read-aheads, and a direct reader
    samples = [[vidcache.from_key(k, b)] for _ in range(6)]
    one, two = vidcache.read_ahead(samples, workers=2), vidcache.read_ahead(samples, workers=2)
    time.sleep(0.05)
    got = b.frames(k)
    one.close(), two.close()
    assert torch.equal(got, frames[k])
    assert pulls == [k]


def _pull_in_child(node, shared, key, barrier, out):
    from vidcache.compact import CompactLayout as CL
    real = CL.expand

    def slow_expand(self, m, value=None, **kw):
        time.sleep(0.5)
        return real(self, m, value, **kw)
    CL.expand = slow_expand
    c = VideoCache(node, shared=shared)
    c.manifest(key)
    barrier.wait()
    out.put(c.bring_local(key))
    c.close()


def test_one_pull_per_key_across_the_processes_of_a_node(tmp_path, tier):
    shared, ks, frames = tier
    node = str(tmp_path / "b")
    VideoCache(node, shared=shared).close()
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_pull_in_child, args=(node, shared, ks[1], barrier, out)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert sorted(got) == [False, False, True]       # one process pulled; the others found it local
    assert torch.equal(VideoCache(node, shared=shared).frames(ks[1]), frames[ks[1]])


def test_a_dead_puller_does_not_block_the_node(tmp_path, tier):
    """The lock goes with its holder: a process killed mid-pull leaves nobody waiting, and the local tier sound."""
    shared, ks, frames = tier
    node = tmp_path / "b"
    code = ("import sys, time, os, signal; from vidcache import VideoCache; from vidcache.compact import CompactLayout as CL\n"
            "real = CL.expand\n"
            "def hang(self, m, value=None, **kw):\n"
            "    print('pulling', flush=True); time.sleep(60)\n"
            "CL.expand = hang\n"
            f"c = VideoCache({str(node)!r}, shared={shared!r}); c.bring_local({ks[2]!r})\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "pulling"
    lock = SingleFlight(str(node / "locks"))
    with lock.hold(ks[2], 0.0) as held:
        assert not held                                   # the child holds it
    p.send_signal(signal.SIGKILL)
    p.wait(30)
    with lock.hold(ks[2], 0.0) as held:
        assert held                                       # gone with it
    b = VideoCache(node, shared=shared)
    assert b.bring_local(ks[2]) is True and torch.equal(b.frames(ks[2]), frames[ks[2]])
    assert b.verify(ks[2]) == []


def test_a_stuck_puller_is_outwaited(tmp_path):
    lock = SingleFlight(str(tmp_path / "locks"))
    with lock.hold("k", 1.0) as held:
        assert held
        t = threading.Thread(target=lambda: out.append(lock.wait("k", 0.3)))
        out = []
        t.start()
        t.join(10)
        assert out == [True]                              # waited, then gave up on the holder: never a hang
        with lock.hold("k", 0.2) as again:
            assert not again


def test_a_corrupt_object_is_never_kept_and_the_failure_reaches_the_read(tmp_path, tier):
    shared, ks, _ = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    k = ks[3]
    path = b.shared._path(CompactLayout.key(k))
    rotted = flip_seen_by_decoder(open(path, "rb").read(), b.manifest(k), bit=0x01)
    open(path, "wb").write(rotted)
    h = vidcache.from_key(k, b)
    with vidcache.read_ahead([h]) as ahead:
        until(lambda: ahead.counts["failed"] == 1)
        assert next(ahead) is h                           # the sample comes, its pull failed quietly
    assert local_blobs(b, [k]) == [False]                 # nothing of it was kept
    with pytest.raises(NotCachedError, match=f"{k}.*quarantined a corrupt copy.*compact object"):
        h.frames()                  # the read meets it: the entry is a miss now, and the miss names the cause


def test_entries_not_cached_are_left_to_the_read_which_builds_them(tmp_path, videos, count_decodes):
    b = VideoCache(tmp_path / "b", shared=str(tmp_path / "nfs"))
    h = vidcache.lazy(videos["ffv1_10_small"], VideoOptions(), b)
    with vidcache.read_ahead([h]) as ahead:
        assert next(ahead) is h
    assert ahead.counts == {"pulled": 0, "local": 0, "not_cached": 1, "failed": 0} and count_decodes == []
    assert h.frames().shape[0] > 0 and len(count_decodes) == 1


def test_close_cancels_what_has_not_started(tmp_path, tier, monkeypatch):
    _in_this_process(monkeypatch)
    shared, ks, _ = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    real = CompactLayout.expand
    started = threading.Event()

    def slow_expand(self, m, value=None, **kw):
        started.set()
        time.sleep(0.5)
        return real(self, m, value, **kw)
    monkeypatch.setattr(CompactLayout, "expand", slow_expand)
    ahead = vidcache.read_ahead([vidcache.from_key(k, b) for k in ks], workers=1)
    assert started.wait(30)
    ahead.close()
    assert ahead.counts["pulled"] == 1                    # the one under way finished; the rest never started
    assert not ahead._thread.is_alive() and not [t for t in ahead._pool._threads if t.is_alive()]   # none left
    b.sync()
    assert local_blobs(b, ks).count(True) == 1


def test_advance_moves_past_samples_read_elsewhere(tmp_path, tier):
    shared, ks, _ = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    with vidcache.read_ahead([vidcache.from_key(k, b) for k in ks], depth=1) as ahead:
        ahead.advance(3)                                  # the reader took three by itself
        until(lambda: local_blobs(b, ks)[3])              # the fourth comes ahead of it
    b.sync()
    assert local_blobs(b, ks)[1:3] == [False, False]      # the second and third were never pulled (the first
                                                          # may have been under way already)


def test_kill_mid_read_ahead_leaves_the_local_tier_sound(tmp_path, tier):
    shared, ks, frames = tier
    node = tmp_path / "b"
    code = ("import os, signal, vidcache; from vidcache import VideoCache\n"
            f"c = VideoCache({str(node)!r}, shared={shared!r})\n"
            f"a = vidcache.read_ahead([vidcache.from_key(k, c) for k in {ks!r}], workers=2)\n"
            "import time\n"
            "while a.counts['pulled'] < 1: time.sleep(0.001)\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], timeout=120)
    assert r.returncode == -signal.SIGKILL
    b = VideoCache(node, shared=shared)
    assert all(b.verify(k) == [] for k in ks)
    for k in ks:
        assert torch.equal(b.frames(k), frames[k])


def test_a_datasets_read_ahead_pulls_before_its_first_row_is_asked_for(tmp_path, tier, videos):
    """Issue 50: ``LazyVideoDataset.read_ahead`` starts pulling when it is built (a trainer builds it before its
    model loads), so the first rows' entries are local before the loop asks for row 1; then it yields the rows in
    the order given, each a local hit with node A's frames."""
    from vidcache.dataset import LazyVideoDataset
    shared, ks, frames = tier
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n" for n in CLIPS))
    b = VideoCache(tmp_path / "node_b", shared=shared)
    ds = LazyVideoDataset(str(data), b, VideoOptions())
    order = [2, 0, 3, 1]
    ahead = ds.read_ahead(order, depth=2)
    try:
        until(lambda: all(local_blobs(b, [ks[2], ks[0]])))     # the first two rows' entries; no row asked for yet
        rows = list(ahead)
        assert [r.index for r in rows] == order
        assert all(local_blobs(b, ks))
        for r in rows:
            (h,) = r.handles
            assert torch.equal(h.frames(), frames[ks[r.index]])
        assert ahead.counts["failed"] == 0 and ahead.counts["pulled"] == 4
    finally:
        ahead.close()
        b.close()


# --- the CLI, as a user runs it on a fresh node --------------------------------------------------------------


def test_cli_pull_fills_a_fresh_node_that_then_reads_without_the_tier(tmp_path, videos):
    data = tmp_path / "train.jsonl"
    rows = [{"prompt": "<video> a", "videos": [videos["ffv1_10_small"]]},
            {"prompt": "<video><video> b", "videos": [videos["mjpeg_24"], videos["ffv1_10_small"]]},
            {"prompt": "text only"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shared, a, b = tmp_path / "nfs", tmp_path / "node_a", tmp_path / "node_b"
    r = run_cli(["prewarm", str(data), "--no-progress"], a, shared)
    assert r.returncode == 0, r.stderr
    r = run_cli(["pull", str(data)], b, shared)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "pull: 2 pulled, 0 already here, 0 not cached" in r.stdout, r.stdout
    r = run_cli(["pull", str(data)], b, shared)
    assert "pull: 0 pulled, 2 already here" in r.stdout, r.stdout
    # node B draws the same contact sheets as node A with the tier gone (its own copies only)
    sheets = {}
    for node in (a, b):
        if node == b:
            shutil.move(str(shared), str(tmp_path / "elsewhere"))
        for name in ("ffv1_10_small", "mjpeg_24"):
            out = tmp_path / f"{node.name}_{name}.png"
            r = run_cli(["inspect", videos[name], "--contact-sheet", str(out)], node, shared)
            assert r.returncode == 0, r.stderr
            sheets[node.name, name] = out.read_bytes()
    assert all(sheets["node_a", n] == sheets["node_b", n] for n in ("ffv1_10_small", "mjpeg_24"))


def test_cli_pull_without_a_shared_tier_is_a_config_error(tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text("{}\n")
    r = run_cli(["pull", str(data)], tmp_path / "n", timeout=120)
    assert r.returncode == 1 and "[config]" in r.stderr and "no shared tier" in r.stderr and "Traceback" not in r.stderr


def test_an_unsealed_manifest_is_never_kept_or_served(tmp_path, tier):
    """A shared manifest with one digit changed fails its seal: read-ahead keeps nothing of the entry (neither the
    manifest nor its frames) and serves nothing; the read that needs it raises ``CorruptManifestError``."""
    import re

    from vidcache.manifest import blob_of
    shared, ks, _ = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    k = ks[0]
    path = b.shared._path(K.ac(k))
    raw = open(path, "rb").read()
    blob = blob_of(raw)
    m = re.search(rb'"created_unix": *([0-9])', raw)                 # a field the seal covers
    digit = m.group(1)
    raw = raw[:m.start(1)] + (b"8" if digit == b"9" else b"9") + raw[m.end(1):]
    open(path, "wb").write(raw)
    h = vidcache.VideoHandle(None, VideoOptions(), b.identity, key=k)._bind(b)
    with vidcache.read_ahead([h]) as ahead:
        assert next(ahead) is h
    assert ahead.counts == {"pulled": 0, "local": 0, "not_cached": 0, "failed": 1}
    assert b.local.get(K.ac(k)) is None and not b.local.exists_many([K.cas(blob)])[0]
    with pytest.raises(CorruptManifestError, match=k):
        h.frames()                                        # the read meets it, by its specific error


def test_a_sample_that_is_neither_a_handle_nor_an_iterable_is_a_clear_error_not_a_hang(tmp_path, tier):
    """D52: ``read_ahead([h0, 7, h1])`` returned one sample, then waited for ever (the ``TypeError`` killed the
    background thread).  The samples before it are served, then ``BadRowError`` names the sample."""
    from vidcache.errors import BadRowError
    shared, ks, frames = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    got, err = [], []

    def read():
        try:
            with vidcache.read_ahead([vidcache.from_key(ks[0], b), 7, vidcache.from_key(ks[1], b)]) as ahead:
                got.extend(ahead)
        except BadRowError as e:
            err.append(e)
    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "read_ahead hung on a sample of 7"
    assert [h.key for h in got] == [ks[0]] and "sample 1 is a int" in str(err[0])


def test_a_dict_sample_pulls_its_handles(tmp_path, tier):
    """D52: a ``dict`` sample silently pulled nothing; its values (a handle, a list of handles) are pulled."""
    shared, ks, frames = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    samples = [{"video": vidcache.from_key(ks[0], b), "videos": [vidcache.from_key(k, b) for k in ks[1:3]],
                "prompt": "<video>"}]
    with vidcache.read_ahead(samples) as ahead:
        assert list(ahead) == samples
    assert ahead.counts["pulled"] == 3 and local_blobs(b, ks[:3]) == [True] * 3


_EXIT_CHILD = r"""
import sys, time
from vidcache import VideoCache
from vidcache.readahead import pull_soon
node, tier, log = sys.argv[1:]
def stuck(self, key):                 # a pull to a hung tier: each ends only at the tier's timeout
    with open(log, "a") as f:
        f.write(key + "\n")
    time.sleep(1.0)
VideoCache.bring_local = stuck
c = VideoCache(node, shared=tier)
print(pull_soon(c, ["k%03d" % i for i in range(40)]), flush=True)
"""


def test_queued_hinted_pulls_are_dropped_at_exit(tmp_path, tier):
    """D48: ``pull_soon``'s queue ran to its end at interpreter exit (642 s at a 5 s timeout, about 2.1 h at 60 s,
    after a vLLM server was told to stop).  Counted in pulls started, not seconds: of 40 queued, only those
    under way when ``main`` returned (at most one per worker) run."""
    from vidcache.readahead import WORKERS
    shared, ks, frames = tier
    log = tmp_path / "pulls.log"
    r = subprocess.run([sys.executable, "-c", _EXIT_CHILD, str(tmp_path / "b"), shared, str(log)],
                       env={**os.environ, "PYTHONPATH": os.getcwd()}, capture_output=True, text=True, timeout=200)
    assert r.returncode == 0 and r.stdout.strip() == "40", r.stdout + r.stderr
    started = log.read_text().split() if log.exists() else []
    assert len(started) <= WORKERS, started


def test_a_pool_shut_down_under_it_is_taken_as_its_close(node_a, tmp_path, videos, monkeypatch):
    """At interpreter exit concurrent.futures shuts every pool down before the read-ahead's own thread stops, and
    refuses new work (``RuntimeError: cannot schedule new futures after shutdown``, a traceback from the thread at
    the end of every script that never closed it); the read-ahead takes that as its close."""
    _in_this_process(monkeypatch)
    from vidcache.readahead import ReadAhead, _Sample
    a = node_a.cache
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(fps=1.0), a)
    b = VideoCache(tmp_path / "b", shared=str(tmp_path / "tier"))
    ra = ReadAhead(iter([]), depth=1)
    ra._pool.shutdown(wait=True)          # what the interpreter's exit hook does first
    ra._schedule(_Sample(0, None), vidcache.from_key(h.key, b))   # before: RuntimeError in the thread
    assert ra._closed and ra.counts["failed"] == 0
    ra.close()


# --- the pull worker (issue 50): pulls in a process of their own, out of reach of the reader's GIL -----------


@pytest.fixture
def fresh_worker(monkeypatch):
    """This process's pull worker ended, so the next read-ahead starts one with the test's environment."""
    from vidcache import pullworker

    def end():
        with pullworker._WORKER_LOCK:
            w = pullworker._WORKER.pop(os.getpid(), None)
        if w is not None:
            w.kill()
    end()
    yield pullworker
    end()


def test_a_worker_killed_mid_pull_is_replaced_and_the_local_tier_stays_sound(tmp_path, tier, monkeypatch,
                                                                               fresh_worker):
    """kill -9 of the pull worker while it holds a pull (its key's lock, inside the decode): the sample whose pull
    died is served (its read pulls by itself), a new worker pulls the rest, and every entry verifies."""
    shared, ks, frames = tier
    hook = os.path.join(os.path.dirname(__file__), "support", "hang_pull")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([hook, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("VIDCACHE_TEST_HANG_KEY", ks[0])
    node = tmp_path / "b"
    b = VideoCache(node, shared=shared)
    handles = [vidcache.from_key(k, b) for k in ks]
    lock = SingleFlight(str(node / "locks"))

    def worker_holds(key):
        with lock.hold(key, 0.0) as held:
            return not held
    with vidcache.read_ahead(handles, depth=1, workers=1) as ahead:
        until(lambda: worker_holds(ks[0]))                # the worker is inside ks[0]'s pull
        old = fresh_worker._WORKER[os.getpid()]
        os.kill(old.proc.pid, signal.SIGKILL)
        until(lambda: old.dead)                           # seen gone (a pull asked before that fails with it)
        assert next(ahead) is handles[0]                  # served: its pull failed with the worker
        assert not worker_holds(ks[0])                    # the lock went with it
        for h in handles[1:]:
            assert next(ahead) is h
            assert local_blobs(b, [h.key]) == [True], (h.key, ahead.counts)   # pulled ahead of it, by the new worker
        new = fresh_worker._WORKER[os.getpid()]
    assert new is not old and new.proc.pid != old.proc.pid and old.proc.returncode == -signal.SIGKILL
    assert ahead.counts == {"pulled": 3, "local": 0, "not_cached": 0, "failed": 1}, ahead.counts
    assert torch.equal(handles[0].frames(), frames[ks[0]])    # the read pulls it by itself
    b.sync()
    assert all(b.verify(k) == [] for k in ks)
    for k in ks:
        assert torch.equal(_local_frames(b, k), frames[k])


def test_close_with_the_worker_cancels_what_has_not_started_and_waits_for_the_rest(tmp_path, tier, monkeypatch,
                                                                                    fresh_worker):
    """close() while the worker is inside one pull (hung here): the queued ones are dropped by the worker, the
    one under way is waited for at most its bound, then the worker is ended (and replaced on the next ask)."""
    shared, ks, frames = tier
    hook = os.path.join(os.path.dirname(__file__), "support", "hang_pull")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([hook, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("VIDCACHE_TEST_HANG_KEY", ks[0])
    b = VideoCache(tmp_path / "b", shared=shared)
    monkeypatch.setattr(type(b.reads), "_pull_wait_s", property(lambda self: 1.0))   # the bound close waits
    lock = SingleFlight(str(tmp_path / "b" / "locks"))
    ahead = vidcache.read_ahead([vidcache.from_key(k, b) for k in ks], workers=1)
    until(lambda: not lock.hold(ks[0], 0.0).__enter__())
    until(lambda: len(ahead._asked) == len(ks))           # all four asked: one under way, three queued
    w = fresh_worker._WORKER[os.getpid()]
    ahead.close()
    assert w.proc.poll() is not None                      # ended: it outlasted the bound
    b.sync()
    assert local_blobs(b, ks) == [False] * 4              # the queued three were never pulled
    assert all(b.verify(k) == [] for k in ks)
    with vidcache.read_ahead([vidcache.from_key(k, b) for k in ks[1:]]) as again:   # a new worker
        assert [h.key for h in again] == ks[1:]
    assert again.counts["pulled"] == 3 and local_blobs(b, ks[1:]) == [True] * 3


def test_only_settings_cross_to_the_worker_and_a_custom_store_stays_in_process(tmp_path, tier):
    """What the worker is sent is JSON (the cache's settings; never a pickle); a cache it cannot rebuild from
    settings (a custom store object) pulls in this process's threads, as before."""
    import json as _json

    from vidcache import pullworker
    from vidcache.store.memory import MemoryStore
    shared, ks, _ = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    s = pullworker.settings_of(b)
    assert _json.loads(_json.dumps(s))["shared"] == shared and s["path"] == str(tmp_path / "b")
    assert pullworker.settings_of(VideoCache(tmp_path / "c", store=MemoryStore())) is None
    assert pullworker.settings_of(VideoCache(tmp_path / "d")) is None             # nothing to pull from


def test_a_worker_started_under_another_environment_is_replaced(tmp_path, tier, monkeypatch, fresh_worker):
    """The worker reads credentials and endpoints from the environment it started with (AWS_*, FSSPEC_*): one
    started before the trainer set them would fail every pull (seen in the suite: a worker started by a test on a
    directory tier, reused by a test whose S3 credentials came later).  A changed environment gets a new worker."""
    shared, ks, frames = tier
    b = VideoCache(tmp_path / "b", shared=shared)
    with vidcache.read_ahead([vidcache.from_key(ks[0], b)], workers=1) as ahead:
        assert next(ahead).key == ks[0]
    first = fresh_worker._WORKER[os.getpid()]
    monkeypatch.setenv("VIDCACHE_TEST_CREDENTIAL", "set after the worker started")
    with vidcache.read_ahead([vidcache.from_key(k, b) for k in ks[1:]], workers=1) as ahead:
        assert [h.key for h in ahead] == ks[1:]
    second = fresh_worker._WORKER[os.getpid()]
    assert second is not first and second.environ["VIDCACHE_TEST_CREDENTIAL"] == "set after the worker started"
    until(lambda: first.proc.poll() is not None)                 # the old one exits by itself
    assert ahead.counts["failed"] == 0 and ahead.counts["pulled"] == len(ks) - 1, ahead.counts
    assert all(torch.equal(_local_frames(b, k), frames[k]) for k in ks)
