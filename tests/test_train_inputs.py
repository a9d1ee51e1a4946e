"""train_inputs() equals the HF processor bitwise, for all three families (offline toy processors)."""
import pytest
import torch
from support.toy_processors import build_processor

import vidcache
from vidcache import VideoOptions
from vidcache.processing import VIDEO_PLACEHOLDER, video_metadata

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module")
def processors():
    return {f: build_processor(f) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name,kw", [("h264_30", {}), ("h264_ntsc", {"fps": 1.0}), ("mpeg4_25_odd", {"nframes": 6})])
def test_train_inputs_equal_the_hf_processor(cache, videos, processors, family, name, kw):
    proc = processors[family]
    h = vidcache.get(videos[name], VideoOptions(family=family, **kw), cache)
    m = h.manifest
    meta = {"fps": m.source.average_fps_from_decoder, "frames_indices": list(m.sampling.frame_indices),
            "total_num_frames": m.sampling.total_num_frames}
    ref = proc(text=[VIDEO_PLACEHOLDER], videos=[h.frames()], video_metadata=[meta], do_sample_frames=False,
               do_resize=False, return_tensors="pt")
    got = h.train_inputs(proc, mode="plugin")
    assert all(isinstance(v, torch.Tensor) for v in got.values())      # Miles moves every value with .to()
    assert got["pixel_values_videos"].dtype == torch.float32
    assert torch.equal(got["pixel_values_videos"], ref["pixel_values_videos"])
    assert got["video_grid_thw"].dtype == torch.int64
    assert torch.equal(got["video_grid_thw"], ref["video_grid_thw"])
    assert got["video_grid_thw"].tolist() == [list(m.tokens.video_grid_thw)]
    if family == "qwen2_5_vl":
        sfps = m.sampling.sample_fps
        assert torch.equal(got["second_per_grid_ts"], torch.as_tensor(ref["second_per_grid_ts"], dtype=torch.float32))
        assert got["second_per_grid_ts"].item() == torch.tensor(2 / sfps, dtype=torch.float32).item()
    else:
        assert "second_per_grid_ts" not in got
    # The manifest's token count is what the processor expands to.
    n_pad = (ref["input_ids"][0] == proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")).sum().item()
    assert n_pad == h.num_video_tokens


def test_stock_mode_reproduces_sglang_metadata(cache, videos, processors):
    h = vidcache.get(videos["h264_30"], VideoOptions(family="qwen2_5_vl"), cache)
    assert video_metadata(h.manifest, "stock") is None
    stock = h.train_inputs(processors["qwen2_5_vl"], mode="stock")
    assert stock["second_per_grid_ts"].item() == torch.tensor(2 / 24, dtype=torch.float32).item()
    q3 = vidcache.get(videos["h264_30"], VideoOptions.for_stock_sglang("qwen3_vl"), cache)
    assert q3.manifest.options["size_factor"] == 224
    meta = video_metadata(q3.manifest, "stock")
    n = q3.frames().shape[0]
    assert meta == {"fps": 2.0, "frames_indices": list(range(n)), "total_num_frames": n}
    m = q3.manifest
    assert video_metadata(m, "plugin") == {"fps": m.source.average_fps_from_decoder, "total_num_frames": 120,
                                           "frames_indices": list(m.sampling.frame_indices)}
    with pytest.raises(ValueError, match="mode"):
        video_metadata(m, "server")


def test_prepare_counts_placeholders(cache, videos, processors):
    import vidcache.sglang.request as request
    from vidcache import prepare
    assert prepare is request.prepare                       # prepare lives on the sglang floor now
    h = vidcache.get(videos["h264_30"], VideoOptions(family="qwen2_5_vl"), cache)
    with pytest.raises(ValueError, match="placeholder"):
        prepare(processors["qwen2_5_vl"], "no video here", [h])
    r = prepare(processors["qwen2_5_vl"], f"a {VIDEO_PLACEHOLDER} b", [h], mode="stock")
    pad = processors["qwen2_5_vl"].tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert r.compact_ids.count(pad) == 1 and r.expanded_ids.count(pad) == h.num_video_tokens
    assert r.video_data[0].startswith("file:///") and r.video_data[0].endswith(".nut")   # UT Video for serving


def test_memo_serves_warm_calls_and_keys_on_processor_config(cache, videos, processors):
    from support.toy_processors import build_processor

    from vidcache.processing import MEMO
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(family="qwen2_vl"), cache)
    calls = []

    class Counting:
        def __init__(self, p):
            self.p, self.video_processor = p, p.video_processor

        def __call__(self, *a, **k):
            calls.append(1)
            return self.p(*a, **k)

    proc = Counting(processors["qwen2_vl"])
    a = h.train_inputs(proc, mode="plugin")
    b = h.train_inputs(proc, mode="plugin")
    assert len(calls) == 1 and all(torch.equal(a[k], b[k]) for k in a)
    other = build_processor("qwen2_vl", video_processor_kwargs={"image_mean": [0.5, 0.5, 0.5]})
    c = h.train_inputs(other, mode="plugin")
    assert not torch.equal(c["pixel_values_videos"], a["pixel_values_videos"])   # new config, new tensors
    assert h.train_inputs(proc, memo=False, mode="plugin") is not None and len(calls) == 2
    assert 0 < MEMO.nbytes("cpu") <= MEMO.max_bytes


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ["plugin", "stock"])
def test_expanded_ids_without_frames_equal_the_processors(cache, videos, processors, family, mode, count_decodes):
    from vidcache import prepare
    from vidcache.processing import expanded_ids
    # Stock mode serves only what stock SGLang reproduces: Qwen3-VL on the 224 grid (for_stock_sglang).
    opts = VideoOptions.for_stock_sglang if mode == "stock" else VideoOptions
    hs = [vidcache.get(videos["h264_ntsc"], opts(family=family), cache),
          vidcache.get(videos["mjpeg_24"], opts(family=family, fps=1.0), cache)]
    prompt = f"<|im_start|>user\n{VIDEO_PLACEHOLDER} then {VIDEO_PLACEHOLDER} what?<|im_end|>\n"
    want = prepare(processors[family], prompt, hs, mode=mode).expanded_ids
    decoded = len(count_decodes)
    import vidcache.cache as cache_mod
    frames_read = []
    real = cache_mod.VideoCache.frames
    cache_mod.VideoCache.frames = lambda self, *a, **k: frames_read.append(a) or real(self, *a, **k)
    try:
        got = expanded_ids(processors[family], prompt, [h.manifest for h in hs], mode=mode)
    finally:
        cache_mod.VideoCache.frames = real
    assert got == want and frames_read == [] and len(count_decodes) == decoded


