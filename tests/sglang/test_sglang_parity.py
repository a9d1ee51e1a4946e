"""Peer parity: SGLang 0.5.23's own request preprocessing reproduces the trainer's tensors bit for bit.

Every case prewarms a generated video, builds ``vidcache.prepare(..., mode=M)`` and runs SGLang's
``QwenVLImageProcessor._process_mm_data_uncached`` (tests/support/sglang_peer.py) on ``prepared.video_data`` with
the server config ``vidcache sglang-config`` prints.  In plugin mode the processor class is the one SGLang's
own ``import_processors("vidcache.sglang.plugin")`` registers, as a server with
``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE`` would, and it resolves references through this process's node cache
(``VIDCACHE_DIR``), exactly like a server.

Stock mode serves Qwen3-VL only on the 224 grid (``VideoOptions.for_stock_sglang``); plugin mode serves the
default (qwen-vl-utils' 32 grid) frames.  Where SGLang is installed nothing here skips: a broken peer or
plugin fails.
"""
import base64
import importlib.metadata as md
import json

import pytest
import torch

from support import sglang_peer as sp  # (tests/ is on sys.path via conftest)

if not sp.peer_installed():
    pytest.skip("SGLang peer not installed: run scripts/setup_peer_env.sh", allow_module_level=True)
sp.require_peer()     # installed: an import failure or a version mismatch is an error here, never a skip

from support.media import ASPECT_SHAPES  # noqa: E402
from support.toy_processors import build_processor  # noqa: E402

import vidcache  # noqa: E402
from vidcache import ParityError, VideoOptions, prepare  # noqa: E402
from vidcache.cache import VideoCache  # noqa: E402
from support.caches import node_cache_in  # noqa: E402
from vidcache.errors import OptionsError  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER  # noqa: E402
from vidcache.sglang.config import PLUGIN_PACKAGE, sglang_config  # noqa: E402
from vidcache.sglang.frozen import local_frozen_path  # noqa: E402
from vidcache.rollout.ref import REF_PREFIX  # noqa: E402
from vidcache.sglang.transport import file_uri  # noqa: E402
from vidcache.sglang_facts import stock_pixel_bounds  # noqa: E402

pytestmark = pytest.mark.peer

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# Qwen3-VL-MoE and Qwen3.5 / 3.6 / 3.8: Qwen3-VL's processing under their own model type (SGLang branches on it),
# architecture (the plugin must take it over) and special-token ids (248053... for Qwen3.5).
# Each runs on the SGLang releases the table says serve it (verified): 0.5.16 does not know them.
from vidcache.families import MODEL_TYPES as TABLE  # noqa: E402
MODEL_TYPES = tuple(t for t in ("qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen4_exp")
                    if md.version("sglang") in TABLE[t].engines.get("SGLang", ()))
MODES = ("stock", "plugin")
PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe the video.<|im_end|>\n<|im_start|>assistant\n"
TIGHT = {"min_pixels": 3136, "max_pixels": 50176}
# Stock-mode Qwen3-VL frames sit on the 224 grid (for_stock_sglang), where no non-square frame fits under
# 50176 pixels (one 224x224 cell): its tight budget is 2 cells.  The plugin's 32 grid takes TIGHT itself.
# On SGLang 0.5.16 Qwen3-VL's stock frames must also hold its fixed minimum (sglang_facts.stock_pixel_bounds: 100352
# pixels, two cells), which its transformers does not let the config lower.
Q3_STOCK_MIN = stock_pixel_bounds("qwen3_vl", md.version("sglang"))[0]
TIGHT_Q3_STOCK = {"min_pixels": max(3136, Q3_STOCK_MIN), "max_pixels": max(100352, 2 * Q3_STOCK_MIN)}


def _tight(family, mode):
    return TIGHT_Q3_STOCK if (family, mode) == ("qwen3_vl", "stock") else TIGHT


