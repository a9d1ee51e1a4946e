"""Peer parity: SGLang 0.5.23's own request preprocessing reproduces the trainer's tensors bit for bit.

Every case prewarms a generated video, builds ``vidcache.prepare(..., mode=M)`` and runs SGLang's
``QwenVLImageProcessor._process_mm_data_uncached`` (tests/sglang_peer.py) on ``prepared.video_data`` with
the server config ``vidcache sglang-config`` prints.  In plugin mode the processor class is the one SGLang's
own ``import_processors("vidcache.sglang.plugin")`` registers, as a server with
``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE`` would.
"""
import pytest
import torch

pytest.importorskip("sglang", reason="SGLang peer not installed: run scripts/setup_peer_env.sh")
import sglang_peer as sp  # noqa: E402  (tests/ is on sys.path via conftest)

if not sp.peer_available():
    pytest.skip("SGLang's qwen_vl processor does not import here: run scripts/setup_peer_env.sh",
                allow_module_level=True)

from toy_processors import build_processor  # noqa: E402

from vidcache import ParityError, VideoOptions, prepare  # noqa: E402
from vidcache.cache import open_cache  # noqa: E402
from vidcache.errors import OptionsError  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER  # noqa: E402
from vidcache.sglang.config import PLUGIN_PACKAGE, sglang_config  # noqa: E402

pytestmark = pytest.mark.peer

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
MODES = ("stock", "plugin")
PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe the video.<|im_end|>\n<|im_start|>assistant\n"
TIGHT = {"min_pixels": 3136, "max_pixels": 50176}
# Qwen3-VL's default 224 grid leaves no non-square frame under 50176 pixels; its tight budget is 2 cells.
TIGHT_Q3 = {"min_pixels": 3136, "max_pixels": 100352}

# name -> (video, options for every family, or {family: options}); conftest.VIDEOS describes the clips.
CASES = {
    "default-h264-29.97": ("h264_ntsc", {}),                            # the "defaults are parity-safe" bar
    "default-mpeg4-25-426x238": ("mpeg4_25_odd", {}),
    "tight-hevc-25": ("hevc_25", {f: (TIGHT_Q3 if f == "qwen3_vl" else TIGHT) for f in FAMILIES}),
    "tight-mjpeg-24-fps1": ("mjpeg_24", {f: {"fps": 1.0, **(TIGHT_Q3 if f == "qwen3_vl" else TIGHT)}
                                         for f in FAMILIES}),
    # 1600 frames at 10 fps sampled at 6 fps -> 960 -> capped at 768, with tiny frames.
    "cap768-h264-long": ("h264_long", {"qwen2_vl": {"fps": 6.0, "min_pixels": 3136, "max_pixels": 6272},
                                       "qwen2_5_vl": {"fps": 6.0, "min_pixels": 3136, "max_pixels": 6272},
                                       # 224x224 x 768 frames costs ~40 s here; see the slow case below.
                                       "qwen3_vl": None}),
}


def _options(case, family):
    kw = CASES[case][1]
    if kw and set(kw) <= set(FAMILIES):              # per-family options
        kw = kw[family]
    return None if kw is None else VideoOptions(family=family, **kw)


# --- fixtures ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plugin_classes():
    """family -> processor class, registered through SGLang's own external-package mechanism."""
    sp._import_sglang()
    from sglang.srt.managers.multimodal_processor import PROCESSOR_MAPPING, import_processors

    import_processors(PLUGIN_PACKAGE, overwrite=True)
    by_arch = {model.__name__: proc for model, proc in PROCESSOR_MAPPING.items()}
    out = {f: by_arch[sp._ARCH[f]] for f in FAMILIES}
    for cls in out.values():
        assert cls.__module__ == PLUGIN_PACKAGE + ".qwen_vl", cls
    return out


@pytest.fixture(scope="module")
def train_processors():
    return {f: build_processor(f) for f in FAMILIES}


@pytest.fixture(scope="module")
def peers(plugin_classes):
    """(family, mode) -> SGLang processor configured as `vidcache sglang-config` says, built lazily."""
    made = {}

    def get(family, mode):
        if (family, mode) not in made:
            made[family, mode] = sp.build_peer(
                family, build_processor(family, sglang_size_override=True),    # what a server loads
                video_config=sglang_config(family, mode)["mm_process_config"]["video"],
                processor_cls=plugin_classes[family] if mode == "plugin" else None)
        return made[family, mode]
    return get


@pytest.fixture(scope="module")
def pcache(tmp_path_factory):
    return open_cache(tmp_path_factory.mktemp("parity") / "cache")