def test_lazy_uncached_handles_are_built_by_train_inputs_and_prepare(tmp_path, videos):
    """A lazy handle whose entry is not cached yet is built on first use, not refused."""
    import vidcache
    from vidcache import VideoCache, prepare
    from vidcache import train_inputs
    proc = build_processor("qwen2_5_vl")
    for memo in (False, True):
        c = VideoCache(tmp_path / f"c{memo}")
        h = vidcache.lazy(videos["ffv1_10_small"], VideoOptions(), c)
        ti = train_inputs(proc, [h], mode="plugin", memo=memo)
        assert torch.equal(ti["video_grid_thw"], torch.tensor([list(h.manifest.tokens.video_grid_thw)]))
    c = VideoCache(tmp_path / "p")
    h = vidcache.lazy(videos["ffv1_10_small"], VideoOptions(), c)
    req = prepare(proc, VIDEO_PLACEHOLDER, [h], mode="plugin")
    assert torch.equal(req.train_inputs["pixel_values_videos"], ti["pixel_values_videos"])


def test_train_inputs_are_quiet_and_the_explicit_cap_changes_no_tensor(tmp_path, videos, caplog):
    """transformers 5.2x warns about ``cap_pixels_per_frame`` on every call unless it is set.  vidcache sets
    it to False, what the unset default does (and what SGLang gets): the tensors must be those of the default."""
    import logging

    from transformers.utils import logging as hf_logging

    from vidcache import VideoCache
    from vidcache import train_inputs
    from vidcache.processing import model_tensors, processor_kwargs
    for family in ("qwen2_5_vl", "qwen3_vl"):
        proc = build_processor(family)
        h = vidcache.get(videos["mpeg4_25_odd"], VideoOptions(family=family), VideoCache(tmp_path / family))
        kw = processor_kwargs(proc, [h.manifest], "plugin")
        from vidcache.processing import video_processor
        if not hasattr(type(video_processor(proc)), "cap_pixels_per_frame"):      # transformers before 5.2x
            assert "cap_pixels_per_frame" not in kw
            continue
        assert kw["cap_pixels_per_frame"] is False
        default = {k: v for k, v in kw.items() if k != "cap_pixels_per_frame"}
        ref = model_tensors(proc(text=[VIDEO_PLACEHOLDER], videos=[h.frames()], **default))
        hf_logging.enable_propagation()
        logging.Logger.warning_once.cache_clear()    # transformers warns once per process: make it able to again
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            got = train_inputs(proc, [h], mode="plugin", memo=False)
        assert not [r for r in caplog.records if "cap_pixels_per_frame" in r.getMessage()]
        assert sorted(got) == sorted(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