# name -> (video, options kwargs as a function of (family, mode), None where a case does not apply);
# support.media.VIDEOS describes the clips.
CASES = {
    "default-h264-29.97": ("h264_ntsc", lambda f, m: {}),                # the "defaults are parity-safe" bar
    "default-mpeg4-25-426x238": ("mpeg4_25_odd", lambda f, m: {}),
    "tight-hevc-25": ("hevc_25", lambda f, m: dict(_tight(f, m))),
    "tight-mjpeg-24-fps1": ("mjpeg_24", lambda f, m: {"fps": 1.0, **_tight(f, m)}),
    # 1600 frames at 10 fps sampled at 6 fps -> 960 -> capped at 768, with tiny frames.  Qwen3-VL has its
    # own cases below (768 frames on the 224 grid cost ~40 s here).
    "cap768-h264-long": ("h264_long", lambda f, m: None if f == "qwen3_vl" else
                         {"fps": 6.0, "min_pixels": 3136, "max_pixels": 6272}),
}


def options_for(family, mode, **kw):
    """What a user builds for ``mode``: stock SGLang needs Qwen3-VL on the 224 grid, the plugin does not."""
    return VideoOptions.for_stock_sglang(family, **kw) if mode == "stock" else VideoOptions(family=family, **kw)


def _options(case, family, mode):
    kw = CASES[case][1](family, mode)
    return None if kw is None else options_for(family, mode, **kw)


# --- fixtures ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plugin_classes():
    """family -> processor class, registered through SGLang's own external-package mechanism."""
    import importlib

    sp.require_peer()
    from sglang.srt.managers.multimodal_processor import PROCESSOR_MAPPING, import_processors

    importlib.import_module(PLUGIN_PACKAGE + ".qwen_vl")     # a broken plugin raises here, with its own error
    import_processors(PLUGIN_PACKAGE, overwrite=True)
    by_arch = {model.__name__: proc for model, proc in PROCESSOR_MAPPING.items()}
    out = {f: by_arch[sp._ARCH[f]] for f in FAMILIES + MODEL_TYPES}
    for cls in out.values():
        assert cls.__module__ == PLUGIN_PACKAGE + ".qwen_vl", cls
    return out


@pytest.fixture(scope="module")
def train_processors():
    return {f: build_processor(f) for f in FAMILIES + MODEL_TYPES}


@pytest.fixture(scope="module")
def peers(plugin_classes):
    """(family or model type, mode) -> SGLang processor configured as `vidcache sglang-config` says, built
    lazily."""
    made = {}

    def get(family, mode):
        if (family, mode) not in made:
            made[family, mode] = sp.build_peer(
                family, build_processor(family, sglang_size_override=True),    # what a server loads
                video_config=sglang_config(sp.FAMILY_OF_MODEL_TYPE[family], mode)["mm_process_config"]["video"],
                processor_cls=plugin_classes[family] if mode == "plugin" else None)
        return made[family, mode]
    return get


@pytest.fixture(scope="module")
def pcache(tmp_path_factory):
    """The node's cache (VIDCACHE_DIR, no shared tier): the one the plugin resolves references through."""
    with node_cache_in(tmp_path_factory.mktemp("parity") / "cache") as c:
        yield c


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
        want = 2 / 24 if mode == "stock" else 2 / handle.manifest.sampling.sample_fps
        assert spg.item() == torch.tensor(want, dtype=torch.float32).item()
    else:
        assert out["second_per_grid_ts"] is None and "second_per_grid_ts" not in ti
    assert out["input_ids"] == prep.expanded_ids
    prep.check(_meta_info(out))                          # the divergence guard agrees


def run_case(source, opts, mode, pcache, train_processors, peers, ids_too=True, model_type=None):
    family = opts.family
    served = model_type or family          # the model type the trainer's processor and the server are for
    h = vidcache.get(source, opts, pcache)
    frames = h.frames()
    prep = prepare(train_processors[served], PROMPT, [h], mode=mode)
    peer = peers(served, mode)
    out = sp.run_peer(peer, PROMPT, prep.video_data)
    assert_parity(out, prep, h, family, mode)
    # What reached process_mm_data is the cached frames themselves: nothing re-sampled or resized.
    (got,) = out["frames"]
    if mode == "plugin":    # the plugin's loaded item, unwrapped only inside its process_mm_data
        assert prep.video_data[0].startswith(REF_PREFIX) and type(got).__name__ == "VidcacheVideo"
        got, meta = got.frames, got.metadata
        m = h.manifest
        assert (meta["fps"], list(meta["frames_indices"]), meta["total_num_frames"]) == \
            (m.source.average_fps_from_decoder, list(m.sampling.frame_indices), m.sampling.total_num_frames)
    else:
        assert prep.video_data[0].startswith("file:///") and prep.video_data[0].endswith(".nut")
    assert torch.equal(got, frames)
    if ids_too:
        # Compact ids: SGLang decodes them to text and re-tokenises; another transport on the way.
        # Plugin: the same reference (its only transport).  Stock: the data: transport, in the other
        # frozen format (FFV1 instead of UT Video).
        other = {"transport": "data"} if mode == "plugin" else {"transport": "data", "frozen_format": "ffv1"}
        uris = prepare(train_processors[served], PROMPT, [h], mode=mode, **other).video_data
        assert (uris == prep.video_data) == (mode == "plugin")
        out2 = sp.run_peer(peer, prep.compact_ids, uris)
        assert out2["input_ids"] == prep.expanded_ids
        assert torch.equal(out2["pixel_values_videos"], prep.train_inputs["pixel_values_videos"])
    return h, prep, out