def _meta_info(out):
    """What SGLang returns with return_prompt_token_ids: true."""
    return {"prompt_token_ids": list(out["input_ids"]), "prompt_tokens": len(out["input_ids"])}


def assert_parity(out, prep, handle, family, mode):
    ti = prep.train_inputs
    assert torch.equal(out["video_grid_thw"].to(torch.int64), ti["video_grid_thw"])
    assert out["pixel_values_videos"].dtype == ti["pixel_values_videos"].dtype
    assert torch.equal(out["pixel_values_videos"], ti["pixel_values_videos"])
    if family == "qwen2_5_vl":
        spg = torch.as_tensor(out["second_per_grid_ts"], dtype=torch.float32)
        assert torch.equal(spg, ti["second_per_grid_ts"])
        want = 2 / 24 if mode == "stock" else 2 / handle.manifest["video"]["sample_fps"]
        assert spg.item() == torch.tensor(want, dtype=torch.float32).item()
    else:
        assert out["second_per_grid_ts"] is None and "second_per_grid_ts" not in ti
    assert out["input_ids"] == prep.expanded_ids
    prep.check(_meta_info(out))                          # the divergence guard agrees


def run_case(source, opts, mode, pcache, train_processors, peers, ids_too=True):
    family = opts.family
    h = pcache.get(source, opts)
    frames = h.frames()
    prep = prepare(train_processors[family], PROMPT, [h], mode=mode)
    peer = peers(family, mode)
    out = sp.run_peer(peer, PROMPT, prep.video_data)
    assert_parity(out, prep, h, family, mode)
    # What reached process_mm_data is the cached frames themselves: nothing re-sampled or resized.
    (got,) = out["frames"]
    if mode == "plugin":    # the plugin's loaded item, unwrapped only inside its process_mm_data
        assert prep.video_data[0].endswith(".vidcache") and type(got).__name__ == "VidcacheVideo"
        got, meta = got.frames, got.metadata
        v = h.manifest["video"]
        assert (meta["fps"], list(meta["frames_indices"]), meta["total_num_frames"]) == \
            (v["fps"], v["frame_indices"], v["total_num_frames"])
    assert torch.equal(got, frames)
    if ids_too:
        # Compact ids: SGLang decodes them to text and re-tokenises; the other transport on the way.
        # Plugin: the data: reference.  Stock: the other frozen format (FFV1 instead of UT Video).
        other = {"transport": "data"} if mode == "plugin" else {"frozen_format": "ffv1"}
        uris = prepare(train_processors[family], PROMPT, [h], mode=mode, **other).video_data
        assert uris != prep.video_data
        out2 = sp.run_peer(peer, prep.compact_ids, uris)
        assert out2["input_ids"] == prep.expanded_ids
        assert torch.equal(out2["pixel_values_videos"], prep.train_inputs["pixel_values_videos"])
    return h, prep, out


# --- the matrix ----------------------------------------------------------------------------------------
MATRIX = [(c, f, m) for c in CASES for f in FAMILIES for m in MODES if _options(c, f) is not None]


@pytest.mark.parametrize("case,family,mode", MATRIX, ids=[f"{f}-{m}-{c}" for c, f, m in MATRIX])
def test_sglang_reproduces_the_cache(case, family, mode, videos, pcache, train_processors, peers):
    run_case(videos[CASES[case][0]], _options(case, family), mode, pcache, train_processors, peers)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_qwen3_768_frame_cap_on_the_224_grid(mode, videos, pcache, train_processors, peers):
    opts = VideoOptions(family="qwen3_vl", fps=6.0, min_pixels=3136, max_pixels=50176)
    h, _, _ = run_case(videos["h264_long"], opts, mode, pcache, train_processors, peers, ids_too=False)
    assert h.frames().shape == (768, 3, 224, 224)


def test_qwen3_768_frame_cap_plugin_small_grid(videos, pcache, train_processors, peers):
    """The cap at Qwen3's own 32 grid: exact through the plugin (stock refuses it, see below)."""
    opts = VideoOptions(family="qwen3_vl", fps=6.0, min_pixels=3136, max_pixels=6272, size_factor=32)
    h, _, _ = run_case(videos["h264_long"], opts, "plugin", pcache, train_processors, peers, ids_too=False)
    assert h.frames().shape == (768, 3, 64, 64)


