"""Offline toy Qwen-VL processors, to try the API and for tests (no hub download, no real checkpoint).

``toy_processor(family)`` (= ``build_processor(family)``) returns a real transformers processor (`Qwen2VLProcessor`, `Qwen2_5_VLProcessor`
or `Qwen3VLProcessor`) with the real video/image processors configured like the published checkpoints,
and a tiny tokenizer in place of the real one.

The tokenizer is a byte-level BPE with *no merges* (every byte is one token) plus the Qwen special tokens as
added tokens. Unlike a WordLevel toy vocabulary it is lossless: ``decode(encode(text)) == text`` for any
text, so Qwen3's ``<1.2 seconds>`` timestamp text gets distinct ids (a timestamp mismatch shows up in
``input_ids``), and SGLang's decode -> re-tokenize path for ``input_ids`` prompts round-trips.
For the families (``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``) token ids are NOT the real Qwen ids (bytes are
0..255, special tokens follow); use ``TOKEN_IDS`` or ``tokenizer.convert_tokens_to_ids``.

Qwen3-VL-MoE (``qwen3_vl_moe``, Qwen3-VL's ids 151652...) and the Qwen3.5 / 3.6 / 3.8 model types
(``qwen3_5``, ``qwen3_5_moe``, ``qwen4_exp``: ``MODEL_TYPES``) get the
Qwen3-VL processor (what transformers' Auto mapping gives them) with a tokenizer whose special tokens sit at the
real ids: vision_start 248053, vision_end 248054, image_pad 248056, video_pad 248057 (``families``' table:
transformers' ``Qwen3_5Config`` defaults, the published config.json's values), the other Qwen specials in
Qwen's order just before them (<|endoftext|> at vision_start - 9, as in every Qwen vocabulary), and filler tokens
(never produced by encoding) between the bytes and the specials.  ``save_checkpoint`` writes either as a
checkpoint directory with a ``config.json`` (architectures, vision config, token ids, vocab_size 248320).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# Model types built with the real special-token ids (their family's processor, a tokenizer placed like theirs).
MODEL_TYPES = ("qwen3_vl_moe", "qwen3_5", "qwen3_5_moe", "qwen4_exp")
# Qwen's added tokens in vocabulary order, from <|endoftext|> to <|video_pad|> (the real-id tokenizers).
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")

SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Byte-level tokens take ids 0..255 and specials follow in SPECIAL_TOKENS order.
TOKEN_IDS = {tok: 256 + i for i, tok in enumerate(SPECIAL_TOKENS)}

# Video-processor settings of the published checkpoints (preprocessor_config.json /
# video_preprocessor_config.json): Qwen2-VL / Qwen2.5-VL min_pixels 3136, max_pixels 12845056 (per frame);
# Qwen3-VL size {shortest_edge: 4096, longest_edge: 25165824} (bounds T*H*W), mean/std 0.5, patch 16.
HUB_VIDEO_KWARGS: dict[str, dict[str, Any]] = {
    "qwen2_vl": {"size": {"shortest_edge": 3136, "longest_edge": 12845056}},
    "qwen2_5_vl": {"size": {"shortest_edge": 3136, "longest_edge": 12845056}},
    "qwen3_vl": {
        "size": {"shortest_edge": 4096, "longest_edge": 25165824},
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
    },
}
# SGLang 0.5.23 overrides only qwen2_vl when it loads the processor
# (srt/utils/hf_transformers/processor.py): size = {shortest_edge: 3136, longest_edge: 1003520}.
SGLANG_QWEN2_VL_SIZE = {"shortest_edge": 3136, "longest_edge": 1003520}


@lru_cache(maxsize=None)
def _tokenizer_object(model_type: str | None = None):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_chars = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    # Order by the byte value each stand-in represents, so id == byte value.
    b2u = _bytes_to_unicode()
    assert set(b2u.values()) == set(byte_chars)
    vocab = {b2u[b]: b for b in range(256)}
    want = TOKEN_IDS
    specials = list(SPECIAL_TOKENS)
    if model_type is not None:
        want = token_ids(model_type)
        first = want["<|vision_start|>"] - QWEN_SPECIALS.index("<|vision_start|>")
        # Multi-character fillers: a BPE without merges never encodes to one, so they only move the specials.
        vocab.update({f"<filler{i}>": i for i in range(256, first)})
        specials = list(QWEN_SPECIALS)
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=False))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(specials)
    for tok, i in want.items():
        assert tk.token_to_id(tok) == i, (tok, tk.token_to_id(tok), i)
    return tk


def token_ids(model_type: str) -> dict[str, int]:
    """The real vision token ids of a model type (``vidcache.families.MODEL_TYPES``), by token."""
    from ..families import MODEL_TYPES as TABLE
    return dict(zip(("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"),
                    TABLE[model_type].token_ids))


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-char map (the one the `tokenizers` ByteLevel pre-tokenizer uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_tokenizer(model_type: str | None = None):
    """A fresh `PreTrainedTokenizerFast` over the toy byte-level vocabulary with the Qwen special tokens (at the
    real ids of ``model_type``, one of ``MODEL_TYPES``, when given)."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=_tokenizer_object(model_type),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    return tok


