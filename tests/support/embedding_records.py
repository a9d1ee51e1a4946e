"""Vision-embedding records for the engine tests, computed the way the trainer would: transformers' own
``model.model.get_video_features`` on the trainer's ``train_inputs`` (so the engine's rows and the trainer's are one
record's bytes), and a context that feeds a transformers model those rows instead of running its tower.

Not a test module.  The embedding tier (vidcache.embeddings) computes and stores records for real; these tests only
need records that are exactly the tower's output for the tensors the trainer uses.
"""
from __future__ import annotations

import contextlib
import torch

from vidcache.embeddings import EmbeddingKey, VisionEmbeddings, weights_digest
from vidcache.processing import split_per_video
from vidcache.rollout.embeddings import Tower


def tower_of(model, family: str) -> Tower:
    """The tiny model's tower: its loaded weights' digest, dtype and code identity."""
    import transformers
    visual = model.model.visual
    dtype = str(next(visual.parameters()).dtype).removeprefix("torch.")
    code = f"{family}:{type(visual).__module__}.{type(visual).__name__}@{transformers.__version__}"
    return Tower(weights_digest(visual.state_dict()), dtype, code)


@torch.no_grad()
def compute_records(model, family: str, train_inputs: dict, keys: list[str]) -> list[VisionEmbeddings]:
    """One record per video of ``train_inputs`` (in order), keyed by ``keys``: the tower's output on exactly the
    trainer's ``pixel_values_videos`` / ``video_grid_thw``, one video at a time."""
    tower = tower_of(model, family)
    out = []
    for key, t in zip(keys, split_per_video({k: v for k, v in train_inputs.items()
                                               if k in ("pixel_values_videos", "video_grid_thw")})):
        grid = t["video_grid_thw"].reshape(1, 3)
        feats = model.model.get_video_features(t["pixel_values_videos"].to(torch.float32), grid, return_dict=True)
        embeds = torch.cat(list(feats.pooler_output))
        deep = tuple(torch.cat(list(f)) for f in (getattr(feats, "deepstack_features", None) or ()))
        out.append(VisionEmbeddings(EmbeddingKey(key, tower.weights, tower.dtype, tower.code),
                                    tuple(grid[0].tolist()), embeds.contiguous(), tuple(d.contiguous() for d in deep)))
    return out


@contextlib.contextmanager
def fed(model, records: list[VisionEmbeddings]):
    """``model`` scores with ``records``' rows in place of its tower (``get_video_features`` answers with them); yields
    a list that holds one entry per call, so a test can assert the tower was bypassed."""
    calls = []
    inner = model.model

    def get_video_features(pixel_values_videos, video_grid_thw=None, **kw):
        grids = [tuple(r.grid_thw) for r in records]
        assert [tuple(g) for g in torch.as_tensor(video_grid_thw).tolist()] == grids, (video_grid_thw, grids)
        calls.append(grids)
        levels = len(records[0].deepstack)
        pooled = tuple(r.embeds for r in records)
        if not levels:
            from transformers.modeling_outputs import BaseModelOutputWithPooling
            return BaseModelOutputWithPooling(pooler_output=pooled)
        from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures
        return BaseModelOutputWithDeepstackFeatures(
            pooler_output=pooled, deepstack_features=[tuple(r.deepstack[i] for r in records) for i in range(levels)])

    inner.get_video_features = get_video_features
    try:
        yield calls
    finally:
        del inner.get_video_features