# --- negative control ----------------------------------------------------------------------------------
@pytest.mark.parametrize("pix_fmt", ["yuv444p", "yuv420p"])
def test_yuv_frozen_file_is_not_exact(pix_fmt, videos, pcache, train_processors, peers, tmp_path):
    """Same frames, same rate and container, lossless-but-YUV (x264 qp 0): SGLang's features differ."""
    import av

    family = "qwen2_5_vl"
    h = pcache.get(videos["hevc_25"], _options("tight-hevc-25", family))
    prep = prepare(train_processors[family], PROMPT, [h], mode="stock")
    path = str(tmp_path / f"yuv_{pix_fmt}.mkv")
    with av.open(path, "w", format="matroska") as c:
        s = c.add_stream("libx264", rate=2)
        s.height, s.width = h.frames().shape[2:]
        s.pix_fmt, s.options = pix_fmt, {"qp": "0", "preset": "veryfast"}
        for fr in h.frames().permute(0, 2, 3, 1).numpy():
            for p in s.encode(av.VideoFrame.from_ndarray(fr, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    out = sp.run_peer(peers(family, "stock"), PROMPT, ["file://" + path])
    assert torch.equal(out["video_grid_thw"], prep.train_inputs["video_grid_thw"])    # same shape...
    assert out["input_ids"] == prep.expanded_ids
    assert not torch.equal(out["pixel_values_videos"], prep.train_inputs["pixel_values_videos"])   # ...not bits


# --- divergence guard ----------------------------------------------------------------------------------
def test_guard_fires_on_mismatched_expansion(videos, pcache, train_processors, peers):
    family = "qwen2_5_vl"
    proc = train_processors[family]
    h = pcache.get(videos["hevc_25"], _options("tight-hevc-25", family))
    other = pcache.get(videos["hevc_25"], VideoOptions(family=family, fps=4.0, **TIGHT))
    prep = prepare(proc, PROMPT, [h], mode="stock")
    wrong = prepare(proc, PROMPT, [other], mode="stock")
    out = sp.run_peer(peers(family, "stock"), PROMPT, wrong.video_data)   # the server saw other options
    assert out["input_ids"] == wrong.expanded_ids != prep.expanded_ids
    with pytest.raises(ParityError, match="expanded the prompt differently"):
        prep.check(_meta_info(out))
    ok = sp.run_peer(peers(family, "stock"), PROMPT, prep.video_data)["input_ids"]
    pad = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    dropped = list(ok)
    dropped.remove(pad)
    with pytest.raises(ParityError, match="first difference"):
        prep.check({"prompt_token_ids": dropped})
    with pytest.raises(ParityError, match="prompt tokens"):
        prep.check({"prompt_tokens": len(ok) - 1})
    prep.check({"prompt_token_ids": [ok]})                 # batched form of meta_info is accepted


def test_guard_fires_on_qwen3_stock_vs_plugin(videos, pcache, train_processors, peers):
    """Same frames, same pixels: only the timestamps differ (frozen 2 fps timeline vs the original)."""
    family = "qwen3_vl"
    proc = train_processors[family]
    h = pcache.get(videos["h264_ntsc"], VideoOptions(family=family))
    stock, plugin = (prepare(proc, PROMPT, [h], mode=m) for m in MODES)
    assert torch.equal(stock.train_inputs["pixel_values_videos"], plugin.train_inputs["pixel_values_videos"])
    assert stock.expanded_ids != plugin.expanded_ids
    out_stock = sp.run_peer(peers(family, "stock"), PROMPT, stock.video_data)
    with pytest.raises(ParityError):
        plugin.check(_meta_info(out_stock))
    out_plugin = sp.run_peer(peers(family, "plugin"), PROMPT, plugin.video_data)
    with pytest.raises(ParityError):
        stock.check(_meta_info(out_plugin))


# --- stock refusals: option sets stock SGLang cannot reproduce -----------------------------------------
@pytest.mark.parametrize("family,video,kw,match", [
    ("qwen3_vl", "h264_30", {"size_factor": 32}, "size_factor=224"),
    ("qwen2_5_vl", "h264_long", {"fps": 6.0, "max_frames": 1000, "min_pixels": 3136, "max_pixels": 6272},
     "max_frames/nframes <= 768"),
])
def test_stock_refuses_what_it_cannot_reproduce(family, video, kw, match, videos, pcache, train_processors,
                                                 peers):
    proc = train_processors[family]
    h = pcache.get(videos[video], VideoOptions(family=family, **kw))
    with pytest.raises(OptionsError, match=match):
        prepare(proc, PROMPT, [h], mode="stock")
    # The refusal is needed: the frozen file sent anyway is not reproduced ...
    ref = prepare(proc, PROMPT, [h], mode="plugin")      # same frames; plugin-mode ids
    stock_ti = h.train_inputs(proc, mode="stock")
    try:
        out = sp.run_peer(peers(family, "stock"), PROMPT, [h.frozen_uri()])
    except Exception:                                     # or SGLang fails outright
        pass
    else:
        assert not (out["video_grid_thw"].tolist() == stock_ti["video_grid_thw"].tolist()
                    and torch.equal(out["pixel_values_videos"], stock_ti["pixel_values_videos"]))
    # ... while the plugin serves the same entry exactly.
    assert_parity(sp.run_peer(peers(family, "plugin"), PROMPT, ref.video_data), ref, h, family, "plugin")


# --- plugin behaviour ----------------------------------------------------------------------------------
def test_plugin_refuses_mixed_requests(videos, pcache, train_processors, peers):
    family = "qwen2_5_vl"
    h = pcache.get(videos["hevc_25"], _options("tight-hevc-25", family))
    ref = prepare(train_processors[family], PROMPT, [h], mode="plugin").video_data[0]
    frozen = prepare(train_processors[family], PROMPT, [h], mode="stock").video_data[0]
    two = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}{VIDEO_PLACEHOLDER}Compare.<|im_end|>\n"
    with pytest.raises(ValueError, match="cannot be mixed"):
        sp.run_peer(peers(family, "plugin"), two, [ref, frozen])


def test_plugin_serves_several_refs_and_plain_videos(videos, pcache, train_processors, peers):
    """Two refs in one request are exact; a request without refs is stock SGLang's own path."""
    family = "qwen3_vl"
    proc = train_processors[family]
    hs = [pcache.get(videos[n], VideoOptions(family=family)) for n in ("h264_ntsc", "mpeg4_25_odd")]
    two = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}{VIDEO_PLACEHOLDER}Compare.<|im_end|>\n"
    prep = prepare(proc, two, hs, mode="plugin")
    out = sp.run_peer(peers(family, "plugin"), two, prep.video_data)
    assert torch.equal(out["pixel_values_videos"], prep.train_inputs["pixel_values_videos"])
    assert out["input_ids"] == prep.expanded_ids
    stock = prepare(proc, PROMPT, hs[:1], mode="stock")
    out = sp.run_peer(peers(family, "plugin"), PROMPT, stock.video_data)
    assert torch.equal(out["pixel_values_videos"], stock.train_inputs["pixel_values_videos"])
    assert out["input_ids"] == stock.expanded_ids


