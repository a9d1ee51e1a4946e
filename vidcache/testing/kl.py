"""Tiny Qwen-VL models with fixed random weights, and the per-token KL between two sides' logits.

For ``benchmarks/kl_table.py`` and ``tests/test_kl_table.py`` (one place, so the table and its test score with the
same model): it lives in the package, next to the toy processors whose configs it extends, because it needs
nothing but transformers and torch (no SGLang, no test helper) and a user can score their own rollout path with it.

The models are transformers' own classes (``Qwen2_5_VLForConditionalGeneration``,
``Qwen3VLForConditionalGeneration``) built from small configs: the vision tower keeps the real patch layout
(patch 14 / 16, temporal patch 2, merge 2, 3 channels: it takes ``pixel_values_videos`` rows of 1176 / 1536
values as the published checkpoints do), the token ids are the toy tokenizer's, and everything else is shrunk
(2 layers, hidden size 64).  Weights are drawn from a fixed seed; the model runs in fp32, eval mode, SDPA
attention, on the CPU.  Its figures say whether two sides' inputs differ and by how much *for this model*:
a trained 7B model's KL for the same inputs is another number (docs/benchmarks.md says so next to the table).
"""
from __future__ import annotations

import math

import torch

# Larger than the checkpoints' 0.02, so a 2-layer random model's next-token distributions are not flat (at
# 0.02 every response token's distribution is within ~1e-4 nats of uniform and any input change looks like 0).
INIT_RANGE = 0.2
TEXT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}
# M-RoPE sections (temporal, height, width) sum to head_dim / 2 = 64 / 4 / 2 = 8, as 16/24/24 sum to 64 in 7B.
MROPE_SECTION = [2, 3, 3]


def _token_ids(tokenizer) -> dict:
    tid = tokenizer.convert_tokens_to_ids
    return {"image_token_id": tid("<|image_pad|>"), "video_token_id": tid("<|video_pad|>"),
            "vision_start_token_id": tid("<|vision_start|>"), "vision_end_token_id": tid("<|vision_end|>")}


def tiny_config(family: str, processor):
    """A small config of ``family`` whose vision tower takes ``processor``'s patch layout."""
    vp = getattr(processor, "video_processor", processor)
    vocab = len(processor.tokenizer)
    ids = _token_ids(processor.tokenizer)
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "in_channels": 3,
              "patch_size": vp.patch_size, "temporal_patch_size": vp.temporal_patch_size,
              "spatial_merge_size": vp.merge_size, "out_hidden_size": TEXT["hidden_size"],
              "initializer_range": INIT_RANGE}
    text = {**TEXT, "vocab_size": vocab, "initializer_range": INIT_RANGE, "max_position_embeddings": 32768,
            "bos_token_id": None, "eos_token_id": processor.tokenizer.eos_token_id, "pad_token_id": None}
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig
        # window 112 px = 8 patches of 14 (the checkpoints' value); block 1 of 2 attends to the whole frame.
        vision.update(window_size=112, fullatt_block_indexes=[1], tokens_per_second=2)
        text.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": MROPE_SECTION})
        return Qwen2_5_VLConfig(vision_config=vision, text_config=text, **ids)
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig
        # 48 x 48 learned position embeddings (interpolated to each grid), deepstack from the last block.
        vision.update(num_position_embeddings=2304, deepstack_visual_indexes=[1], hidden_act="gelu_pytorch_tanh")
        text.update(head_dim=TEXT["hidden_size"] // TEXT["num_attention_heads"],
                    rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": MROPE_SECTION,
                                     "mrope_interleaved": True})
        return Qwen3VLConfig(vision_config=vision, text_config=text, **ids)
    raise ValueError(f"no tiny model for {family!r}: qwen2_5_vl or qwen3_vl")


def tiny_model(family: str, processor, seed: int = 0):
    """transformers' own model class for ``family``, random weights from ``seed``, fp32, eval, on the CPU."""
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration
    cls = {"qwen2_5_vl": Qwen2_5_VLForConditionalGeneration, "qwen3_vl": Qwen3VLForConditionalGeneration}[family]
    cfg = tiny_config(family, processor)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)       # the init draws from the global generator: the same seed, the same weights
    model = cls(cfg).to(torch.float32).eval()
    return model


@torch.no_grad()
def response_logits(model, processor, prompt_ids: list[int], response_ids: list[int],
                    tensors: dict, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 logits ``K x vocab`` that predict each of the K response tokens after ``prompt_ids``.

    ``tensors``: ``pixel_values_videos``, ``video_grid_thw`` and (Qwen2.5-VL) ``second_per_grid_ts`` as one side
    has them.  The model computes its own M-RoPE positions from the ids and the grid (``mm_token_type_ids`` from
    the processor's own ``create_mm_token_type_ids``), so a side's ids, grid and timing all reach the logits,
    unless ``position_ids`` (``[3, len(prompt + response)]``, e.g. ``vidcache.rope_positions``) are given: then
    the model is given those, as a trainer that feeds the rollout engine's positions does.
    """
    ids = list(prompt_ids) + list(response_ids)
    input_ids = torch.tensor([ids], dtype=torch.long)
    kw = {"pixel_values_videos": tensors["pixel_values_videos"].to(torch.float32),
          "video_grid_thw": torch.as_tensor(tensors["video_grid_thw"]).to(torch.long).reshape(-1, 3)}
    spg = tensors.get("second_per_grid_ts")
    if spg is not None and "second_per_grid_ts" in _forward_args(model):
        kw["second_per_grid_ts"] = torch.as_tensor(spg, dtype=torch.float32).reshape(-1)
    mm = torch.tensor(processor.create_mm_token_type_ids([ids]), dtype=torch.int32)
    if position_ids is not None:
        kw["position_ids"] = torch.as_tensor(position_ids, dtype=torch.long).reshape(3, 1, len(ids))
    out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), mm_token_type_ids=mm,
                use_cache=False, **kw)
    start = len(prompt_ids) - 1          # logits at position i predict token i + 1
    return out.logits[0, start:start + len(response_ids)].to(torch.float32)


def _forward_args(model) -> set:
    import inspect
    return set(inspect.signature(model.forward).parameters)


def kl_stats(rollout: torch.Tensor, trainer: torch.Tensor) -> dict:
    """Per-token KL(rollout || trainer) in nats over the K response positions (the field's mismatch unit: the
    rollout policy's log-probs against the trainer's), its mean and max, the share of tokens whose argmax
    differs, the trainer's mean entropy (how peaked this model is), and whether the logits are bitwise equal."""
    lr = torch.log_softmax(rollout.double(), -1)
    lt = torch.log_softmax(trainer.double(), -1)
    kl = (lr.exp() * (lr - lt)).sum(-1).clamp_min(0.0)   # exact 0 for equal rows; the clamp only drops -1e-17
    ent = -(lt.exp() * lt).sum(-1)
    return {"mean_kl": float(kl.mean()), "max_kl": float(kl.max()),
            "argmax_diff": float((rollout.argmax(-1) != trainer.argmax(-1)).double().mean()),
            "entropy": float(ent.mean()), "max_entropy": math.log(rollout.shape[-1]),
            "equal": bool(torch.equal(rollout, trainer)), "k": int(rollout.shape[0])}