# --- the matrix ----------------------------------------------------------------------------------------
MATRIX = [(c, f, m) for c in CASES for f in FAMILIES for m in MODES if _options(c, f, m) is not None]


@pytest.mark.parametrize("case,family,mode", MATRIX, ids=[f"{f}-{m}-{c}" for c, f, m in MATRIX])
def test_sglang_reproduces_the_cache(case, family, mode, videos, pcache, train_processors, peers):
    opts = _options(case, family, mode)
    h, _, _ = run_case(videos[CASES[case][0]], opts, mode, pcache, train_processors, peers)
    grid = 224 if (family, mode) == ("qwen3_vl", "stock") else 32 if family == "qwen3_vl" else 28
    assert h.manifest.options["size_factor"] == grid and h.frames().shape[2] % grid == h.frames().shape[3] % grid == 0


# Every clip of CASES would cost ~1 min per model type: qwen3_5 (the Qwen3.5 line) takes two, the others one.
MT_MATRIX = [(c, t, m) for t in MODEL_TYPES for c in ("default-h264-29.97", "tight-hevc-25")[:2 if t == "qwen3_5" else 1]
             for m in MODES]


@pytest.mark.parametrize("case,model_type,mode", MT_MATRIX, ids=[f"{t}-{m}-{c}" for c, t, m in MT_MATRIX])
def test_sglang_reproduces_the_cache_for_qwen3_5_model_types(case, model_type, mode, videos, pcache,
                                                             train_processors, peers):
    """Qwen3.5 / 3.6 / 3.8 read Qwen3-VL's entries (one family, one cache key) and SGLang's own processor, run
    as their model type through their architecture's (plugin) class, reproduces the trainer's tensors and ids,
    with the real special-token ids in both."""
    from vidcache.processing import layout_of
    opts = _options(case, "qwen3_vl", mode)
    h, prep, out = run_case(videos[CASES[case][0]], opts, mode, pcache, train_processors, peers,
                            model_type=model_type)
    assert h.key == vidcache.get(videos[CASES[case][0]], opts, pcache).key and h.manifest.family == "qwen3_vl"
    t, gh, gw = prep.train_inputs["video_grid_thw"][0].tolist()
    ids = prep.expanded_ids
    vs, ve, _, pad = TABLE[model_type].token_ids                              # the real ids: 248053... for Qwen3.5
    assert ids.count(pad) == t * gh * gw // 4 and len(set(ids) & {151656, 248057}) == 1    # video_pad, merge 2x2
    # plugin: the model's own ('collapsed') layout; stock: this transformers' (5.24: 'wrapped', one pair more)
    layout = "collapsed" if mode == "plugin" else layout_of(train_processors[model_type], "qwen3_vl")
    assert ids.count(vs) == ids.count(ve) == t + (layout == "wrapped")
    assert peers(model_type, mode).model_type == model_type


# conftest's shapes but 720p, kept out for time: it is checked against qwen-vl-utils in test_qwen3_defaults.
ASPECTS = ASPECT_SHAPES[:-1]


