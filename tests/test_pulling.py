"""``vidcache.pulling.pull`` (the ``pull`` job) runs each video's lookup and pull in its threads: a fresh node's
round trips to the shared tier (the source record, the manifest, the object) overlap instead of following each
other in the caller's thread, within ``depth`` and ``max_bytes``; the entries land exactly.  The CLI's own runs
of ``pull`` are in test_readahead.py, test_human_output.py and test_s3_faults.py."""
import json
import threading

import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache import pulling

CLIPS = ("ffv1_10_small", "mjpeg_24", "h264_30", "mpeg4_25_odd")


@pytest.fixture
def filled(node_a, tmp_path, videos):
    """A directory tier that node A filled with 4 entries, and a dataset of one row per video:
    (shared path, dataset path, key -> node A's frames)."""
    shared, a = node_a.shared, node_a.cache
    ks = [a.ensure(videos[n], VideoOptions()).key for n in CLIPS]
    frames = {k: a.frames(k) for k in ks}
    a.close()
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n" for n in CLIPS))
    return shared, data, frames


def test_lookups_overlap_in_the_pull_threads(tmp_path, filled, monkeypatch):
    """Each video's source record is read from the shared tier in a pull thread: four reads wait for each other at
    a barrier of four, which only lookups under way at once can pass (one after another, the first would wait
    until the barrier's timeout breaks it, and every pull would fail)."""
    shared, data, frames = filled
    b = VideoCache(tmp_path / "b", shared=shared)
    barrier, passed = threading.Barrier(len(CLIPS), timeout=30), []
    real_get = b.shared.get

    def get(key):
        if key.startswith(K.SRC):
            barrier.wait()
            passed.append(threading.current_thread().name)
        return real_get(key)

    monkeypatch.setattr(b.shared, "get", get)
    try:
        s = pulling.pull(str(data), b, VideoOptions())
        assert (s.pulled, s.local, s.failed, s.not_cached) == (4, 0, 0, 0), s.failures
        assert len(passed) == len(CLIPS) and all(n.startswith("vidcache-pull") for n in passed), passed
        for k, want in frames.items():
            assert torch.equal(b.frames(k), want)
    finally:
        b.close()


@pytest.mark.parametrize("budget_entries", [1, 2])
def test_max_bytes_bounds_the_frames_being_pulled(tmp_path, filled, monkeypatch, budget_entries):
    """With ``max_bytes`` the size of the largest entry (or two), at most one (two) entries are pulled at once,
    counted around ``bring_local``; every entry still lands, exactly."""
    shared, data, frames = filled
    b = VideoCache(tmp_path / "b", shared=shared)
    sizes = sorted(b.manifest(k).frames.nbytes for k in frames)
    budget = sum(sizes[-budget_entries:])
    state = {"now": 0, "bytes": 0, "peak_bytes": 0, "most": 0}
    lock = threading.Lock()
    real = b.bring_local

    def bring_local(key):
        n = b.manifest(key).frames.nbytes
        with lock:
            state["now"] += 1
            state["bytes"] += n
            state["most"] = max(state["most"], state["now"])
            state["peak_bytes"] = max(state["peak_bytes"], state["bytes"])
        try:
            threading.Event().wait(0.05)            # a pull that takes a while, so others would overlap it
            return real(key)
        finally:
            with lock:
                state["now"] -= 1
                state["bytes"] -= n

    monkeypatch.setattr(b, "bring_local", bring_local)
    try:
        s = pulling.pull(str(data), b, VideoOptions(), max_bytes=budget)
        assert (s.pulled, s.failed) == (4, 0), s.failures
        assert state["peak_bytes"] <= budget and state["most"] <= budget_entries, state
        for k, want in frames.items():
            assert torch.equal(b.frames(k), want)
    finally:
        b.close()


def test_an_entry_larger_than_max_bytes_is_pulled_alone(tmp_path, filled):
    shared, data, frames = filled
    b = VideoCache(tmp_path / "b", shared=shared)
    try:
        s = pulling.pull(str(data), b, VideoOptions(), max_bytes=1, depth=2)
        assert (s.pulled, s.failed) == (4, 0), s.failures
        assert all(torch.equal(b.frames(k), want) for k, want in frames.items())
    finally:
        b.close()


def test_byte_budget_waits_for_room_and_lets_an_oversized_entry_through_alone():
    bytes_ = pulling._Bytes(10)
    order, release = [], threading.Event()

    def second():
        with bytes_.held(6):
            order.append("second in")
            release.wait(10)

    with bytes_.held(6):
        t = threading.Thread(target=second)
        t.start()
        t.join(0.2)
        assert t.is_alive() and order == []          # 6 + 6 > 10: it waits
        order.append("first out")
    for _ in range(500):
        if order[-1] == "second in":
            break
        t.join(0.01)
    assert order == ["first out", "second in"] and bytes_.used == 6 and bytes_.peak == 6
    release.set()
    t.join(10)
    assert bytes_.used == 0
    big = pulling._Bytes(1)
    with big.held(100):                              # nothing else held: larger than the limit, yet let through
        assert big.used == 100
    assert big.used == 0 and big.peak == 100
