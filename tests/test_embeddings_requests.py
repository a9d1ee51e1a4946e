"""Asking the engines for precomputed vision embeddings, without an engine: the request builders (SGLang's
``prepare``, vLLM's ``prepare_vllm``), the version-5 reference, the attestation's digest, and every refusal (a record
for another tower or entry, a grid that is not the video's, stock mode, vLLM's dropped ``second_per_grid_ts``).
The real engines' consumption and the KL are in tests/sglang_server/test_sglang_real_server.py and
tests/vllm_engine/test_real_offline.py.
"""
from __future__ import annotations

import base64
import dataclasses
import json

import pytest
import torch

import vidcache
from support.embedding_records import compute_records, fed, tower_of
from support.tiny_checkpoint import load_tiny_model, write_tiny_checkpoint
from vidcache import VideoCache, VideoOptions, prepare
from vidcache.attest import tensor_digest
from vidcache.errors import InvalidKeyError, NotCachedError, OptionsError
from vidcache.processing import VIDEO_PLACEHOLDER
from vidcache.rollout.embeddings import DirectoryLookup, EmbeddingsMismatchError, Tower, decoder_rows, decoder_width
from vidcache.rollout.ref import REF_PREFIX, parse_ref
from vidcache.testing.videos import make_video

PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def setup(request, tmp_path_factory):
    family = request.param
    d = tmp_path_factory.mktemp(f"emb-{family}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(d / "node"))
        mp.delenv("VIDCACHE_SHARED", raising=False)
        ckpt = write_tiny_checkpoint(family, d / "ckpt")
        from transformers import AutoProcessor
        proc = AutoProcessor.from_pretrained(ckpt)
        model = load_tiny_model(ckpt)
        clip = make_video(str(d / "clip.mp4"), codec="h264", width=160, height=120, fps=10, n_frames=40, seed=3)
        h = vidcache.get(clip, VideoOptions(family=family, fps=2.0, min_pixels=3136, max_pixels=20000), VideoCache())
        ti = vidcache.train_inputs(proc, [h], mode="plugin")
        recs = compute_records(model, family, ti, [h.resolve()])
        yield {"family": family, "proc": proc, "model": model, "h": h, "ti": ti, "recs": recs, "dir": d,
               "clip": clip}


def _ref(uri: str) -> dict:
    return json.loads(base64.b64decode(uri[len(REF_PREFIX):]))


def test_prepare_names_the_tower_and_attests_the_rows(setup):
    s = setup
    req = prepare(s["proc"], PROMPT, [s["h"]], mode="plugin", embeddings=s["recs"])
    ref = _ref(req.video_data[0])
    assert ref["vidcache_ref"] == 5 and ref["embeddings"] == tower_of(s["model"], s["family"]).as_dict()
    rows = decoder_rows(s["recs"][0])
    assert ref["attest"]["embeddings"] == tensor_digest(rows)
    assert req.extra["embeddings"][0] is s["recs"][0]
    # Qwen3-VL's deepstack levels travel side by side with the main rows, as both engines' towers output them
    levels = len(s["recs"][0].deepstack)
    assert (levels > 0) == (s["family"] == "qwen3_vl")
    assert rows.shape == (s["recs"][0].embeds.shape[0], s["recs"][0].embeds.shape[1] * (1 + levels))
    assert rows.shape[-1] == decoder_width(s["model"].config)       # what the SGLang plugin checks rows against
    assert parse_ref(req.video_data[0])["embeddings"] == ref["embeddings"]


def test_the_trainer_fed_the_records_scores_as_with_its_tower(setup):
    """The records are the tower's output for the trainer's tensors: fed to the decoder instead, the logits are
    bit-identical (and the tower was not run)."""
    s = setup
    req = prepare(s["proc"], PROMPT, [s["h"]], mode="plugin", embeddings=s["recs"])
    from vidcache.rollout.computation import trainer_logprobs
    ids = req.expanded_ids
    pos = vidcache.rope_positions(s["proc"], ids, request=req, engine="transformers",
                                  config=s["model"].config)[:, None, :]
    base = trainer_logprobs(s["model"], ids, req.train_inputs, pos)
    with fed(s["model"], s["recs"]) as calls:
        got = trainer_logprobs(s["model"], ids, req.train_inputs, pos)
    assert calls and torch.equal(base, got)


def test_a_record_for_another_tower_or_entry_is_refused(setup):
    s = setup
    rec = s["recs"][0]
    other = dataclasses.replace(rec, key=dataclasses.replace(rec.key, weights="0" * 32))
    tower = Tower.of(rec.key)
    with pytest.raises(EmbeddingsMismatchError, match="another tower"):
        prepare(s["proc"], PROMPT, [s["h"]], mode="plugin", embeddings=[other], tower=tower)
    with pytest.raises(EmbeddingsMismatchError, match="another tower"):
        prepare(s["proc"], PROMPT, [s["h"]], mode="plugin", embeddings=lambda key: other, tower=tower)
    # a lookup over a directory: a record planted under another key's name is refused by from_bytes
    look = DirectoryLookup(s["dir"] / "records")
    look.put(other, key=rec.key)
    with pytest.raises(EmbeddingsMismatchError, match="computed for"):
        look(rec.key)
    with pytest.raises(NotCachedError):
        look(dataclasses.replace(rec.key, dtype="bfloat16"))


def test_a_record_of_another_grid_is_refused(setup):
    s = setup
    rec = s["recs"][0]
    t, h, w = rec.grid_thw
    bad = dataclasses.replace(rec, grid_thw=(t + 1, h, w))
    with pytest.raises(EmbeddingsMismatchError, match="grid"):
        prepare(s["proc"], PROMPT, [s["h"]], mode="plugin", embeddings=[bad])


def test_stock_mode_cannot_carry_embeddings(setup):
    s = setup
    with pytest.raises(OptionsError, match="plugin mode"):
        prepare(s["proc"], PROMPT, [s["h"]], mode="stock", embeddings=s["recs"])


def test_references_say_embeddings_by_version(setup):
    s = setup
    req = prepare(s["proc"], PROMPT, [s["h"]], mode="plugin", embeddings=s["recs"])
    ref = _ref(req.video_data[0])
    for broken in ({**ref, "vidcache_ref": 4}, {k: v for k, v in ref.items() if k != "embeddings"},
                   {**ref, "embeddings": {"weights": "x"}}):
        uri = REF_PREFIX + base64.b64encode(json.dumps(broken).encode()).decode()
        with pytest.raises(InvalidKeyError):
            parse_ref(uri)


def test_vllm_item_takes_the_towers_layout(setup):
    from vidcache.vllm.request import prepare_vllm
    s = setup
    req = prepare_vllm(s["proc"], PROMPT, [s["h"]], embeddings=s["recs"])
    item = req.prompt["multi_modal_data"]["video"]
    assert torch.equal(item["video_embeds"], decoder_rows(s["recs"][0]))
    assert item["video_grid_thw"].tolist() == [list(s["recs"][0].grid_thw)]
    assert "multi_modal_uuids" not in req.prompt
    if s["family"] == "qwen3_vl":
        assert item["timestamps"].shape == (1, s["recs"][0].grid_thw[0])


@pytest.mark.parametrize("setup", ["qwen2_5_vl"], indirect=True)     # only Qwen2.5-VL's M-RoPE reads the seconds
def test_vllm_refuses_qwen2_5_embeddings_off_one_second_per_grid(setup, tmp_path):
    """vLLM 0.34 drops second_per_grid_ts from an embeddings item: at 1 fps (2 s per grid) the positions would
    differ."""
    from vidcache.vllm.request import prepare_vllm
    s = setup
    h = vidcache.get(s["clip"], VideoOptions(family="qwen2_5_vl", fps=1.0, min_pixels=3136, max_pixels=20000))
    ti = vidcache.train_inputs(s["proc"], [h], mode="plugin")
    assert float(ti["second_per_grid_ts"][0]) == 2.0
    recs = compute_records(s["model"], s["family"], ti, [h.resolve()])
    with pytest.raises(OptionsError, match="vLLM 0.34"):
        prepare_vllm(s["proc"], PROMPT, [h], embeddings=recs)


def test_sglang_config_names_the_servers_embeddings_lookup(tmp_path):
    """The CLI alone, on a fresh node: ``sglang-config --embeddings`` puts the lookup into the server's env (a
    directory of records, or module:callable), plugin mode only; it creates nothing on the node."""
    from support.cli import run_cli
    node = tmp_path / "node"
    base = ["sglang-config", "--family", "qwen3_vl", "--mode", "plugin", "--embeddings"]
    r = run_cli([*base, str(tmp_path / "records")], node)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    env = json.loads(r.stdout)["env"]
    assert env["VIDCACHE_EMBEDDINGS_DIR"] == str(tmp_path / "records") and "VIDCACHE_EMBEDDINGS_LOOKUP" not in env
    r = run_cli([*base, "mytier.lookup:find", "--format", "shell"], node)
    assert r.returncode == 0 and "VIDCACHE_EMBEDDINGS_LOOKUP=mytier.lookup:find" in r.stdout, r.stdout + r.stderr
    r = run_cli(["sglang-config", "--family", "qwen3_vl", "--mode", "stock", "--embeddings", str(tmp_path)], node)
    assert r.returncode != 0 and "vidcache: error: [options]" in r.stderr and "--mode plugin" in r.stderr, r.stderr
    assert not node.exists()