def build_video_processor(family: str, **overrides):
    """The family's HF video processor with hub-like settings, updated by ``overrides``."""
    from transformers import Qwen2VLVideoProcessor, Qwen3VLVideoProcessor

    _check_family(family)
    kwargs = {**HUB_VIDEO_KWARGS[family], **overrides}
    cls = Qwen3VLVideoProcessor if family == "qwen3_vl" else Qwen2VLVideoProcessor
    return cls(**kwargs)


def build_image_processor(family: str):
    from transformers import Qwen2VLImageProcessor

    _check_family(family)
    if family == "qwen3_vl":
        return Qwen2VLImageProcessor(
            patch_size=16, image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5], merge_size=2
        )
    return Qwen2VLImageProcessor(min_pixels=3136, max_pixels=12845056)


def build_processor(family: str, *, video_processor_kwargs: dict | None = None, sglang_size_override: bool = False):
    """An offline HF processor for ``family`` in FAMILIES, or for a model type in MODEL_TYPES (its family's
    processor, the real special-token ids).

    video_processor_kwargs: extra kwargs for the video processor constructor (override the hub-like ones).
    sglang_size_override: for qwen2_vl, apply the size SGLang 0.5.23 forces when it loads the processor.
    """
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor, Qwen3VLProcessor

    model_type = family if family in MODEL_TYPES else None
    if model_type is not None:
        from ..families import FAMILY_OF_MODEL_TYPE
        family = FAMILY_OF_MODEL_TYPE[model_type]
    _check_family(family)
    vkw = dict(video_processor_kwargs or {})
    if sglang_size_override and family == "qwen2_vl":
        vkw.setdefault("size", dict(SGLANG_QWEN2_VL_SIZE))
    cls = {"qwen2_vl": Qwen2VLProcessor, "qwen2_5_vl": Qwen2_5_VLProcessor, "qwen3_vl": Qwen3VLProcessor}[family]
    return cls(
        image_processor=build_image_processor(family),
        tokenizer=build_tokenizer(model_type),
        video_processor=build_video_processor(family, **vkw),
    )


def checkpoint_config(model_type: str) -> dict:
    """A ``config.json`` for ``model_type`` (a family's own, or one of MODEL_TYPES) with what vidcache and the
    engines read: architectures, the vision config's geometry, the token ids and vocab_size (the table's)."""
    from ..families import MODEL_TYPES as TABLE
    m = TABLE[model_type]
    patch, merge, temporal = m.geometry
    start, end, image, video = m.token_ids
    return {"model_type": model_type, "architectures": list(m.architectures), "vision_start_token_id": start,
            "vision_end_token_id": end, "image_token_id": image, "video_token_id": video,
            "text_config": {"vocab_size": m.vocab_size},
            "vision_config": {"patch_size": patch, "spatial_merge_size": merge, "temporal_patch_size": temporal}}


def save_checkpoint(model_type: str, path, chat_template: str | None = None, config: dict | None = None):
    """An offline processor of ``model_type`` saved as a checkpoint directory ``path`` with its ``config.json``
    (``checkpoint_config``, updated by ``config``), and ``chat_template`` on the processor and its tokenizer when
    given.  Returns the processor."""
    import json
    import os
    proc = build_processor(model_type)
    if chat_template is not None:
        proc.tokenizer.chat_template = chat_template
        proc.chat_template = chat_template
    proc.save_pretrained(str(path))
    with open(os.path.join(str(path), "config.json"), "w") as f:
        json.dump({**checkpoint_config(model_type), **(config or {})}, f, indent=1)
    return proc


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {FAMILIES}")


def toy_processor(family: str = "qwen2_5_vl"):
    """An offline processor of ``family`` to try vidcache's API with (``vidcache.testing.toy_processor``).

    Its video and image processors are the real transformers classes configured like the published
    checkpoints, so tensors match a real checkpoint's processor; the tokenizer is a tiny byte-level one,
    so token ids are not Qwen's.  For training, load the checkpoint's own ``AutoProcessor``."""
    return build_processor(family)
