"""The one table of model types and the family derived from a checkpoint (``vidcache.families``), through
the Python API and the CLI (``prewarm`` / ``sglang-config`` with ``--model DIR``), and the docs' copy of the table."""
import json
import re
from pathlib import Path

import pytest
import transformers

from support.cli import SHELL, run_cli
from support.toy_processors import build_processor, save_checkpoint

from vidcache.errors import ModelTypeError
from vidcache import families as models
from vidcache.families import MODEL_TYPES, derive, read_checkpoint

ROOT = Path(__file__).resolve().parent.parent
NEW = ("qwen3_5", "qwen3_5_moe", "qwen4_exp")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """One saved checkpoint per model type of the table (processor files and config.json)."""
    root = tmp_path_factory.mktemp("ckpts")
    for name in MODEL_TYPES:
        save_checkpoint(name, root / name)
    return root


def test_every_model_type_derives_its_family_verified(ckpts):
    for name, m in MODEL_TYPES.items():
        d = derive(ckpts / name)
        assert (d.family, d.model_type, d.verified) == (m.family, name, True), d
    assert {n: MODEL_TYPES[n].family for n in NEW} == dict.fromkeys(NEW, "qwen3_vl")


def test_the_table_agrees_with_this_transformers():
    """Processor classes from transformers' own Auto mappings; geometry and ids from its config classes."""
    from transformers import AutoConfig
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES
    for name, m in MODEL_TYPES.items():
        assert PROCESSOR_MAPPING_NAMES[name] == m.processor, name
        assert models._auto_processor_class(name, "video") == m.video_processor, name
        cfg = AutoConfig.for_model(name)
        v = cfg.vision_config
        assert (v.patch_size, v.spatial_merge_size, v.temporal_patch_size) == m.geometry, name
        assert (cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.image_token_id, cfg.video_token_id) == \
            m.token_ids, name
        assert cfg.get_text_config().vocab_size == m.vocab_size, name
    assert MODEL_TYPES["qwen3_5"].token_ids == (248053, 248054, 248056, 248057)
    assert MODEL_TYPES["qwen3_5"].vocab_size == 248320


def test_a_saved_qwen3_5_checkpoint_loads_as_qwen3_vl_processing_with_the_real_ids(ckpts):
    from transformers import AutoProcessor
    proc = AutoProcessor.from_pretrained(ckpts / "qwen3_5")
    assert type(proc).__name__ == "Qwen3VLProcessor" and type(proc.video_processor).__name__ == "Qwen3VLVideoProcessor"
    assert proc.tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                                                 "<|video_pad|>"]) == [248053, 248054, 248056, 248057]
    ck = read_checkpoint(ckpts / "qwen3_5")
    assert ck.architectures == ("Qwen3_5ForConditionalGeneration",) and ck.processor_geometry == (16, 2, 2)


