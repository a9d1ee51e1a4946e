"""Trainer inputs made where the trainer runs (issue 16): ``device=`` and the micro-batch API.

On the CPU (CI): the device path with ``device="cpu"`` (probe, per-video split, batch, memo) equals the
existing path, a direct call of HF's processor on the group's frames, under ``torch.equal``, for all three
families; odd frame counts, tight and default budgets, and random shapes (hypothesis).
On a CUDA machine the ``cuda`` tests run the same equality with ``device="cuda"`` on real cached entries,
and on every test clip of ``tests/conftest.py`` for every family, read by a fresh node from a shared tier.
"""
import logging

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.toy_processors import build_processor

import vidcache
from vidcache import VideoCache, VideoOptions
from vidcache.device import PinnedPool, _why_not_exact, exact_device, probe_frames
from vidcache.processing import (MEMO, VIDEO_PLACEHOLDER, Memo, join_videos, model_tensors, process,
                                 processor_kwargs, split_per_video)

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
MODES = ["plugin", "stock"]
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (run on the GPU machine)")


@pytest.fixture(scope="module")
def processors():
    return {f: build_processor(f) for f in FAMILIES}


def reference(proc, handles, mode):
    """The existing path: one call of HF's processor on the group's cached frames."""
    manifests = [h.manifest for h in handles]
    out = proc(text=[VIDEO_PLACEHOLDER * len(handles)], videos=[h.frames() for h in handles],
               **processor_kwargs(proc, manifests, mode))
    return model_tensors(out)


def assert_same(got, want, device="cpu"):
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].device.type == torch.device(device).type, k
        assert got[k].dtype == want[k].dtype, k
        assert torch.equal(got[k].cpu(), want[k].cpu()), k


def options_for(family, mode, budget, **kw):
    make = VideoOptions.for_stock_sglang if mode == "stock" else VideoOptions
    tight = 2 * 224 * 224 if (family, mode) == ("qwen3_vl", "stock") else 60_000   # stock Qwen3: the 224 grid
    extra = {"min_pixels": 3136, "max_pixels": tight} if budget == "tight" else {}
    return make(family=family, **extra, **kw)


@pytest.fixture(scope="module")
def entries(tmp_path_factory, videos):
    """(family, mode, budget) -> two handles to real cached entries of different shapes."""
    c = VideoCache(tmp_path_factory.mktemp("device-cache"))
    out = {}
    for family in FAMILIES:
        for mode in MODES:
            for budget in ("default", "tight"):
                out[family, mode, budget] = [
                    vidcache.get(videos["h264_ntsc"], options_for(family, mode, budget), c),
                    vidcache.get(videos["mpeg4_25_odd"], options_for(family, mode, budget, nframes=6), c)]
    yield out
    c.close()


# --- device="cpu" equals the existing path ------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("budget", ["default", "tight"])
def test_device_cpu_equals_the_processor_call(entries, processors, family, mode, budget):
    proc = processors[family]
    a, b = entries[family, mode, budget]
    if budget == "tight":
        d = entries[family, mode, "default"][0].manifest
        assert a.manifest.height * a.manifest.width < d.height * d.width
    for handles in ([a], [b], [a, b], [b, a, b]):
        want = reference(proc, handles, mode)
        for batched in (True, False):
            assert_same(vidcache.train_inputs(proc, handles, mode, memo=False, device="cpu", batched=batched), want)
        assert_same(vidcache.train_inputs(proc, handles, mode), want)          # memo on (cold or warm)
        assert_same(vidcache.train_inputs(proc, handles, mode), want)          # warm


@pytest.mark.parametrize("family", FAMILIES)
def test_a_micro_batch_equals_each_sample_alone(entries, processors, family):
    """Groups share videos (n_samples_per_prompt copies) and mix shapes; each group gets exactly what the
    per-group call gives, whether the processor ran once for all videos or once per video."""
    proc = processors[family]
    a, b = entries[family, "plugin", "default"]
    c, _ = entries[family, "plugin", "tight"]
    groups = [[a], [a], [b, c], [], [c], [a, b, c]]
    want = [reference(proc, g, "plugin") if g else {} for g in groups]
    for batched in (True, False):
        got = vidcache.train_inputs_batch(proc, groups, "plugin", memo=False, device="cpu", batched=batched)
        assert len(got) == len(groups)
        for g, w in zip(got, want):
            if w:
                assert_same(g, w)
            else:
                assert g == {}


