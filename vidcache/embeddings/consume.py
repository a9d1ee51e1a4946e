"""The trainer's side: a transformers Qwen-VL model that takes cached embeddings instead of running its tower.

transformers' Qwen-VL models (5.x) take the encoder's output directly: ``forward(..., mm_encoder_outputs=
{"video": <get_video_features' output>})`` skips ``get_video_features`` (the tower and its merger) and scatters
the given rows into the video pad tokens, deepstack features included (Qwen3-VL).  ``forward_kwargs`` builds that
argument from the tier's records; everything else is passed as today::

    tower = vidcache.embeddings.tower_of(model)              # once: hashes the tower's weights
    embs = [tier.get(tower.key(h.resolve())) for h in handles]   # None: a miss, compute or run the tower
    out = model(input_ids=ids, attention_mask=mask, position_ids=vidcache.rope_positions(...),
                **vidcache.embeddings.forward_kwargs(model, embs, tower=tower))

``pixel_values_videos`` must not be passed with them (transformers refuses both).  Positions are unchanged:
``video_grid_thw`` comes from the records, ``position_ids`` (``rope_positions``) or the model's own M-RoPE as before
(Qwen2.5-VL: pass ``second_per_grid_ts`` from ``train_inputs`` as today when the model computes them).
"""
from __future__ import annotations

import sys
from typing import Sequence

from ..errors import ConfigError
from .compute import Tower, base_model, takes_deepstack
from .record import VisionEmbeddings


def forward_kwargs(model, embeddings: Sequence[VisionEmbeddings], *, tower: Tower | None = None) -> dict:
    """``mm_encoder_outputs`` and ``video_grid_thw`` for one forward of ``model`` over the videos ``embeddings``
    (in prompt order; a batch: every sample's videos, in order, as ``pixel_values_videos`` would be).

    ``tower``: the model's ``Tower``; each record must then have been computed by it (same weights digest, dtype
    and code), else ``ConfigError``: a record read through ``EmbeddingTier.get(tower.key(entry))`` always is.
    """
    import torch
    if not embeddings or any(e is None for e in embeddings):
        raise ConfigError("forward_kwargs: an embeddings record per video is needed (a None is a tier miss: "
                          "compute it, or pass pixel_values_videos instead)")
    if tower is not None:
        for e in embeddings:
            got = (e.key.weights, e.key.dtype, e.key.code)
            if got != (tower.weights, tower.dtype, tower.code):
                raise ConfigError(f"embeddings of entry {e.key.entry} were computed by another tower "
                                  f"({got}), not this model's ({(tower.weights, tower.dtype, tower.code)})")
    base = base_model(model)
    device = base.get_input_embeddings().weight.device
    grid = torch.tensor([list(e.grid_thw) for e in embeddings], dtype=torch.long, device=device)
    pooled = tuple(e.embeds.to(device) for e in embeddings)
    if not takes_deepstack(model):
        from transformers.modeling_outputs import BaseModelOutputWithPooling
        return {"mm_encoder_outputs": {"video": BaseModelOutputWithPooling(pooler_output=pooled)},
                "video_grid_thw": grid}
    layers = {len(e.deepstack) for e in embeddings}
    if len(layers) != 1 or 0 in layers:
        raise ConfigError(f"{type(model).__name__} consumes deepstack features, and these records carry "
                          f"{sorted(layers)} layers of them (computed by another family's tower?)")
    # the model's own output class: the field its forward reads (deepstack_features), one tuple per layer
    out_cls = getattr(sys.modules[type(base).__module__], "BaseModelOutputWithDeepstackFeatures")
    deepstack = [tuple(e.deepstack[i].to(device) for e in embeddings) for i in range(layers.pop())]
    return {"mm_encoder_outputs": {"video": out_cls(pooler_output=pooled, deepstack_features=deepstack)},
            "video_grid_thw": grid}
