import dataclasses
import json
import math
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vidcache import VideoOptions, cache_key
from vidcache.digest import Digest
from vidcache.errors import OptionsError
from vidcache.sglang_facts import STOCK_QWEN3_GRID as STOCK_SGLANG_QWEN3_SIZE_FACTOR


def test_defaults_are_resolved_explicitly():
    r = VideoOptions(family="qwen2_5_vl").resolved()
    assert (r.fps, r.min_frames, r.min_pixels, r.size_factor) == (2.0, 4, 128 * 28 * 28, 28)
    assert r.total_pixels == 128000 * 28 * 28 * 0.9
    q3 = VideoOptions(family="qwen3_vl").resolved()
    # Qwen3-VL's default grid is the model factor, as in qwen-vl-utils (issue 10); 224 is opt-in only.
    assert (q3.min_pixels, q3.size_factor, q3.patch_size) == (128 * 32 * 32, 32, 16)
    # a default given explicitly is the same options record
    assert VideoOptions(family="qwen2_vl", fps=2.0, min_frames=4).digest == VideoOptions(family="qwen2_vl").digest


def test_golden_digests(request):
    # If this fails, a default or the canonical form changed: bump PIPELINE_SALT (old entries
    # would otherwise be served for new semantics) and regenerate tests/golden_digests.json.
    # Last regenerated for "vidcache-pipeline-2" (qwen3_vl's default grid 224 -> 32): all three
    # families changed, by design, because the salt is part of every canonical record.
    got = {f: VideoOptions(family=f).digest for f in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")}
    expected = json.load(open(request.path.parent / "golden_digests.json"))
    assert got == expected, "options digest changed: bump PIPELINE_SALT and update tests/golden_digests.json"


def test_stock_sglang_preset_is_the_224_grid_and_explicit():
    # 224 = lcm(stock SGLang's factor 28, Qwen3-VL's 32): the only grid both resizes leave alone.
    assert STOCK_SGLANG_QWEN3_SIZE_FACTOR == math.lcm(28, 32)
    stock = VideoOptions.for_stock_sglang("qwen3_vl", fps=1.0)
    assert stock == VideoOptions(family="qwen3_vl", fps=1.0, size_factor=224)     # plain size_factor=224 works
    assert stock.resolved().size_factor == 224 and stock.fps == 1.0
    default = VideoOptions(family="qwen3_vl", fps=1.0)
    assert stock.digest != default.digest                  # never the same cache entry as the default
    src = Digest.of(b"video bytes")
    assert cache_key(src, stock) != cache_key(src, default)
    # A coarser multiple of 224 is still stock-safe; a grid stock SGLang would resize again is refused.
    assert VideoOptions.for_stock_sglang("qwen3_vl", size_factor=448).size_factor == 448
    with pytest.raises(OptionsError, match="multiple of 224"):
        VideoOptions.for_stock_sglang("qwen3_vl", size_factor=32)
    # Qwen2/2.5-VL already sit on SGLang's 28 grid: the preset changes nothing for them.
    for family in ("qwen2_vl", "qwen2_5_vl"):
        assert VideoOptions.for_stock_sglang(family, nframes=8) == VideoOptions(family=family, nframes=8)


BYTE_AFFECTING = [
    ("family", "qwen3_vl"), ("fps", 1.0), ("nframes", 8), ("min_frames", 6), ("max_frames", 64),
    ("min_pixels", 3136), ("max_pixels", 200704), ("total_pixels", 1e7), ("video_start", 0.5),
    ("video_end", 3.0), ("size_factor", 56),
]


@pytest.mark.parametrize("field,value", BYTE_AFFECTING)
def test_every_byte_affecting_option_changes_the_key(field, value):
    base = VideoOptions(family="qwen2_5_vl")
    changed = dataclasses.replace(base, **{field: value})
    assert changed.digest != base.digest
    src = Digest.of(b"video bytes")
    assert cache_key(src, changed) != cache_key(src, base)


def test_resized_pair_changes_the_key():
    base = VideoOptions()
    assert VideoOptions(resized_height=280, resized_width=392).digest != base.digest


def test_invalid_options_are_refused():
    with pytest.raises(OptionsError, match="either fps or nframes"):
        VideoOptions(fps=2.0, nframes=8)
    with pytest.raises(OptionsError, match="only count together"):
        VideoOptions(resized_height=280)
    with pytest.raises(OptionsError, match="unknown family"):
        VideoOptions(family="llava")
    with pytest.raises(OptionsError, match="multiple of 32"):
        VideoOptions(family="qwen3_vl", size_factor=28)
    with pytest.raises(OptionsError, match="positive integer"):
        VideoOptions(nframes=0)


def test_content_item_overrides():
    base = VideoOptions(family="qwen2_5_vl", fps=2.0, max_pixels=200704)
    item = {"type": "video", "video": "a.mp4", "nframes": 8, "min_pixels": 3136}
    o = base.with_content_item(item)
    assert o.nframes == 8 and o.fps is None and o.min_pixels == 3136 and o.max_pixels == 200704
    assert base.with_content_item({"type": "video", "video": "a.mp4"}) is base


opt_strategy = st.builds(
    VideoOptions,
    family=st.sampled_from(["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]),
    fps=st.one_of(st.none(), st.floats(0.1, 30, allow_nan=False)),
    min_frames=st.one_of(st.none(), st.integers(1, 16)),
    max_frames=st.one_of(st.none(), st.integers(2, 768)),
    max_pixels=st.one_of(st.none(), st.integers(10_000, 1_000_000)),
)


@settings(max_examples=60, deadline=None)
@given(opt_strategy)
def test_round_trips_keep_identity(o):
    assert VideoOptions.from_dict(json.loads(json.dumps(o.to_dict()))) == o
    assert pickle.loads(pickle.dumps(o)).digest == o.digest
    assert o.resolved().digest == o.digest
