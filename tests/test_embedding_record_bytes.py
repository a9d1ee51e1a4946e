"""An embedding record's bytes: ``VisionEmbeddings.from_bytes`` parses safetensors itself (one copy per tensor, out
of LMDB's memory map) and must read exactly what safetensors' own ``load`` reads, and refuse headers that do not
hold their tensors."""
from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load

from vidcache.embeddings.record import EmbeddingKey, VisionEmbeddings, seal, unseal
from vidcache.errors import CorruptEntryError

KEY = EmbeddingKey(entry=f"{7:032x}.10.{'ab' * 16}", weights="0" * 32, dtype="bfloat16", code="qwen3_vl:test")


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float64]),
       rows=st.integers(0, 300), width=st.integers(1, 64), deepstack=st.integers(0, 3), seed=st.integers(0, 2**31))
def test_records_read_back_as_safetensors_reads_them(dtype, rows, width, deepstack, seed):
    g = torch.Generator().manual_seed(seed)
    make = lambda: torch.randn(rows, width, generator=g).to(dtype)                  # noqa: E731
    emb = VisionEmbeddings(KEY, (1, 2, 3), make(), tuple(make() for _ in range(deepstack)))
    raw = emb.to_bytes()
    got = VisionEmbeddings.from_bytes(memoryview(unseal(seal(raw))), expect=KEY)
    ref = load(raw)
    assert got.grid_thw == (1, 2, 3) and len(got.deepstack) == deepstack
    assert torch.equal(got.embeds, ref["embeds"]) and torch.equal(got.embeds, emb.embeds)
    for i, t in enumerate(got.deepstack):
        assert torch.equal(t, ref[f"deepstack.{i}"])
    got.embeds.add_(1)          # its own memory: writable, and the record's bytes are untouched
    assert torch.equal(load(raw)["embeds"], ref["embeds"])


def _with_header(raw: bytes, edit) -> bytes:
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    edit(header)
    h = json.dumps(header).encode()
    return len(h).to_bytes(8, "little") + h + raw[8 + n:]


@pytest.mark.parametrize("edit, why", [
    (lambda h: h["embeds"].update(data_offsets=[0, 10**12]), "offsets"),
    (lambda h: h["embeds"].update(shape=[10**6, 8]), "offsets"),
    (lambda h: h["embeds"].update(dtype="I64"), "I64"),
    (lambda h: h.pop("embeds"), "embeds"),
    (lambda h: h["__metadata__"].update(format="other/1"), "format"),
])
def test_a_header_that_does_not_hold_its_tensors_is_refused(edit, why):
    emb = VisionEmbeddings(KEY, (1, 2, 3), torch.zeros(4, 8, dtype=torch.bfloat16))
    bad = _with_header(emb.to_bytes(), edit)
    with pytest.raises(CorruptEntryError, match=why):
        VisionEmbeddings.from_bytes(unseal(seal(bad)))     # its digest is sound: only the parse can refuse it


def test_truncated_bytes_are_refused():
    raw = VisionEmbeddings(KEY, (1, 2, 3), torch.zeros(4, 8, dtype=torch.bfloat16)).to_bytes()
    for cut in (0, 4, 9, len(raw) - 1):
        with pytest.raises(CorruptEntryError, match="not readable"):
            VisionEmbeddings.from_bytes(raw[:cut])