@pytest.mark.parametrize("size", ASPECTS, ids=[f"{w}x{h}" for w, h in ASPECTS])
def test_plugin_reproduces_qwen3_defaults_at_every_aspect_ratio(size, aspect_clips, pcache, train_processors,
                                                                 peers):
    """Default Qwen3-VL options (qwen-vl-utils' 32 grid, faithful aspect ratios) are exact through the plugin."""
    opts = VideoOptions(family="qwen3_vl")
    h, _, _ = run_case(aspect_clips[size], opts, "plugin", pcache, train_processors, peers, ids_too=False)
    m = h.manifest
    assert m.options["size_factor"] == 32 and m.height % 32 == m.width % 32 == 0
    w, hh = size
    assert abs(m.width * hh / w - m.height) < 32          # within one grid cell of the source's aspect ratio
    with pytest.raises(OptionsError, match="plugin"):     # ...and stock mode says why it cannot serve them
        prepare(train_processors["qwen3_vl"], PROMPT, [h], mode="stock")


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_qwen3_768_frame_cap_on_the_224_grid(mode, videos, pcache, train_processors, peers):
    opts = VideoOptions.for_stock_sglang("qwen3_vl", fps=6.0, min_pixels=max(3136, Q3_STOCK_MIN),
                                         max_pixels=max(50176, Q3_STOCK_MIN))
    h, _, _ = run_case(videos["h264_long"], opts, mode, pcache, train_processors, peers, ids_too=False)
    t, _, fh, fw = h.frames().shape
    assert t == 768 and fh % 224 == fw % 224 == 0
    assert (fh, fw) == (224, 224) if Q3_STOCK_MIN <= 50176 else fh * fw >= Q3_STOCK_MIN


def test_qwen3_768_frame_cap_plugin_small_grid(videos, pcache, train_processors, peers):
    """The cap at Qwen3's own (default) 32 grid: exact through the plugin (stock refuses it, see below)."""
    opts = VideoOptions(family="qwen3_vl", fps=6.0, min_pixels=3136, max_pixels=6272)
    assert opts.resolved().size_factor == 32
    h, _, _ = run_case(videos["h264_long"], opts, "plugin", pcache, train_processors, peers, ids_too=False)
    assert h.frames().shape == (768, 3, 64, 64)


# --- negative control ----------------------------------------------------------------------------------
@pytest.mark.parametrize("pix_fmt", ["yuv444p", "yuv420p"])
def test_yuv_frozen_file_is_not_exact(pix_fmt, videos, pcache, train_processors, peers, tmp_path):
    """Same frames, same rate and container, lossless-but-YUV (x264 qp 0): SGLang's features differ."""
    import av

    family = "qwen2_5_vl"
    h = vidcache.get(videos["hevc_25"], _options("tight-hevc-25", family, "stock"), pcache)
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
    h = vidcache.get(videos["hevc_25"], _options("tight-hevc-25", family, "stock"), pcache)
    other = vidcache.get(videos["hevc_25"], VideoOptions(family=family, fps=4.0, **TIGHT), pcache)
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
    """Same frames, same pixels: only the timestamps differ (frozen 2 fps timeline vs the original).
    The entry is on the 224 grid, which both modes serve."""
    family = "qwen3_vl"
    proc = train_processors[family]
    h = vidcache.get(videos["h264_ntsc"], VideoOptions.for_stock_sglang(family), pcache)
    stock, plugin = (prepare(proc, PROMPT, [h], mode=m) for m in MODES)
    assert torch.equal(stock.train_inputs["pixel_values_videos"], plugin.train_inputs["pixel_values_videos"])
    assert stock.expanded_ids != plugin.expanded_ids
    out_stock = sp.run_peer(peers(family, "stock"), PROMPT, stock.video_data)
    assert out_stock["input_ids"] == stock.expanded_ids
    with pytest.raises(ParityError, match="expanded the prompt differently"):
        plugin.check(_meta_info(out_stock))
    out_plugin = sp.run_peer(peers(family, "plugin"), PROMPT, plugin.video_data)
    assert out_plugin["input_ids"] == plugin.expanded_ids
    with pytest.raises(ParityError, match="expanded the prompt differently"):
        stock.check(_meta_info(out_plugin))


