"""SGLang's ``Qwen2_5_VLForConditionalGeneration`` with the original model's vision attention: per temporal patch.

A subclass, not a copy: everything (weights, window attention, rotary embeddings, the merger, CUDA graphs,
data-parallel sharding, the language model) is SGLang's.  The only change is the grid its vision tower is given:
each row ``[t, h, w]`` becomes ``t`` rows ``[1, h, w]``.  SGLang's tower derives three things from the grid:

* the full-attention blocks' ``cu_seqlens`` (``t*h*w`` per row): now ``h*w`` per temporal patch, as transformers'
  ``get_vision_cu_seqlens`` (``merge_temporal=False``) and the original Qwen2.5-VL code have it;
* the window index and windowed ``cu_seqlens`` (``get_window_index``): already built per temporal patch, in
  temporal order, so ``t`` rows of one patch give the same windows in the same order;
* the rotary position embeddings (``rot_pos_emb``): the same ``h, w`` positions repeated ``t`` times either way.

The patches of one video are contiguous and in temporal order in ``pixel_values``, so no row moves.  Images have
``t == 1`` and pass unchanged.
"""
from __future__ import annotations

import logging

import torch
from sglang.srt.models import qwen2_5_vl as _sglang

from ...sglang_facts import VERIFIED_SGLANG_VERSIONS
from ..versions import installed_sglang
from . import PACKAGE

logger = logging.getLogger(__name__)

VISION_RULE = "per_temporal_patch"     # what check-server reports for a server that runs this class


def per_temporal_patch(grid_thw: torch.Tensor) -> torch.Tensor:
    """``[N, 3]`` grids as one ``[1, h, w]`` row per temporal patch (``sum(t)`` rows), on the same device."""
    rows = grid_thw.repeat_interleave(grid_thw[:, 0].to(torch.long), dim=0).clone()
    rows[:, 0] = 1
    return rows


class Qwen2_5_VisionTransformer(_sglang.Qwen2_5_VisionTransformer):
    """SGLang's vision tower, given one grid row per temporal patch (the module's state is untouched)."""

    def forward(self, x: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        return super().forward(x, per_temporal_patch(grid_thw))


class Qwen2_5_VLForConditionalGeneration(_sglang.Qwen2_5_VLForConditionalGeneration):
    """SGLang's Qwen2.5-VL whose vision tower attends within each temporal patch (same name: SGLang's registry
    and multimodal-processor lookup go by it)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The tower SGLang built, re-classed: same parameters and buffers, so weight loading and every other
        # method are SGLang's; only forward sees the per-temporal-patch grid.
        if type(self.visual) is _sglang.Qwen2_5_VisionTransformer:
            self.visual.__class__ = Qwen2_5_VisionTransformer
        else:           # a future SGLang that builds another tower class: refuse rather than run unfixed
            raise TypeError(f"{PACKAGE}: expected SGLang's Qwen2_5_VisionTransformer, got {type(self.visual)}")
        logger.info("%s: %s with per-temporal-patch vision attention (the original model's)", PACKAGE,
                    type(self).__name__)
        if (version := installed_sglang()) not in VERIFIED_SGLANG_VERSIONS:
            logger.warning("%s: SGLang %s is UNVERIFIED for vidcache's Qwen2.5-VL model package (verified: %s); "
                           "run `vidcache check-computation` against this server", PACKAGE, version,
                           ", ".join(VERIFIED_SGLANG_VERSIONS))


EntryClass = [Qwen2_5_VLForConditionalGeneration]
