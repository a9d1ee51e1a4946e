"""Canonical frames equal qwen-vl-utils 0.0.14 ``fetch_video(...).to(uint8)`` bit for bit."""
import pytest
import torch

from support.qwen_vl_utils_ref import reference

from vidcache import VideoOptions
from vidcache.loader.build import decode_sample_resize

CASES = [
    ("h264_30", {}),
    ("h264_ntsc", {}),
    ("mpeg4_25_odd", {}),
    ("mjpeg_24", {"fps": 4.0}),
    ("hevc_25", {"nframes": 6}),
    ("ffv1_10_small", {"min_pixels": 3136, "max_pixels": 12544}),
    ("h264_30", {"total_pixels": 200704}),
    ("h264_30", {"resized_height": 200, "resized_width": 300}),
    ("h264_ntsc", {"video_start": 0.5, "video_end": 3.7}),
    ("h264_long", {"fps": 6.0, "min_pixels": 3136}),          # 960 frames at 6 fps -> capped at 768
    ("h264_long", {"max_frames": 40, "min_frames": 8}),
]


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{'-'.join(k) or 'default'}" for n, k in CASES])
def test_frames_equal_qwen_vl_utils(videos, name, kw, family):
    patch = 16 if family == "qwen3_vl" else 14
    opts = VideoOptions(family=family, **kw)      # the defaults are qwen-vl-utils' own grid, Qwen3-VL's included
    frames, built = decode_sample_resize(videos[name], opts)
    ref, meta, sample_fps = reference(videos[name], patch, **kw)
    assert frames.dtype == torch.uint8 and frames.shape == ref.shape
    assert torch.equal(frames, ref)
    s = built.sampling
    assert list(s.frame_indices) == meta["frames_indices"]
    assert s.total_num_frames == meta["total_num_frames"]
    assert built.source.average_fps_from_decoder == meta["fps"]
    assert s.sample_fps == sample_fps
    assert len(s.frame_indices) == ref.shape[0]


def test_long_clip_hits_the_frame_cap(videos):
    frames, built = decode_sample_resize(videos["h264_long"], VideoOptions(fps=6.0, min_pixels=3136))
    assert frames.shape[0] == 768


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_explicit_model_factor_is_the_default(videos, family):
    """size_factor = patch x merge, given explicitly, is the same options record and the same frames."""
    patch = 16 if family == "qwen3_vl" else 14
    explicit, default = VideoOptions(family=family, size_factor=2 * patch), VideoOptions(family=family)
    assert explicit == default and explicit.digest == default.digest
    frames, _ = decode_sample_resize(videos["mpeg4_25_odd"], explicit)
    assert torch.equal(frames, reference(videos["mpeg4_25_odd"], patch)[0])


def test_qwen3_stock_preset_is_on_the_224_grid(videos):
    # Opt-in stock preset: qwen-vl-utils' arithmetic with only the rounding grid swapped for 224.
    frames, _ = decode_sample_resize(videos["h264_30"], VideoOptions.for_stock_sglang("qwen3_vl"))
    assert frames.shape[2] % 224 == 0 and frames.shape[3] % 224 == 0
    assert torch.equal(frames, reference(videos["h264_30"], 16, grid=224)[0])


@pytest.mark.parametrize("name", ["h264_ntsc", "mpeg4_25_odd", "hevc_25"])
def test_torchcodec_is_an_explicit_alternative(videos, name):
    from vidcache.sglang.frozen import available_decoders
    if "torchcodec" not in available_decoders():
        pytest.skip("torchcodec is not installed or does not load here (scripts/setup_peer_env.sh installs it)")
    opts = VideoOptions(family="qwen2_5_vl")
    a, built_a = decode_sample_resize(videos[name], opts, decoder="decord")
    b, built_b = decode_sample_resize(videos[name], opts, decoder="torchcodec")
    assert built_b.provenance["decoder"] == "torchcodec"
    assert torch.equal(a, b)
    assert built_a.sampling == built_b.sampling


def test_unknown_decoder_is_refused(videos):
    with pytest.raises(ValueError, match="unknown decoder backend"):
        decode_sample_resize(videos["h264_30"], VideoOptions(), decoder="auto")