def test_the_batch_reads_each_distinct_video_once(entries, processors, monkeypatch):
    import vidcache.handle as handle_mod
    proc = processors["qwen2_5_vl"]
    a, b = entries["qwen2_5_vl", "plugin", "default"]
    reads = []
    real = handle_mod.VideoHandle.frames
    monkeypatch.setattr(handle_mod.VideoHandle, "frames", lambda self, out=None: reads.append(self.key) or
                        real(self, out))
    vidcache.train_inputs_batch(proc, [[a], [a], [a, b], [b]], memo=False, mode="plugin")
    assert sorted(reads) == sorted([a.key, b.key])


@pytest.mark.parametrize("family", FAMILIES)
def test_handle_method_takes_device(entries, processors, family):
    h, _ = entries[family, "plugin", "default"]
    assert_same(h.train_inputs(processors[family], device="cpu", memo=False, mode="plugin"),
                reference(processors[family], [h], "plugin"))


# --- random shapes, odd frame counts (temporal padding) ---------------------------------------------
def _meta(rng_fps, t, total):
    step = max(1, total // max(t, 1))
    return {"fps": rng_fps, "frames_indices": [i * step for i in range(t)], "total_num_frames": total}


class _M:
    """A manifest stand-in with what ``video_metadata`` reads (plugin mode)."""

    def __init__(self, family, t, fps):
        from types import SimpleNamespace
        self.family = family
        self.num_frames = t
        self.source = SimpleNamespace(average_fps_from_decoder=fps)
        self.sampling = SimpleNamespace(frame_indices=list(range(0, 3 * t, 3)), total_num_frames=3 * t + 1)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(family=st.sampled_from(FAMILIES), mode=st.sampled_from(MODES), data=st.data(),
       n=st.integers(1, 3), seed=st.integers(0, 2**31 - 1))
def test_random_shapes_split_and_batch_equal_one_call(processors, family, mode, data, n, seed):
    """For random videos (odd and even T, any grid), process() per video and batched equals one HF call,
    and split/join are exact inverses."""
    proc = processors[family]
    f = {"qwen3_vl": 32}.get(family, 28)
    g = torch.Generator().manual_seed(seed)
    frames, manifests = [], []
    for _ in range(n):
        t = data.draw(st.integers(1, 7), label="T")
        h, w = f * data.draw(st.integers(1, 4), label="h"), f * data.draw(st.integers(1, 4), label="w")
        frames.append(torch.randint(0, 256, (t, 3, h, w), dtype=torch.uint8, generator=g))
        manifests.append(_M(family, t, data.draw(st.sampled_from([24.0, 25.0, 29.97002997002997, 30.0]))))
    one = model_tensors(proc(text=[VIDEO_PLACEHOLDER * n], videos=frames, **processor_kwargs(proc, manifests, mode)))
    for batched in (True, False):
        per_video = process(proc, frames, manifests, mode, batched=batched)
        assert len(per_video) == n
        assert_same(join_videos(per_video), one)
        for i, pv in enumerate(per_video):    # each video alone gives exactly its slice
            alone = model_tensors(proc(text=[VIDEO_PLACEHOLDER], videos=[frames[i]],
                                       **processor_kwargs(proc, [manifests[i]], mode)))
            assert_same(pv, alone)
    assert all(torch.equal(a, b) for k in one for a, b in [(join_videos(split_per_video(one))[k], one[k])])


# --- the exactness probe and its fallback -------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_probe_holds_every_value_in_every_channel_at_an_odd_frame_count(processors, family):
    vp = processors[family].video_processor
    p = probe_frames(vp.temporal_patch_size, vp.patch_size, vp.merge_size)
    t, c, h, w = p.shape
    assert p.dtype == torch.uint8 and t % vp.temporal_patch_size and c == 3
    assert h % (vp.patch_size * vp.merge_size) == 0 and w % (vp.patch_size * vp.merge_size) == 0
    for frame in p:
        for plane in frame:
            assert torch.unique(plane).numel() == 256


def test_the_cpu_needs_no_probe(processors):
    assert exact_device(processors["qwen2_vl"], "cpu") == torch.device("cpu")
    assert exact_device(processors["qwen2_vl"], None) == torch.device("cpu")


def test_a_device_that_fails_falls_back_to_the_cpu_with_one_log_line(processors, caplog):
    """The meta device computes no values: the probe fails there, so the CPU is used, and said once."""
    proc = build_processor("qwen2_vl", video_processor_kwargs={"image_std": [0.25, 0.25, 0.25]})  # a fresh config
    with caplog.at_level(logging.WARNING, logger="vidcache.device"):
        assert exact_device(proc, "meta") == torch.device("cpu")
        assert exact_device(proc, "meta") == torch.device("cpu")
    lines = [r.getMessage() for r in caplog.records if r.name == "vidcache.device"]
    assert len(lines) == 1 and "not meta" in lines[0] and "Qwen2VLVideoProcessor" in lines[0], lines


def test_a_processor_whose_device_output_differs_is_refused(processors):
    """The probe compares values: a processor that changes one element off the CPU is caught."""
    base = processors["qwen2_5_vl"]

    class Drifting:
        patch_size, temporal_patch_size, merge_size = 14, 2, 2
        calls = 0

        def to_json_string(self):
            return "{}"

        def __call__(self, videos, **kw):
            out = base.video_processor(videos=[v.cpu() for v in videos], **kw)
            Drifting.calls += 1
            if Drifting.calls > 1:        # the "device" call
                out["pixel_values_videos"][0, 0] += 1e-6
            return out

    why = _why_not_exact(Drifting(), torch.device("cpu"))
    assert why is not None and "1 elements differ" in why and "pixel_values_videos" in why


def test_a_processor_without_a_patch_config_is_refused():
    class NotQwen:
        def to_json_string(self):
            return "{}"
    why = _why_not_exact(NotQwen(), torch.device("cpu"))
    assert why is not None and "patch_size" in why


# --- bounds: the memo per device, pinned memory -----------------------------------------------------------
def test_memo_bounds_each_device_on_its_own():
    m = Memo(max_bytes=1000, max_device_bytes=400)
    v = lambda: {"pixel_values_videos": torch.zeros(25, dtype=torch.float32)}   # 100 bytes  # noqa: E731
    for i in range(10):
        m.put(("k", i), "cuda:0", v())
        m.put(("k", i), "cpu", v())
    assert m.nbytes("cuda:0") == 400 and m.nbytes("cpu") == 1000
    assert m.get(("k", 9), "cuda:0") is not None and m.get(("k", 5), "cuda:0") is None   # LRU went first
    assert m.get(("k", 5), "cpu") is not None
    m.put("big", "cuda:1", {"x": torch.zeros(101, dtype=torch.float32)})                 # over budget: not kept
    assert m.nbytes("cuda:1") == 0
    m.clear()
    assert m.nbytes() == 0


def test_memo_keeps_compact_copies_not_slices_of_a_batch(entries, processors):
    proc = processors["qwen2_vl"]
    a, b = entries["qwen2_vl", "plugin", "default"]
    MEMO.clear()
    vidcache.train_inputs_batch(proc, [[a], [b]], batched=True, mode="plugin")
    for h in (a, b):
        hit = vidcache.train_inputs(proc, [h], mode="plugin")
        pv = hit["pixel_values_videos"]
        assert pv.untyped_storage().nbytes() == pv.nbytes          # not a view into both videos' output
    assert MEMO.nbytes("cpu") == sum(vidcache.train_inputs(proc, [h], mode="plugin")["pixel_values_videos"].nbytes
                                     + 24 for h in (a, b))


@pytest.mark.skipif(CUDA, reason="checks the CPU-only branch")
def test_without_cuda_the_pool_hands_out_pageable_memory():
    pool = PinnedPool(max_bytes=1 << 20)
    buf = pool.take(1000)
    assert buf.numel() >= 1000 and not buf.is_pinned() and pool.pinned_bytes == 0
    pool.give(buf)


# --- Miles: the train hooks hydrate on the actor's device ----------------------------------------------
def test_train_hooks_hydrate_on_the_current_cuda_device(entries, processors, monkeypatch):
    from miles_integration import train_hooks as th
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert th.train_device() == torch.device("cuda", 3)
    seen = []
    monkeypatch.setattr(vidcache, "train_inputs_batch",
                        lambda proc, groups, mode, device: seen.append((len(groups), mode, device)) or
                        [{"pixel_values_videos": torch.zeros(1)} for _ in groups])
    a, b = entries["qwen2_5_vl", "plugin", "default"]
    mms = [{th.HANDLE_KEY: th.encode_handles([a], "plugin")}, None, {"x": torch.ones(1)},
           {th.HANDLE_KEY: th.encode_handles([a, b], "plugin")}]
    out = th.hydrate_all(mms, processors["qwen2_5_vl"])
    assert seen == [(2, "plugin", torch.device("cuda", 3))]           # one call for the micro-batch
    assert out[1] is None and out[2] is mms[2] and set(out[0]) == {"pixel_values_videos"}


def test_train_hooks_on_a_cpu_actor_equal_the_rollout_tensors(entries, processors):
    from miles_integration import train_hooks as th
    a, b = entries["qwen3_vl", "stock", "default"]
    mms = [{th.HANDLE_KEY: th.encode_handles([a, b], "stock"), "keep": torch.ones(2)},
           {th.HANDLE_KEY: th.encode_handles([b], "stock")}]
    out = th.hydrate_all(mms, processors["qwen3_vl"])
    assert torch.equal(out[0]["keep"], torch.ones(2))
    assert_same({k: v for k, v in out[0].items() if k != "keep"}, reference(processors["qwen3_vl"], [a, b], "stock"))
    assert_same(out[1], reference(processors["qwen3_vl"], [b], "stock"))


# --- on a CUDA device (one test each, so a CPU-only run shows four skips, each saying why) --------------
@needs_cuda
def test_cuda_is_shown_exact_for_every_family(processors, caplog):
    with caplog.at_level(logging.WARNING, logger="vidcache.device"):
        for family in FAMILIES:
            assert exact_device(processors[family], "cuda").type == "cuda", family
    assert not caplog.records, [r.getMessage() for r in caplog.records]


@needs_cuda
def test_device_cuda_equals_the_cpu_path(entries, processors):
    """Every family, mode and budget, single videos, groups and a micro-batch: bitwise the CPU path."""
    for (family, mode, budget), (a, b) in entries.items():
        proc = processors[family]
        for handles in ([a], [b], [a, b]):
            want = reference(proc, handles, mode)
            for batched in (True, False):
                assert_same(vidcache.train_inputs(proc, handles, mode, memo=False, device="cuda", batched=batched),
                            want, "cuda")
            assert_same(vidcache.train_inputs(proc, handles, mode, device="cuda"), want, "cuda")   # memo
        assert_same(a.train_inputs(proc, mode, device="cuda"), reference(proc, [a], mode), "cuda")
        groups = [[a], [b], [a, b], [a]]
        for g, out in zip(groups, vidcache.train_inputs_batch(proc, groups, mode, memo=False, device="cuda")):
            assert_same(out, reference(proc, g, mode), "cuda")


@needs_cuda
def test_cuda_memo_and_pinned_memory_stay_bounded(entries, processors):
    from vidcache.device import PINNED
    MEMO.clear()
    old = MEMO.max_device_bytes
    MEMO.max_device_bytes = 8 << 20
    try:
        for key in entries:
            vidcache.train_inputs_batch(processors[key[0]], [[h] for h in entries[key]], key[1], device="cuda")
            assert 0 < MEMO.nbytes(f"cuda:{torch.cuda.current_device()}") <= MEMO.max_device_bytes
        assert 0 < PINNED.pinned_bytes <= PINNED.max_bytes
    finally:
        MEMO.max_device_bytes = old
        MEMO.clear()


@needs_cuda
def test_cuda_hydration_from_a_fresh_node_is_exact_for_every_clip_and_family(tmp_path, videos, processors):
    """Every clip of the suite (7 codecs / shapes / rates) times every family and mode: node A builds the entry
    into a shared tier, a fresh node B reads it through today's read path (pull, check, local copy) and
    hydrates it on the GPU; the tensors are bitwise those of HF's processor on the CPU over node A's frames."""
    shared = str(tmp_path / "shared")
    node_a = VideoCache(tmp_path / "node_a", shared=shared)
    node_b = VideoCache(tmp_path / "node_b", shared=shared)
    try:
        checked = 0
        for name, path in videos.items():
            for family in FAMILIES:
                for mode in MODES:
                    opts = options_for(family, mode, "default")
                    want = reference(processors[family], [vidcache.get(path, opts, node_a)], mode)
                    h = vidcache.get(path, opts, node_b)
                    got = vidcache.train_inputs(processors[family], [h], mode, memo=False, device="cuda")
                    assert_same(got, want, "cuda")
                    checked += 1
        assert checked == len(videos) * len(FAMILIES) * len(MODES)
    finally:
        node_a.close()
        node_b.close()
