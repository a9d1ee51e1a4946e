"""The frozen-vision embedding tier (issue 49 A): computed once from the trainer's own inputs, stored behind the same
integrity rules as frames, read on a fresh node through the shared tier, and consumed by transformers' model with
logits equal to the model running its own tower."""
import json

import pytest
import torch

from vidcache import VideoOptions
from vidcache import keys as K
from vidcache.embeddings import EmbeddingTier, forward_kwargs, tower_of
from vidcache.embeddings.compute import compute, entry_tensors
from vidcache.errors import ConfigError, CorruptEntryError
from vidcache.processing import expanded_ids

from support.tiny_checkpoint import load_tiny_model, write_tiny_checkpoint

FAMILIES = ["qwen2_5_vl", "qwen3_vl", "qwen3_5"]
VIDEO = "ffv1_10_small"        # 30 frames: several temporal patches


def _qwen3_5(path):
    """A tiny Qwen3.5 (transformers' own class, hybrid linear/full attention decoder, no deepstack), written as
    tiny_checkpoint writes the others."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from support.tiny_checkpoint import INIT_RANGE, TEXT
    from vidcache.testing.kl import _token_ids
    from vidcache.testing.processors import build_processor
    proc = build_processor("qwen3_5")
    vp = proc.video_processor
    vision = {"depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "in_channels": 3,
              "patch_size": vp.patch_size, "temporal_patch_size": vp.temporal_patch_size,
              "spatial_merge_size": vp.merge_size, "out_hidden_size": TEXT["hidden_size"],
              "num_position_embeddings": 2304, "initializer_range": INIT_RANGE}
    text = {**TEXT, "vocab_size": len(proc.tokenizer), "initializer_range": INIT_RANGE, "head_dim": 64,
            "linear_key_head_dim": 32, "linear_value_head_dim": 32, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4, "layer_types": ["linear_attention", "full_attention"],
            "eos_token_id": proc.tokenizer.eos_token_id,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "mrope_section": [12, 10, 10],
                                "mrope_interleaved": True, "partial_rotary_factor": 1.0}}
    cfg = Qwen3_5Config(vision_config=vision, text_config=text, **_token_ids(proc.tokenizer))
    torch.manual_seed(0)
    Qwen3_5ForConditionalGeneration(cfg).to(torch.float32).eval().save_pretrained(path)
    proc.save_pretrained(path)
    return str(path)


def checkpoint(family, path):
    return _qwen3_5(path) if family == "qwen3_5" else write_tiny_checkpoint(family, path)


def _setup(family, node_a, tmp_path):
    from transformers import AutoProcessor
    ckpt = checkpoint(family, tmp_path / "ckpt")
    model, proc = load_tiny_model(ckpt), AutoProcessor.from_pretrained(ckpt)
    key = node_a.build(VIDEO, options=VideoOptions(family="qwen3_vl" if family == "qwen3_5" else family))[0]
    return model, proc, key


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_embeddings_give_the_logits_of_the_model_running_its_tower(family, node_a, tmp_path):
    model, proc, key = _setup(family, node_a, tmp_path)
    tower = tower_of(model)
    tensors = entry_tensors(node_a.cache, proc, key)
    fresh = compute(tower, tensors, key)
    assert bool(fresh.deepstack) == (family == "qwen3_vl")      # only Qwen3-VL's decoder takes deepstack features
    EmbeddingTier(node_a.cache).put(fresh)

    # A fresh node reads them through the shared tier, checked, and keeps a local copy.
    b = node_a.node("b")
    tier_b = EmbeddingTier(b)
    assert tier_b.local.exists_many([K.emb(tower.key(key).id)]) == [False]
    got = tier_b.get(tower.key(key))
    assert tier_b.local.exists_many([K.emb(tower.key(key).id)]) == [True]
    assert torch.equal(got.embeds, fresh.embeds) and len(got.deepstack) == len(fresh.deepstack)
    assert all(torch.equal(x, y) for x, y in zip(got.deepstack, fresh.deepstack))
    again = compute(tower_of(model), entry_tensors(b, proc, key), key)          # a second run: the same bytes
    assert torch.equal(again.embeds, got.embeds)

    # The model with cached embeddings: its logits equal those of the model running its own tower.
    ids = torch.tensor([expanded_ids(proc, "<|vision_start|><|video_pad|><|vision_end|>what is it?",
                                     [node_a.cache.manifest(key)], mode="plugin")])
    common = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "mm_token_type_ids": torch.tensor(proc.create_mm_token_type_ids(ids.tolist()), dtype=torch.int32)}
    if "second_per_grid_ts" in tensors:
        common["second_per_grid_ts"] = tensors["second_per_grid_ts"]
    with torch.no_grad():
        own = model(**common, pixel_values_videos=tensors["pixel_values_videos"],
                    video_grid_thw=tensors["video_grid_thw"]).logits
        cached = model(**common, **forward_kwargs(model, [got], tower=tower)).logits
    assert torch.equal(own, cached)
    if family == "qwen3_vl":        # the deepstack features reach the decoder: without them the logits differ
        no_deep = forward_kwargs(model, [got], tower=tower)
        out = no_deep["mm_encoder_outputs"]["video"]
        out.deepstack_features = [tuple(torch.zeros_like(t) for t in layer) for layer in out.deepstack_features]
        with torch.no_grad():
            assert not torch.equal(own, model(**common, **no_deep).logits)


def test_another_weights_digest_is_a_miss_never_served(node_a, tmp_path):
    model, proc, key = _setup("qwen2_5_vl", node_a, tmp_path)
    tower = tower_of(model)
    tier = EmbeddingTier(node_a.cache)
    emb = compute(tower, entry_tensors(node_a.cache, proc, key), key)
    tier.put(emb)
    with torch.no_grad():
        next(model.model.visual.parameters()).view(-1)[0] += 1e-3       # one weight of the tower, fine-tuned
    tuned = tower_of(model)
    assert tuned.weights != tower.weights and tuned.key(key).id != tower.key(key).id
    assert tier.get(tuned.key(key)) is None and tier.contains([tuned.key(key)]) == [False]
    with pytest.raises(ConfigError, match="computed by another tower"):
        forward_kwargs(model, [emb], tower=tuned)
    # another dtype is another key too
    assert tower_of(model.to(torch.bfloat16)).key(key).dtype == "bfloat16"


def _record(node_a, tmp_path):
    model, proc, key = _setup("qwen2_5_vl", node_a, tmp_path)
    tower = tower_of(model)
    return tower, key, compute(tower, entry_tensors(node_a.cache, proc, key), key)


def test_a_damaged_copy_is_moved_aside_and_the_shared_copy_serves(node_a, tmp_path):
    tower, key, emb = _record(node_a, tmp_path)
    tier = EmbeddingTier(node_a.cache)
    tier.put(emb)
    sk = K.emb(tower.key(key).id)
    raw = bytearray(tier.local.get(sk))
    raw[-5] ^= 0xFF                                      # one bit of a tensor, in the local copy
    tier.local.set_many({sk: bytes(raw)})
    assert tier.verify()[tower.key(key).id] == ["local copy fails its check"]
    got = tier.get(tower.key(key))
    assert torch.equal(got.embeds, emb.embeds)          # the shared copy, pulled again
    assert tier.local.get(K.quarantined(sk)) == bytes(raw)
    assert tier.verify() == {tower.key(key).id: []}


def test_a_record_claiming_another_key_is_refused(node_a, tmp_path):
    from dataclasses import replace

    from vidcache.embeddings.record import VisionEmbeddings, seal
    tower, key, emb = _record(node_a, tmp_path)
    other = replace(tower.key(key), dtype="bfloat16")
    tier = EmbeddingTier(node_a.cache)
    # sound bytes (their digest matches) of one key, stored under another's name: refused, moved aside, a miss
    tier.local.set_many({K.emb(other.id): seal(emb.to_bytes())})
    assert tier.get(other) is None
    assert tier.local.exists_many([K.quarantined(K.emb(other.id))]) == [True]
    with pytest.raises(CorruptEntryError, match="computed for"):
        VisionEmbeddings.from_bytes(emb.to_bytes(), expect=other)
    # a read-only node cannot move it aside: refused, never served
    tier.local.set_many({K.emb(other.id): seal(emb.to_bytes())})
    ro = EmbeddingTier(node_a.cache.with_settings(read_only=True))
    with pytest.raises(CorruptEntryError, match="computed for"):
        ro.get(other)


def test_the_tier_has_its_own_budget(node_a, tmp_path):
    """Embeddings live in their own LMDB: a budget on them evicts embeddings (LRU), never frames."""
    from dataclasses import replace
    tower, key, emb = _record(node_a, tmp_path)
    size = len(emb.to_bytes())
    tier = EmbeddingTier(node_a.cache, max_bytes=size * 6)
    keys_ = [replace(tower.key(key), dtype=f"float{i}") for i in range(12)]
    for k in keys_:
        tier.put(replace(emb, key=k))
    assert 0 < len(tier.ids()) < len(keys_)
    assert tier.local.exists_many([K.emb(keys_[-1].id)]) == [True]      # the newest stays
    assert node_a.cache.local.exists_many([K.ac(key)]) == [True]         # the frames are untouched
    assert len(tier.ids(shared=True)) == len(keys_)                       # the shared tier is never evicted


def test_cli_embed_resume_verify_and_a_fresh_node_through_the_shared_tier(tmp_path, videos):
    """The CLI only, on fresh node directories: prewarm, embed, embed again (resumed: nothing computed), verify
    covers the records; a second node reads them from the shared tier (checked, kept locally) without its tower
    recomputing them; a damaged local copy is found by verify and repaired from the shared tier."""
    from support.cli import run_cli
    ckpt = write_tiny_checkpoint("qwen3_vl", tmp_path / "ckpt")
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n"
                          for n in (VIDEO, "mjpeg_24")))
    a, b, shared = tmp_path / "a", tmp_path / "b", tmp_path / "tier"
    common = ["--model", ckpt, "--dtype", "float32", "--no-progress"]

    r = run_cli(["prewarm", ds, "--model", ckpt, "--no-progress"], node=a, shared=shared)
    assert r.returncode == 0, r.stderr
    r = run_cli(["embed", ds, *common], node=a, shared=shared)
    assert r.returncode == 0, r.stderr
    assert "embed: 2 computed, 0 pulled from the shared tier, 0 already on this node, 0 failed" in r.stdout, r.stdout
    r = run_cli(["embed", ds, *common], node=a, shared=shared)          # resumed: every record is already here
    assert "embed: 0 computed, 0 pulled from the shared tier, 2 already on this node" in r.stdout, r.stdout
    r = run_cli(["verify", "--embeddings"], node=a, shared=shared)
    assert r.returncode == 0 and r.stdout.count("OK  emb ") == 2, r.stdout + r.stderr

    r = run_cli(["embed", ds, *common], node=b, shared=shared)          # a fresh node: read, not recomputed
    assert r.returncode == 0, r.stderr
    assert "embed: 0 computed, 2 pulled from the shared tier, 0 already on this node" in r.stdout, r.stdout
    r = run_cli(["verify", "--embeddings"], node=b, shared=shared)
    assert r.returncode == 0 and r.stdout.count("OK  emb ") == 2, r.stdout + r.stderr

    # damage one record in node b's own LMDB: verify names it, --repair restores it from the shared tier
    from vidcache import VideoCache
    c = VideoCache(b, shared=str(shared))
    tier = EmbeddingTier(c)
    emb_id = tier.ids()[0]
    raw = bytearray(tier.local.get(K.emb(emb_id)))
    raw[-3] ^= 0x40
    tier.local.set_many({K.emb(emb_id): bytes(raw)})
    tier.close()
    c.close()
    r = run_cli(["verify", "--embeddings"], node=b, shared=shared)
    assert r.returncode == 1 and f"BAD emb {emb_id}: local copy fails its check" in r.stdout, r.stdout
    r = run_cli(["verify", "--embeddings", "--repair"], node=b, shared=shared)
    assert f"BAD emb {emb_id}: local copy fails its check -> repaired" in r.stdout, r.stdout + r.stderr
    r = run_cli(["verify", "--embeddings"], node=b, shared=shared)
    assert r.returncode == 0 and r.stdout.count("OK  emb ") == 2, r.stdout


def test_cli_embed_needs_a_model(tmp_path):
    from support.cli import run_cli
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": ["x.mp4"]}) + "\n")
    r = run_cli(["embed", ds], node=tmp_path / "n")
    assert r.returncode == 1 and "vidcache: error: [config] embed needs --model CKPT" in r.stderr, r.stderr


def test_embed_over_ray_each_node_on_its_own_cache(tmp_path, videos):
    """Two Ray nodes, each with its own VIDCACHE_DIR (as prewarm's Ray path), one shared tier: the entries are
    split between them, every record reaches the shared tier, and a second run computes nothing (resume)."""
    ray = pytest.importorskip("ray", reason="ray not installed: pip install -e .[test]")
    from ray.cluster_utils import Cluster

    from support.cli import ROOT
    from vidcache import VideoCache
    from vidcache.embeddings.jobs import embed_over_ray
    ckpt = write_tiny_checkpoint("qwen2_5_vl", tmp_path / "ckpt")
    shared = str(tmp_path / "tier")
    a = VideoCache(tmp_path / "driver", shared=shared)
    entries = [a.ensure(videos[n], VideoOptions()).key for n in (VIDEO, "mjpeg_24", "h264_30")]
    env = {"PYTHONPATH": ROOT}                  # the workers import this checkout's vidcache
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for i in range(2):
        c.add_node(num_cpus=1, env_vars={**env, "VIDCACHE_DIR": str(tmp_path / f"ray_node_{i}")})
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False, runtime_env={"env_vars": env})
    try:
        s = embed_over_ray(a, ckpt, "float32", entries)
        assert (s.computed, s.failed) == (3, 0), s.failures
        again = embed_over_ray(a, ckpt, "float32", entries)
        assert (again.computed, again.present + again.pulled) == (0, 3)
    finally:
        ray.shutdown()
        c.shutdown()
    tier = EmbeddingTier(a)
    assert len(tier.ids(shared=True)) == 3 and all(not p for p in tier.verify(shared=True).values())
    per_node = [EmbeddingTier(VideoCache(tmp_path / f"ray_node_{i}", shared=shared)).ids() for i in range(2)]
    assert all(per_node) and len(set(per_node[0]) | set(per_node[1])) == 3      # both nodes did a share
