"""``vidcache embed`` reads only the vision tower's weights (``load_tower``), and what it loads is exactly what a
trainer that loads the whole checkpoint has: the same tensors, so the same ``weights`` digest (the records' key)
and the same embeddings.  Checkpoints it cannot load strictly fall back to the whole model, never to a guess."""
from __future__ import annotations

import json
import logging
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from vidcache.embeddings import tower_of
from vidcache.embeddings.compute import base_model, compute, load_checkpoint, load_tower

from support.tiny_checkpoint import write_tiny_checkpoint

FAMILIES = ["qwen2_5_vl", "qwen3_vl"]


@pytest.fixture(scope="module", params=FAMILIES)
def ckpt(request, tmp_path_factory):
    return request.param, write_tiny_checkpoint(request.param, tmp_path_factory.mktemp(request.param) / "ckpt")


def _full(path, dtype):
    from transformers import AutoModelForImageTextToText
    return AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").eval()


def _rewritten(src, dst, edit):
    """A copy of checkpoint ``src`` at ``dst`` whose tensors are ``edit(tensors)``."""
    shutil.copytree(src, dst)
    tensors = load_file(os.path.join(dst, "model.safetensors"))
    save_file(edit(tensors), os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    return dst


def _pixels(model, family):
    vc = model.config.vision_config
    grid = torch.tensor([[2, 4, 4]])
    g = torch.Generator().manual_seed(1)
    return {"pixel_values_videos": torch.randn(2 * 4 * 4, 3 * vc.temporal_patch_size * vc.patch_size ** 2, generator=g),
            "video_grid_thw": grid}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_tower_alone_is_the_whole_models_tower(ckpt, dtype):
    family, path = ckpt
    alone, why = load_tower(path, dtype, "cpu")
    assert why is None, why
    full = _full(path, dtype)
    got, want = base_model(alone).visual.state_dict(), base_model(full).visual.state_dict()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert all(p.device.type == "meta" for p in base_model(alone).language_model.parameters())   # never loaded
    ta, tf = tower_of(alone), tower_of(full)
    assert (ta.weights, ta.dtype, ta.code) == (tf.weights, tf.dtype, tf.code)
    entry = f"{3:032x}.10.{'cd' * 16}"
    ea, ef = compute(ta, _pixels(full, family), entry), compute(tf, _pixels(full, family), entry)
    assert ea.key == ef.key and torch.equal(ea.embeds, ef.embeds)
    assert len(ea.deepstack) == len(ef.deepstack) and all(torch.equal(x, y) for x, y in zip(ea.deepstack, ef.deepstack))
    assert (len(ea.deepstack) > 0) == (family == "qwen3_vl")


def _tower_prefix(name: str) -> str | None:
    return next((p for p in ("model.visual.", "visual.") if name.startswith(p)), None)


@pytest.mark.parametrize("layout", ["model.visual.", "visual."])
def test_both_tower_layouts_load_the_same_tower(ckpt, tmp_path, layout):
    """transformers 5's ``model.visual.*``, and ``visual.*``: the layout the Qwen2-VL / Qwen2.5-VL hub checkpoints
    were published in (transformers renames it on load, and writes it back on save)."""
    family, path = ckpt
    moved = _rewritten(path, tmp_path / "moved",
                       lambda ts: {layout + k[len(p):] if (p := _tower_prefix(k)) else k: v for k, v in ts.items()})
    with open(os.path.join(moved, "model.safetensors"), "rb") as f:      # the layout is the one asked for
        n = int.from_bytes(f.read(8), "little")
        names = [k for k in json.loads(f.read(n)) if _tower_prefix(k)]
    assert names and all(_tower_prefix(k) == layout for k in names)
    alone, why = load_tower(moved, torch.float32, "cpu")
    assert why is None, why
    assert tower_of(alone).weights == tower_of(_full(path, torch.float32)).weights


def test_a_tower_that_does_not_load_strictly_falls_back_to_the_whole_model(ckpt, tmp_path, caplog):
    family, path = ckpt
    gone = []

    def drop_one(ts):            # one of the tower's tensors (its last bias) is not in the checkpoint
        gone.append(sorted(k for k in ts if _tower_prefix(k) and k.endswith(".bias"))[-1])
        return {k: v for k, v in ts.items() if k != gone[0]}
    dropped = _rewritten(path, tmp_path / "dropped", drop_one)
    _, why = load_tower(dropped, torch.float32, "cpu")
    assert why is not None and "missing" in why and gone[0][len(_tower_prefix(gone[0])):] in why
    with caplog.at_level(logging.INFO, logger="vidcache.embeddings.compute"):
        model, _ = load_checkpoint(str(dropped), "float32", "cpu")
    assert "loading the whole checkpoint" in caplog.text
    assert all(p.device.type == "cpu" for p in model.parameters())         # from_pretrained's whole model


def test_no_safetensors_means_the_whole_model(tmp_path):
    assert load_tower(str(tmp_path), torch.float32, "cpu") == (None, "no model.safetensors or "
                                                                    "model.safetensors.index.json in the "
                                                                    "checkpoint directory")