@pytest.mark.parametrize("edit,cause", [
    ({"vision_config": {"patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2}},
     "vision_config patch/merge/temporal 14/2/2 (expected 16/2/2)"),
    ({"vision_config": {"patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 1}},
     "vision_config patch/merge/temporal 16/2/1 (expected 16/2/2)"),
])
def test_a_known_model_type_with_other_processing_is_refused_naming_it(tmp_path, edit, cause):
    save_checkpoint("qwen3_5", tmp_path / "c", config=edit)
    with pytest.raises(ModelTypeError, match=re.escape(cause)) as e:
        derive(tmp_path / "c")
    assert "model_type qwen3_5 is processed by vidcache as qwen3_vl" in str(e.value)


def test_a_known_model_type_with_another_video_processor_is_refused(tmp_path):
    build_processor("qwen3_5").save_pretrained(tmp_path / "c")
    vpc = tmp_path / "c" / "processor_config.json"
    cfg = json.loads(vpc.read_text())
    cfg["video_processor"].update(video_processor_type="Qwen2VLVideoProcessor", patch_size=14)
    vpc.write_text(json.dumps(cfg))
    (tmp_path / "c" / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    with pytest.raises(ModelTypeError) as e:
        derive(tmp_path / "c")
    msg = str(e.value)
    assert "video processor Qwen2VLVideoProcessor (expected Qwen3VLVideoProcessor)" in msg
    assert "video processor patch/merge/temporal 14/2/2 (expected 16/2/2)" in msg


def test_an_unknown_model_type_is_unverified_and_runs_only_when_named(tmp_path):
    save_checkpoint("qwen3_5", tmp_path / "c", config={"model_type": "qwen9_vl"})
    with pytest.raises(ModelTypeError, match=r"UNVERIFIED.*--family qwen3_vl"):
        derive(tmp_path / "c")
    d = derive(tmp_path / "c", "qwen3_vl")
    assert (d.family, d.verified) == ("qwen3_vl", False) and "not in vidcache's table" in d.reason
    with pytest.raises(ModelTypeError, match="not qwen2_5_vl"):
        derive(tmp_path / "c", "qwen2_5_vl")


def test_an_unknown_model_type_matching_no_family_is_refused(tmp_path):
    save_checkpoint("qwen3_5", tmp_path / "c", config={
        "model_type": "mystery_vl", "vision_config": {"patch_size": 14, "spatial_merge_size": 2,
                                                      "temporal_patch_size": 2}})
    with pytest.raises(ModelTypeError, match="matches no family") as e:
        derive(tmp_path / "c", "qwen3_vl")
    assert "14/2/2" in str(e.value)


def test_a_named_family_must_agree_with_a_known_model_type(ckpts):
    with pytest.raises(ModelTypeError, match="model_type qwen3_5 is qwen3_vl, not qwen2_5_vl"):
        derive(ckpts / "qwen3_5", "qwen2_5_vl")
    with pytest.raises(ModelTypeError, match="not a checkpoint directory"):
        derive(ckpts / "nowhere")


def test_the_docs_carry_the_table():
    """docs/sglang.md's table of supported model types is ``supported_table()``'s, verbatim."""
    doc = (ROOT / "docs" / "sglang.md").read_text()
    assert models.supported_table() in doc, "regenerate: python -c 'from vidcache.families import " \
                                            "supported_table; print(supported_table())'"


def _cli(tmp_path, *args):
    return run_cli(args, tmp_path / "node", tmp_path / "shared", inherit=SHELL, env={"HF_HUB_OFFLINE": "1"},
                   timeout=600)


def test_cli_prewarm_and_sglang_config_take_a_checkpoint(tmp_path, ckpts, videos):
    """On a fresh node: `prewarm --model DIR` caches Qwen3.5's videos as qwen3_vl entries (the same keys a
    `--family qwen3_vl` prewarm makes: one cache for both), and `sglang-config --model DIR` is qwen3_vl's."""
    ds = tmp_path / "ds.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>Hi", "videos": [str(videos["ffv1_10_small"])]}) + "\n")
    r = _cli(tmp_path, "prewarm", str(ds), "--model", str(ckpts / "qwen3_5"), "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _cli(tmp_path, "ls", "--json")
    rows = json.loads(r.stdout)
    assert [row["family"] for row in rows] == ["qwen3_vl"], rows
    r = _cli(tmp_path, "prewarm", str(ds), "--family", "qwen3_vl", "--no-progress")
    assert r.returncode == 0, r.stdout + r.stderr
    assert [row["key"] for row in json.loads(_cli(tmp_path, "ls", "--json").stdout)] == [rows[0]["key"]]

    by_model = _cli(tmp_path, "sglang-config", "--model", str(ckpts / "qwen3_5_moe"))
    by_family = _cli(tmp_path, "sglang-config", "--family", "qwen3_vl")
    assert by_model.returncode == 0, by_model.stderr
    cfg = json.loads(by_model.stdout)
    assert cfg.pop("model") == str(ckpts / "qwen3_5_moe") and cfg == json.loads(by_family.stdout)   # + its path
    r = _cli(tmp_path, "sglang-config", "--model", str(ckpts / "qwen3_5"), "--family", "qwen2_5_vl")
    assert r.returncode == 1 and "[model_type]" in r.stderr and "not qwen2_5_vl" in r.stderr, r.stderr
    r = _cli(tmp_path, "sglang-config")
    assert r.returncode == 1 and "needs --family or --model DIR" in r.stderr, r.stderr
    assert transformers.__version__ in MODEL_TYPES["qwen3_5"].verified_transformers


def test_miles_derives_the_family_from_hf_checkpoint(ckpts, tmp_path):
    """Miles' --hf-checkpoint: a Qwen3.5 checkpoint is qwen3_vl (and so plugin mode) with no --vidcache-family; a
    contradicting family stops the run; an unknown model type runs only when the family is named."""
    from argparse import Namespace

    from miles_integration.args import family_from_args, video_options_from_args
    args = Namespace(hf_checkpoint=str(ckpts / "qwen3_5"), vidcache_family=None)
    assert family_from_args(args) == "qwen3_vl" and video_options_from_args(args).family == "qwen3_vl"
    with pytest.raises(ValueError, match="contradicts --hf-checkpoint"):
        family_from_args(Namespace(hf_checkpoint=str(ckpts / "qwen4_exp"), vidcache_family="qwen2_5_vl"))
    save_checkpoint("qwen3_5", tmp_path / "u", config={"model_type": "qwen9_vl"})
    with pytest.raises(ModelTypeError, match="UNVERIFIED"):
        family_from_args(Namespace(hf_checkpoint=str(tmp_path / "u"), vidcache_family=None))
    assert family_from_args(Namespace(hf_checkpoint=str(tmp_path / "u"), vidcache_family="qwen3_vl")) == "qwen3_vl"


@pytest.mark.parametrize("files,family", [
    # Qwen2.5-VL as published before transformers had video processors: preprocessor_config.json only.
    ({"config.json": {"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
                      "vision_config": {"patch_size": 14, "spatial_patch_size": 14, "spatial_merge_size": 2,
                                        "temporal_patch_size": 2, "tokens_per_second": 2}},
      "preprocessor_config.json": {"image_processor_type": "Qwen2VLImageProcessor", "processor_class":
                                   "Qwen2_5_VLProcessor", "patch_size": 14, "temporal_patch_size": 2,
                                   "merge_size": 2, "min_pixels": 3136, "max_pixels": 12845056}}, "qwen2_5_vl"),
    # Qwen3.5 with a video_preprocessor_config.json naming its classes.
    ({"config.json": {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
                      "vision_config": {"model_type": "qwen3_5", "patch_size": 16, "spatial_merge_size": 2,
                                        "temporal_patch_size": 2}},
      "video_preprocessor_config.json": {"processor_class": "Qwen3VLProcessor", "video_processor_type":
                                         "Qwen3VLVideoProcessor", "patch_size": 16, "temporal_patch_size": 2,
                                         "merge_size": 2}}, "qwen3_vl"),
    # Only config.json: the classes and the video processor's geometry are transformers' (Auto mapping, defaults).
    ({"config.json": {"model_type": "qwen3_5_moe"}}, "qwen3_vl"),
])
def test_checkpoints_laid_out_like_published_ones(tmp_path, files, family):
    for name, body in files.items():
        (tmp_path / name).write_text(json.dumps(body))
    d = derive(tmp_path)
    assert (d.family, d.verified) == (family, True), d