def test_stock_sglang_fails_loudly_on_a_ref(videos, pcache, train_processors, peers):
    family = "qwen2_vl"
    h = pcache.get(videos["hevc_25"], _options("tight-hevc-25", family))
    ref = prepare(train_processors[family], PROMPT, [h], mode="plugin").video_data[0]
    with pytest.raises(Exception):
        sp.run_peer(peers(family, "stock"), PROMPT, [ref])


def test_plugin_rejects_an_unknown_ref(pcache, train_processors, peers, tmp_path):
    import base64
    import json
    rec = {"vidcache_ref": 1, "cache": pcache.path, "key": "0" * 32 + ".1.nope"}
    uri = "data:application/vnd.vidcache.ref+json;base64," + base64.b64encode(json.dumps(rec).encode()).decode()
    with pytest.raises(ValueError, match="cannot load vidcache reference"):
        sp.run_peer(peers("qwen2_vl", "plugin"), PROMPT, [uri])
    with pytest.raises(ValueError, match="cannot load vidcache reference"):
        sp.run_peer(peers("qwen2_vl", "plugin"), PROMPT, ["file://" + str(tmp_path / "missing.vidcache")])


def test_plugin_refuses_an_entry_of_another_patch_size(videos, pcache, train_processors, peers):
    h = pcache.get(videos["hevc_25"], _options("tight-hevc-25", "qwen2_5_vl"))
    ref = prepare(train_processors["qwen2_5_vl"], PROMPT, [h], mode="plugin").video_data[0]
    with pytest.raises(ValueError, match="patch"):
        sp.run_peer(peers("qwen3_vl", "plugin"), PROMPT, [ref])


def test_plugin_module_is_the_only_sglang_importer():
    """`import vidcache` (and its sglang config) must not pull SGLang in; only the plugin module does."""
    import subprocess
    import sys
    code = ("import sys, vidcache, vidcache.sglang.config, vidcache.sglang.plugin, vidcache.transport; "
            "assert 'sglang' not in sys.modules, 'sglang imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