# --- stock refusals: option sets stock SGLang cannot reproduce -----------------------------------------
def test_stock_refuses_default_qwen3_options_and_names_both_fixes(videos, pcache, train_processors):
    h = vidcache.get(videos["h264_30"], VideoOptions(family="qwen3_vl"), pcache)
    with pytest.raises(OptionsError) as e:
        prepare(train_processors["qwen3_vl"], PROMPT, [h], mode="stock")
    msg = str(e.value)
    assert "mode='plugin'" in msg                                           # fix 1: the plugin
    assert "for_stock_sglang" in msg and "size_factor=224" in msg           # fix 2: the 224 grid
    assert h.key in msg
    # Each fix works: the plugin serves this entry; for_stock_sglang gives an entry stock mode takes.
    assert prepare(train_processors["qwen3_vl"], PROMPT, [h], mode="plugin").video_data[0].startswith(REF_PREFIX)
    h224 = vidcache.get(videos["h264_30"], VideoOptions.for_stock_sglang("qwen3_vl"), pcache)
    assert prepare(train_processors["qwen3_vl"], PROMPT, [h224], mode="stock").video_data[0].startswith("file:///")


# What stock SGLang does with the frozen file sent anyway: fail outright (the exception and its message,
# so the test cannot pass for another reason), or reproduce something else.
QWEN3_OFF_GRID = (RuntimeError, "is invalid for input of size")   # HF's Qwen3-VL patchify after SGLang's resize


@pytest.mark.parametrize("family,video,kw,match,sglang_fails", [
    ("qwen3_vl", "h264_30", {}, "size_factor=224", QWEN3_OFF_GRID),                  # the default 32 grid
    ("qwen3_vl", "h264_30", {"size_factor": 64}, "size_factor=224", QWEN3_OFF_GRID),
    ("qwen2_5_vl", "h264_long", {"fps": 6.0, "max_frames": 1000, "min_pixels": 3136, "max_pixels": 6272},
     "max_frames/nframes <= 768", None),                                              # re-sampled to 768
])
def test_stock_refuses_what_it_cannot_reproduce(family, video, kw, match, sglang_fails, videos, pcache,
                                                 train_processors, peers):
    proc = train_processors[family]
    h = vidcache.get(videos[video], VideoOptions(family=family, **kw), pcache)
    with pytest.raises(OptionsError, match=match):
        prepare(proc, PROMPT, [h], mode="stock")
    # The refusal is needed: the frozen file sent anyway is not reproduced ...
    ref = prepare(proc, PROMPT, [h], mode="plugin")      # same frames; plugin-mode ids
    stock_ti = h.train_inputs(proc, mode="stock")
    frozen = file_uri(local_frozen_path(pcache, h.key, "magicyuv"))
    if sglang_fails is not None:
        exc, message = sglang_fails
        with pytest.raises(exc, match=message):
            sp.run_peer(peers(family, "stock"), PROMPT, [frozen])
    else:
        out = sp.run_peer(peers(family, "stock"), PROMPT, [frozen])
        assert not (out["video_grid_thw"].tolist() == stock_ti["video_grid_thw"].tolist()
                    and torch.equal(out["pixel_values_videos"], stock_ti["pixel_values_videos"]))
    # ... while the plugin serves the same entry exactly.
    assert_parity(sp.run_peer(peers(family, "plugin"), PROMPT, ref.video_data), ref, h, family, "plugin")


# --- plugin behaviour ----------------------------------------------------------------------------------
def test_plugin_refuses_mixed_requests(videos, pcache, train_processors, peers):
    family = "qwen2_5_vl"
    h = vidcache.get(videos["hevc_25"], _options("tight-hevc-25", family, "stock"), pcache)
    ref = prepare(train_processors[family], PROMPT, [h], mode="plugin").video_data[0]
    frozen = prepare(train_processors[family], PROMPT, [h], mode="stock").video_data[0]
    two = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}{VIDEO_PLACEHOLDER}Compare.<|im_end|>\n"
    with pytest.raises(ValueError, match="cannot be mixed"):
        sp.run_peer(peers(family, "plugin"), two, [ref, frozen])


def test_plugin_serves_several_refs_and_plain_videos(videos, pcache, train_processors, peers):
    """Two refs in one request are exact; a request without refs is stock SGLang's own path."""
    family = "qwen3_vl"
    proc = train_processors[family]
    hs = [vidcache.get(videos[n], VideoOptions(family=family), pcache) for n in ("h264_ntsc", "mpeg4_25_odd")]
    two = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}{VIDEO_PLACEHOLDER}Compare.<|im_end|>\n"
    prep = prepare(proc, two, hs, mode="plugin")
    out = sp.run_peer(peers(family, "plugin"), two, prep.video_data)
    assert torch.equal(out["pixel_values_videos"], prep.train_inputs["pixel_values_videos"])
    assert out["input_ids"] == prep.expanded_ids
    # A plain frozen file (stock semantics) on the plugin server: the 224-grid entry stock mode serves.
    h224 = vidcache.get(videos["h264_ntsc"], VideoOptions.for_stock_sglang(family), pcache)
    stock = prepare(proc, PROMPT, [h224], mode="stock")
    out = sp.run_peer(peers(family, "plugin"), PROMPT, stock.video_data)
    assert torch.equal(out["pixel_values_videos"], stock.train_inputs["pixel_values_videos"])
    assert out["input_ids"] == stock.expanded_ids


