"""Equal computation (issue 47), the parts that need no server: positions by mode and family, never by guess; the
prompt's ``mm_token_type_ids``; both ``get_rope_index`` call forms; sglang-config's vision fix; the model package's
grid rewrite against SGLang's own window and rotary code; Miles' startup verdict.  The real server:
tests/sglang_server/test_sglang_real_server.py."""
from __future__ import annotations

import json
import math

import pytest
import torch

import vidcache
from vidcache import VideoCache, VideoOptions, prepare
from vidcache.errors import ConfigError
from vidcache.processing import VIDEO_PLACEHOLDER
from vidcache.testing.processors import build_processor
from vidcache.testing.videos import make_video

from support.cli import run_cli

PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe.<|im_end|>\n<|im_start|>assistant\n"
# 9 s at 10 fps, 2 fps sampled: 18 frames, 9 temporal patches of a small frame: time dominates the grid, so the
# modes' seconds per grid (2/sample_fps vs 2/24) move the text after the video.
SMALL = {"fps": 2.0, "min_pixels": 3136, "max_pixels": 12544}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return VideoCache(str(tmp_path_factory.mktemp("eq") / "node"))


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    return make_video(str(tmp_path_factory.mktemp("eqclip") / "c.mp4"), codec="h264", width=160, height=120,
                      fps=10, n_frames=90, seed=3)


def handle(clip, cache, family="qwen2_5_vl"):
    return vidcache.get(clip, VideoOptions(family=family, **SMALL), cache)


# --- positions: the mode comes from the request ---------------------------------------------------------------
def test_qwen2_5_vl_positions_and_tensors_need_the_mode(clip, cache):
    proc, h = build_processor("qwen2_5_vl"), handle(clip, cache)
    ids = prepare(proc, PROMPT, [h], mode="plugin").expanded_ids
    with pytest.raises(ConfigError, match="depend on the mode"):
        vidcache.rope_positions(proc, ids, [h])
    with pytest.raises(ConfigError, match="depend on the mode"):
        vidcache.train_inputs(proc, [h])
    with pytest.raises(ConfigError, match="depend on the mode"):
        h.train_inputs(proc)


@pytest.mark.parametrize("mode", ["stock", "plugin"])
def test_positions_from_the_request_are_its_modes(clip, cache, mode):
    proc, h = build_processor("qwen2_5_vl"), handle(clip, cache)
    stock = {"transport": "file"} if mode == "stock" else {}
    req = prepare(proc, PROMPT, [h], mode=mode, **stock)
    ids = req.expanded_ids + [1000, 1001]
    by_request = vidcache.rope_positions(proc, ids, request=req)
    assert torch.equal(by_request, vidcache.rope_positions(proc, ids, [h], mode=mode))
    other = "plugin" if mode == "stock" else "stock"
    assert not torch.equal(by_request, vidcache.rope_positions(proc, ids, [h], mode=other))
    spg = float(req.train_inputs["second_per_grid_ts"][0])
    assert math.isclose(spg, 2 / 24 if mode == "stock" else 2 / 2.0, rel_tol=1e-6)
    with pytest.raises(ConfigError, match="prepared in"):
        vidcache.rope_positions(proc, ids, request=req, mode=other)


def test_other_families_need_no_mode(clip, cache):
    proc, h = build_processor("qwen3_vl"), handle(clip, cache, "qwen3_vl")
    req = prepare(proc, PROMPT, [h], mode="plugin")
    assert torch.equal(vidcache.rope_positions(proc, req.expanded_ids, [h]),
                       vidcache.rope_positions(proc, req.expanded_ids, request=req))


