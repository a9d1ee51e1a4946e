"""Tiny random-weight Qwen-VL checkpoints a real engine loads: written at test time from transformers' own classes.

``write_tiny_checkpoint(family, path)`` saves ``Qwen2_5_VLForConditionalGeneration`` / ``Qwen3VLForConditionalGeneration``
(real ``architectures``, fp32 safetensors) with the toy processor of ``vidcache.testing.processors`` and the Qwen-style
chat template of ``support.vllm_peer``.  Shaped like ``vidcache.testing.kl.tiny_config`` (same token ids, same patch
layout, same init range, seed 0) but with the sizes vLLM's CPU kernels accept: text hidden 256, 4 heads of 64, 2 KV
heads, 2 layers; vision depth 2, hidden 128, 2 heads (kl.py's hidden 64 / head_dim 16 is below what vLLM's CPU
attention takes).  The vocabulary is the toy tokenizer's 263 tokens, so full-vocabulary logprobs are cheap and the
KL against the trainer is exact, not top-k.  ~10 MB, a few seconds to write.
"""
from __future__ import annotations

import os

from vidcache.testing.kl import INIT_RANGE, _token_ids

TEXT = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2}
MROPE = {"qwen2_5_vl": [8, 12, 12], "qwen3_vl": [12, 10, 10]}      # sum = head_dim / 2 = 32


def tiny_config(family: str, processor):
    vp = processor.video_processor
    ids = _token_ids(processor.tokenizer)
    vision = {"depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "in_channels": 3,
              "patch_size": vp.patch_size, "temporal_patch_size": vp.temporal_patch_size,
              "spatial_merge_size": vp.merge_size, "out_hidden_size": TEXT["hidden_size"],
              "initializer_range": INIT_RANGE}
    text = {**TEXT, "vocab_size": len(processor.tokenizer), "initializer_range": INIT_RANGE,
            "max_position_embeddings": 32768, "bos_token_id": None,
            "eos_token_id": processor.tokenizer.eos_token_id, "pad_token_id": None}
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig
        vision.update(window_size=112, fullatt_block_indexes=[1], tokens_per_second=2)
        text.update(rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": MROPE[family]})
        cfg = Qwen2_5_VLConfig(vision_config=vision, text_config=text, **ids)
        cfg.architectures = ["Qwen2_5_VLForConditionalGeneration"]
        return cfg
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig
        vision.update(num_position_embeddings=2304, deepstack_visual_indexes=[1], hidden_act="gelu_pytorch_tanh")
        text.update(head_dim=TEXT["hidden_size"] // TEXT["num_attention_heads"],
                    rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": MROPE[family],
                                     "mrope_interleaved": True})
        cfg = Qwen3VLConfig(vision_config=vision, text_config=text, **ids)
        cfg.architectures = ["Qwen3VLForConditionalGeneration"]
        return cfg
    raise ValueError(f"no tiny checkpoint for {family!r}: qwen2_5_vl or qwen3_vl")


def write_tiny_checkpoint(family: str, path, seed: int = 0) -> str:
    """Write the checkpoint (processor, chat template, config, fp32 weights) to ``path``; returns it."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration, Qwen3VLForConditionalGeneration

    from support.vllm_peer import QWEN_CHAT_TEMPLATE
    from vidcache.testing.processors import build_processor
    proc = build_processor(family)
    proc.chat_template = QWEN_CHAT_TEMPLATE
    cls = {"qwen2_5_vl": Qwen2_5_VLForConditionalGeneration, "qwen3_vl": Qwen3VLForConditionalGeneration}[family]
    cfg = tiny_config(family, proc)
    torch.manual_seed(seed)        # the init draws from the global generator: the same seed, the same weights
    model = cls(cfg).to(torch.float32).eval()
    path = os.fspath(path)
    model.save_pretrained(path, safe_serialization=True)
    proc.save_pretrained(path)
    return path


def load_tiny_model(path):
    """The checkpoint at ``path`` as the trainer loads it: transformers' class, fp32, eval, SDPA, CPU."""
    import torch
    from transformers import AutoModelForImageTextToText
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32,
                                                       attn_implementation="sdpa").eval()