def test_stock_sglang_fails_loudly_on_a_ref(videos, pcache, train_processors, peers):
    """A server started without the plugin cannot decode a reference: it fails at load time, in its
    own loader (not the plugin's), rather than silently serving stock semantics.  (SGLang's own error: 0.5.23
    raises it as a ValueError, a 400; 0.5.16 wraps every loader error in a RuntimeError, a 500.)"""
    import importlib.metadata as md
    family = "qwen2_vl"
    h = vidcache.get(videos["hevc_25"], _options("tight-hevc-25", family, "stock"), pcache)
    ref = prepare(train_processors[family], PROMPT, [h], mode="plugin").video_data[0]
    error = RuntimeError if md.version("sglang") == "0.5.16" else ValueError
    with pytest.raises(error, match=r"loading VIDEO data at index 0: Error while loading data "
                                         r"data:application/vnd\.vidcache\.ref\+json") as e:
        sp.run_peer(peers(family, "stock"), PROMPT, [ref])
    assert "cannot load vidcache reference" not in str(e.value)


def _ref(rec) -> str:
    return REF_PREFIX + base64.b64encode(json.dumps(rec).encode()).decode()


def test_plugin_rejects_unknown_foreign_and_old_refs(videos, pcache, train_processors, peers, tmp_path):
    """Each bad reference is a client error (ValueError) naming its kind; none falls back to decoding."""
    peer = peers("qwen2_vl", "plugin")
    absent = {"vidcache_ref": 2, "tier": pcache.identity, "key": "0" * 32 + ".1." + "0" * 32}
    with pytest.raises(ValueError, match=r"cannot load vidcache reference .*\[not_cached\]"):
        sp.run_peer(peer, PROMPT, [_ref(absent)])
    with pytest.raises(ValueError, match=r"cannot load vidcache reference .*\[invalid_key\]"):
        sp.run_peer(peer, PROMPT, [_ref({**absent, "key": "0" * 32 + ".1.nope"})])
    # A reference to another cache: this node resolves only its own (VIDCACHE_DIR), never another path.
    other = VideoCache(tmp_path / "other")
    foreign = prepare(train_processors["qwen2_vl"], PROMPT,
                      [vidcache.get(videos["ffv1_10_small"], VideoOptions(family="qwen2_vl"), other)], mode="plugin")
    with pytest.raises(ValueError, match=r"cannot load vidcache reference .*\[tier_mismatch\]"):
        sp.run_peer(peer, PROMPT, foreign.video_data)
    # The version-1 format named a cache directory: refused, and nothing is opened or created there.
    target = tmp_path / "named_by_request"
    with pytest.raises(ValueError, match=r"cannot load vidcache reference .*\[invalid_key\]"):
        sp.run_peer(peer, PROMPT, [_ref({"vidcache_ref": 1, "cache": str(target), "key": absent["key"]})])
    assert not target.exists()


def test_plugin_refuses_an_entry_of_another_patch_size(videos, pcache, train_processors, peers):
    h = vidcache.get(videos["hevc_25"], _options("tight-hevc-25", "qwen2_5_vl", "plugin"), pcache)
    ref = prepare(train_processors["qwen2_5_vl"], PROMPT, [h], mode="plugin").video_data[0]
    with pytest.raises(ValueError, match="patch"):
        sp.run_peer(peers("qwen3_vl", "plugin"), PROMPT, [ref])


def test_plugin_module_is_the_only_sglang_importer():
    """`import vidcache` (and its sglang config) must not pull SGLang in; only the plugin module does."""
    import subprocess
    import sys
    code = ("import sys, vidcache, vidcache.sglang.config, vidcache.sglang.plugin, vidcache.sglang.transport; "
            "assert 'sglang' not in sys.modules, 'sglang imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