def test_a_handle_of_another_family_is_refused(clip, cache):
    # Qwen2-VL and Qwen2.5-VL share patch 14: before, a Qwen2-VL entry passed the family check and its rule was used.
    q2 = handle(clip, cache, "qwen2_vl")
    proc = build_processor("qwen2_5_vl")
    ids = prepare(build_processor("qwen2_vl"), PROMPT, [q2], mode="plugin").expanded_ids
    with pytest.raises(ConfigError, match="built for qwen2_vl, but the processor is qwen2_5_vl"):
        vidcache.rope_positions(proc, ids, [q2], mode="plugin")
    with pytest.raises(ConfigError, match="built for qwen2_vl"):
        prepare(proc, PROMPT, [q2], mode="plugin")


@pytest.mark.parametrize("tps", [float("nan"), float("inf"), -2.0, 0.0, 1e30])
def test_bad_tokens_per_second_is_refused(clip, cache, tps):
    proc, h = build_processor("qwen2_5_vl"), handle(clip, cache)
    req = prepare(proc, PROMPT, [h], mode="plugin")
    with pytest.raises(ConfigError, match="tokens_per_second must be a finite number"):
        vidcache.rope_positions(proc, req.expanded_ids, request=req, tokens_per_second=tps)
    with pytest.raises(ConfigError, match="tokens_per_second must be a finite number"):
        vidcache.rope_positions(proc, req.expanded_ids, request=req,
                                config={"vision_config": {"tokens_per_second": tps}})


def test_batched_input_ids_are_refused(clip, cache):
    proc = build_processor("qwen2_5_vl")
    with pytest.raises(ConfigError, match="one sequence"):
        vidcache.rope_positions(proc, torch.tensor([[1000, 1001, 1002]]))
    h = handle(clip, cache)
    req = prepare(proc, PROMPT, [h], mode="plugin")
    with pytest.raises(ConfigError, match="one sequence"):
        vidcache.rope_positions(proc, torch.tensor([req.expanded_ids]), request=req)
    assert vidcache.rope_positions(proc, torch.tensor([1000, 1001, 1002])).shape == (3, 3)


def test_a_grid_off_the_merge_size_is_refused():
    proc = build_processor("qwen2_5_vl")
    pad = proc.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    with pytest.raises(ConfigError, match="multiples of the merge size 2"):
        vidcache.rope_positions(proc, [1000, pad, pad, 1001], image_grid_thw=[[1, 3, 3]])


# --- mm_token_type_ids ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_mm_token_type_ids_equal_the_processors_own(clip, cache, family):
    proc, h = build_processor(family), handle(clip, cache, family)
    # in the processor's own token layout (plugin mode's default is the model's, which 5.2x's Qwen3-VL wraps)
    req = prepare(proc, PROMPT, [h], mode="plugin", token_layout=vidcache.processing.layout_of(proc, family))
    kw = {"do_sample_frames": False, "do_resize": False, "return_tensors": "pt", "return_mm_token_type_ids": True,
          "video_metadata": [vidcache.processing.video_metadata(h.manifest, "plugin")]}
    own = proc(text=[PROMPT], videos=[h.frames()], **kw)
    assert own["input_ids"][0].tolist() == req.expanded_ids      # the same prompt, in the processor's own layout
    assert torch.equal(req.train_inputs["mm_token_type_ids"], own["mm_token_type_ids"])
    assert int((req.train_inputs["mm_token_type_ids"] == 2).sum()) == int(own["video_grid_thw"].prod(-1).sum()) // 4
    resp = req.expanded_ids + [1000, 1001]
    assert torch.equal(vidcache.mm_token_type_ids(proc, resp)[:, : len(req.expanded_ids)], own["mm_token_type_ids"])


