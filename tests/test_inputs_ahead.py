"""``vidcache.train_inputs_ahead`` (issue 50): the next micro-batches' tensors made in a thread while the step runs.

Exactness: each batch is ``train_inputs_batch``'s own result for it (``torch.equal``, real cached entries, every
family).  Behaviour (a recording stand-in for the hydration, so the thread's progress can be held and counted):
bounded by ``ahead``, in order, a batch's error raised at that batch and the rest still coming, the batches'
own iterator's error ending it, ``close`` ending the thread.  On a CUDA machine: the building thread's device
and stream.
"""
import threading
import time

import pytest
import torch
from support.toy_processors import build_processor

import vidcache
import vidcache.handle
from vidcache import VideoCache, VideoOptions
from vidcache.errors import NotCachedError

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def handles(tmp_path_factory, videos):
    c = VideoCache(tmp_path_factory.mktemp("ahead-cache"))
    out = {f: [vidcache.get(videos[name], VideoOptions(family=f, nframes=4), c)
               for name in ("h264_ntsc", "mpeg4_25_odd", "h264_ntsc")] for f in FAMILIES}
    yield out
    c.close()


def assert_equal_batches(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for a, b in zip(g, w):
            assert sorted(a) == sorted(b)
            for k in b:
                assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("family", FAMILIES)
def test_each_batch_is_train_inputs_batchs_own_result(handles, family):
    proc = build_processor(family)
    a, b, c = handles[family]
    batches = [[[a], [b]], [[c, a]], [[b]]]             # two samples; one sample of two videos; one
    want = [vidcache.train_inputs_batch(proc, m, memo=False, mode="plugin") for m in batches]
    with vidcache.train_inputs_ahead(proc, iter(batches), ahead=2, memo=False, mode="plugin") as made:
        got = list(made)
    assert_equal_batches(got, want)


@pytest.fixture
def recorded(monkeypatch):
    """train_inputs_batch replaced by a stand-in: records each call, returns its groups, raises for a group
    named in ``fail``, and can be held (``gate``)."""
    rec = {"calls": [], "fail": set(), "gate": threading.Event()}
    rec["gate"].set()

    def stand_in(processor, groups, **kw):
        rec["gate"].wait()
        rec["calls"].append((groups, kw))
        if groups in rec["fail"]:
            raise NotCachedError(f"no entry for {groups}")
        return groups
    monkeypatch.setattr(vidcache.handle, "train_inputs_batch", stand_in)
    return rec


def settle(pred, seconds=2.0):
    end = time.monotonic() + seconds
    while not pred() and time.monotonic() < end:
        time.sleep(0.01)


@pytest.mark.parametrize("ahead", [1, 3])
def test_at_most_ahead_batches_are_made_before_they_are_taken(recorded, ahead):
    drawn = []

    def batches():
        for i in range(20):
            drawn.append(i)
            yield f"b{i}"
    with vidcache.train_inputs_ahead(None, batches(), ahead=ahead, device="cpu") as made:
        settle(lambda: len(recorded["calls"]) >= ahead)
        time.sleep(0.2)                                  # room for a thread that would run on
        assert len(recorded["calls"]) == len(drawn) == ahead
        for taken in range(1, 6):
            assert next(made) == f"b{taken - 1}"
            settle(lambda: len(recorded["calls"]) >= taken + ahead)
            time.sleep(0.05)
            assert len(drawn) == taken + ahead
    assert all(kw == {"device": "cpu"} for _, kw in recorded["calls"])


def test_a_batchs_error_is_raised_when_it_is_taken_and_the_next_ones_come(recorded):
    recorded["fail"].add("b1")
    with vidcache.train_inputs_ahead(None, ["b0", "b1", "b2"]) as made:
        assert next(made) == "b0"
        with pytest.raises(NotCachedError, match="no entry for b1"):
            next(made)
        assert next(made) == "b2"
        with pytest.raises(StopIteration):
            next(made)


def test_the_batches_own_error_ends_the_iteration_after_it_is_raised(recorded):
    def batches():
        yield "b0"
        raise KeyError("the sampler broke")
    made = vidcache.train_inputs_ahead(None, batches())
    assert next(made) == "b0"
    with pytest.raises(KeyError, match="the sampler broke"):
        next(made)
    assert list(made) == []
    made.close()


def test_close_ends_the_thread_that_waits_for_room_and_the_one_mid_batch(recorded):
    made = vidcache.train_inputs_ahead(None, (f"b{i}" for i in range(100)), ahead=1)
    settle(lambda: len(recorded["calls"]) == 1)
    made.close()                                          # the thread waits for room
    assert not made._thread.is_alive() and len(recorded["calls"]) == 1
    assert list(made) == []

    recorded["gate"].clear()                             # the next one is mid-batch when closed
    made = vidcache.train_inputs_ahead(None, (f"b{i}" for i in range(100)), ahead=1)
    closing = threading.Thread(target=made.close)
    closing.start()
    time.sleep(0.1)
    assert closing.is_alive()                              # it waits for the batch under way...
    recorded["gate"].set()
    closing.join(5)
    assert not closing.is_alive() and not made._thread.is_alive()     # ...and no other starts
    assert len(recorded["calls"]) <= 2


def test_ahead_must_be_at_least_one():
    with pytest.raises(ValueError, match="ahead must be at least 1"):
        vidcache.train_inputs_ahead(None, [], ahead=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the GPU machine)")
def test_on_cuda_the_thread_uses_the_building_threads_device_and_stream(handles):
    proc = build_processor("qwen2_5_vl")
    a, b, c = handles["qwen2_5_vl"]
    batches = [[[a], [b]], [[c]]]
    dev = torch.cuda.device_count() - 1
    want = [vidcache.train_inputs_batch(proc, m, memo=False, mode="plugin", device=f"cuda:{dev}") for m in batches]
    with torch.cuda.device(dev):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            with vidcache.train_inputs_ahead(proc, batches, memo=False, mode="plugin", device="cuda") as made:
                got = list(made)
            side.synchronize()
    assert all(t.device == torch.device("cuda", dev) for g in got for x in g for t in x.values())
    assert_equal_batches(got, want)
