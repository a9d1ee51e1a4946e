"""Miles' own training-side modules and the M-RoPE positions vidcache feeds them (issue 37, docs/miles.md,
"Positions").  Miles' FSDP path asks ``get_batch(..., get_position_ids=True)`` for a plain ``arange`` per sample,
which transformers copies onto all three M-RoPE axes; the train hooks' ``get_batch`` returns the engine's
positions instead, laid out as Miles lays out the tokens.  Runs Miles' real ``get_batch`` and ``DataIterator``
(``bshd``, the CPU layout; a one-rank parallel state), and transformers' own Qwen2.5-VL.
"""
from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from support.miles_compat import miles_or_skip

REPO = Path(__file__).resolve().parents[2]
MILES = miles_or_skip(REPO)       # Miles present: from here on a missing peer is a failure, never a skip

from miles.backends.training_utils import data as miles_data  # noqa: E402
from miles.backends.training_utils import parallel as miles_parallel  # noqa: E402

import vidcache  # noqa: E402
from miles_integration.train_hooks import HANDLE_KEY, encode_handles, wrap_get_batch  # noqa: E402
from support.toy_processors import build_processor  # noqa: E402
from vidcache import VideoOptions  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER, expanded_ids  # noqa: E402
from vidcache.testing import kl  # noqa: E402

KEYS = ["tokens", "loss_masks", "multimodal_train_inputs", "total_lengths", "response_lengths", "max_seq_lens"]


@pytest.fixture
def one_rank(monkeypatch):
    g = types.SimpleNamespace(rank=0, size=1, group=None)
    monkeypatch.setattr(miles_parallel, "_parallel_state",
                        types.SimpleNamespace(cp=g, tp=g, intra_dp=g, indep_dp=g))


def test_fsdp_get_batch_gets_the_engines_positions(videos, cache, one_rank):
    q25 = build_processor("qwen2_5_vl")
    h = vidcache.get(videos["h264_long"], VideoOptions(family="qwen2_5_vl", fps=2.0, min_pixels=3136,
                                                       max_pixels=50176), cache)
    prompt = expanded_ids(q25, f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe.<|im_end|>\n<|im_start|>assistant\n",
                          [h.manifest], "stock")
    response = list(q25.tokenizer("A red square.<|im_end|>", add_special_tokens=False)["input_ids"])
    tokens = prompt + response
    rollout = {"tokens": [torch.tensor(tokens), torch.tensor([5, 6, 7])],
               "loss_masks": [torch.ones(len(response), dtype=torch.int), torch.ones(1, dtype=torch.int)],
               "total_lengths": [len(tokens), 3], "response_lengths": [len(response), 1],
               "max_seq_lens": [len(tokens)] * 2,
               "multimodal_train_inputs": [{HANDLE_KEY: encode_handles([h], "stock")}, None]}

    def batch(engine):
        get_batch = wrap_get_batch(miles_data.get_batch, lambda: q25, engine)
        return get_batch(miles_data.DataIterator(dict(rollout), micro_batch_size=2), KEYS, 1, "bshd",
                         get_position_ids=True)

    plain = batch(None)["position_ids"]                # Miles' own: arange per sample
    assert plain.shape == (2, len(tokens)) and torch.equal(plain[0], torch.arange(len(tokens)))
    b = batch("sglang")
    pos = b["position_ids"]
    want = vidcache.rope_positions(q25, tokens, [h], engine="sglang", mode="stock")
    assert pos.shape == (4, 2, len(tokens))
    assert torch.equal(pos[0], plain)                                 # Miles' text positions: row 0
    assert torch.equal(pos[1:, 0], want)                              # the video sample: SGLang's M-RoPE
    assert torch.equal(pos[1:, 1, :3], torch.arange(3).expand(3, -1))  # the text-only sample: its text positions
    assert not torch.equal(want, torch.arange(len(tokens)).expand(3, -1))

    # transformers' own Qwen2.5-VL, called as Miles' FSDP actor calls it (input_ids, position_ids, the tensors):
    # the sample's logits with the hooks' positions equal those with vidcache.rope_positions, bit for bit.
    model = kl.tiny_model("qwen2_5_vl", q25)
    mm = vidcache.train_inputs(q25, [h], mode="stock")
    ids = torch.tensor([tokens])
    with torch.no_grad():
        fed = model(input_ids=ids, position_ids=pos[:, :1], **mm).logits
        given = model(input_ids=ids, position_ids=want[:, None, :], **mm).logits
        miles = model(input_ids=ids, position_ids=plain[:1], **mm).logits
    assert torch.equal(fed, given)
    assert not torch.equal(fed, miles)