# --- the train hook's get_rope_index: both call forms ---------------------------------------------------------
def test_engine_get_rope_index_takes_both_call_forms(clip, cache):
    import types

    from transformers import Qwen2_5_VLConfig

    from vidcache.positions import engine_get_rope_index
    proc, h = build_processor("qwen2_5_vl"), handle(clip, cache)
    req = prepare(proc, PROMPT, [h], mode="plugin")
    tok = proc.tokenizer
    cfg = Qwen2_5_VLConfig(vision_config={"spatial_merge_size": 2, "tokens_per_second": 2},
                           image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
                           video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"))
    me = types.SimpleNamespace(config=cfg)
    fn = engine_get_rope_index("sglang", "qwen2_5_vl")
    ids = torch.tensor([req.expanded_ids + [1000, 1001]])
    grid, spg = req.train_inputs["video_grid_thw"], req.train_inputs["second_per_grid_ts"]
    mm = vidcache.mm_token_type_ids(proc, ids[0])
    mask = torch.ones_like(ids)
    want = vidcache.rope_positions(proc, ids[0], request=req)
    new, _ = fn(me, ids, mm, None, grid, spg, mask)                                  # Megatron-Bridge since #3040
    kw, _ = fn(me, ids, mm_token_type_ids=mm, video_grid_thw=grid, second_per_grid_ts=spg, attention_mask=mask)
    old, _ = fn(me, ids, None, grid, second_per_grid_ts=spg, attention_mask=mask)    # before (transformers < 5.3)
    old_pos, _ = fn(me, ids, None, grid, spg, mask)
    for got in (new, kw, old, old_pos):
        assert torch.equal(got[:, 0], want)
    with pytest.raises(TypeError, match="two values"):
        fn(me, ids, mm, None, grid, video_grid_thw=grid)


# --- sglang-config: the vision fix ------------------------------------------------------------------------------
def test_sglang_config_fixes_qwen2_5_vl_vision_in_both_modes(tmp_path):
    node = tmp_path / "fresh-node"
    plugin = json.loads(run_cli(["sglang-config", "--family", "qwen2_5_vl", "--mode", "plugin"], node,
                                check=True).stdout)
    assert plugin["env"]["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "vidcache.sglang.models"
    assert "--model-impl" not in plugin["server_args"]
    stock = json.loads(run_cli(["sglang-config", "--family", "qwen2_5_vl", "--mode", "stock"], node,
                               check=True).stdout)
    assert stock["server_args"][-2:] == ["--model-impl", "transformers"]
    assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in stock["env"]
    assert any("radix cache" in n for n in stock["notes"])
    pkg = json.loads(run_cli(["sglang-config", "--family", "qwen2_5_vl", "--mode", "stock", "--vision",
                             "package"], node, check=True).stdout)
    assert pkg["env"]["SGLANG_EXTERNAL_MODEL_PACKAGE"] == "vidcache.sglang.models"
    assert pkg["check"].endswith("--server-vision package")
    for mode in ("plugin", "stock"):         # SGLang's own Qwen3-VL attends per frame: nothing to fix
        q3 = json.loads(run_cli(["sglang-config", "--family", "qwen3_vl", "--mode", mode], node, check=True).stdout)
        assert "SGLANG_EXTERNAL_MODEL_PACKAGE" not in q3["env"] and "--model-impl" not in q3["server_args"]
        assert q3["vision"] == {"attention": "per_temporal_patch", "fix": None}


def test_sglang_config_miles_carries_the_train_hook_for_the_families_that_need_it(tmp_path):
    node = tmp_path / "fresh-node"
    out = run_cli(["sglang-config", "--family", "qwen2_5_vl", "--mode", "stock", "--format", "miles"], node,
                  check=True).stdout
    assert "--custom-megatron-init-path miles_integration.train_hooks.install_train_hooks" in out
    assert "--sglang-model-impl transformers" in out
    q3 = run_cli(["sglang-config", "--family", "qwen3_vl", "--mode", "plugin", "--format", "miles"], node,
                 check=True).stdout
    assert "--custom-megatron-init-path" not in q3


# --- the model package's grid rewrite, against SGLang's own code ---------------------------------------------
GRIDS = torch.tensor([[4, 8, 12], [1, 6, 10], [3, 16, 4]])


def test_per_temporal_patch_changes_only_the_full_attention_sequences():
    """SGLang's own window index and rotary position ids are the same for ``[t, h, w]`` and ``t`` rows of
    ``[1, h, w]``; only the full-attention ``cu_seqlens`` change, to transformers' per-frame ones."""
    pytest.importorskip("sglang", reason="SGLang is the test venv's peer (scripts/setup_peer_env.sh)")
    import types

    from sglang.srt.models.qwen2_5_vl import Qwen2_5_VisionTransformer as SGL
    from transformers.vision_utils import get_vision_cu_seqlens

    from vidcache.sglang.models.qwen2_5_vl import per_temporal_patch
    me = types.SimpleNamespace(window_size=112, spatial_merge_size=2, patch_size=14, spatial_merge_unit=4)
    split = per_temporal_patch(GRIDS)
    assert split.tolist() == [[1, 8, 12]] * 4 + [[1, 6, 10]] + [[1, 16, 4]] * 3
    wi, cu = SGL.get_window_index(me, GRIDS)
    wi_s, cu_s = SGL.get_window_index(me, split)
    assert torch.equal(wi, wi_s) and cu == cu_s
    # rot_pos_emb's ids: SGLang's own (a static method of its RotaryPosMixin), repeated t times per row
    ids = [SGL.rot_pos_ids(h, w, 2).repeat(t, 1) for t, h, w in GRIDS.tolist()]
    ids_s = [SGL.rot_pos_ids(h, w, 2) for _, h, w in split.tolist()]
    assert torch.equal(torch.cat(ids), torch.cat(ids_s))
    sglang_full = torch.cat([torch.zeros(1, dtype=torch.long), (split.prod(-1)).cumsum(0)])
    assert torch.equal(sglang_full.to(torch.int32), get_vision_cu_seqlens(GRIDS))        # transformers' own
    assert not torch.equal(torch.cat([torch.zeros(1, dtype=torch.long), GRIDS.prod(-1).cumsum(0)]).to(torch.int32),
                           get_vision_cu_seqlens(GRIDS))


def test_the_plugin_reports_the_model_package(monkeypatch):
    pytest.importorskip("sglang", reason="SGLang is the test venv's peer (scripts/setup_peer_env.sh)")
    from vidcache.sglang.plugin.qwen_vl import server_facts
    from vidcache.sglang.request import parse_server_facts
    monkeypatch.delenv("SGLANG_EXTERNAL_MODEL_PACKAGE", raising=False)
    assert parse_server_facts("x. " + server_facts()) == {"model_package": None}
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "vidcache.sglang.models")
    assert parse_server_facts("vidcache attestation failed: ... " + server_facts()) == {
        "model_package": "vidcache.sglang.models"}
    assert parse_server_facts("an older plugin's refusal") is None


@pytest.mark.parametrize("impl,package,want", [
    (None, None, "across_frames"), ("auto", None, "across_frames"), ("transformers", None, "per_temporal_patch"),
    ("auto", "vidcache.sglang.models", "per_temporal_patch"), ("auto", "other.pkg", "across_frames")])
def test_server_vision_rule(impl, package, want):
    from vidcache.sglang_facts import server_vision
    assert server_vision("qwen2_5_vl", impl, package) == want
    assert server_vision("qwen3_vl", impl, package) == "per_temporal_patch"
    assert server_vision("qwen2_vl", impl, package) == "per_temporal_patch"


def test_the_trainer_position_check_covers_every_model_type():
    """The architecture review found positions' table without qwen3_vl_moe, which MODEL_TYPES has: a model type
    half-added.  Every model type has a trainer class to check, under its family's rule."""
    from vidcache import mrope
    from vidcache.families import FAMILIES, MODEL_TYPES
    from vidcache.positions import trainer_rule_problem
    from vidcache.families import FAMILY_OF_MODEL_TYPE
    assert all(all(m.trainer_classes) for m in MODEL_TYPES.values())
    for model_type, family in FAMILY_OF_MODEL_TYPE.items():
        assert MODEL_TYPES[model_type].family == family
    assert FAMILIES["qwen3_vl"].per_frame and trainer_rule_problem("qwen3_vl_moe", "sglang") is None
