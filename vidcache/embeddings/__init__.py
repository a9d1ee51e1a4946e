"""The frozen-vision embedding tier: a vision tower's output for a cached entry, computed once.

Only for a *frozen* tower: the key carries the digest of the tower's loaded weights, so a tower that trains
(or a fine-tuned checkpoint) never reads another tower's embeddings.  ``record``: what a record is and its bytes;
``tier``: where records live (node LMDB + shared tier); ``compute``: running a tower over cached entries;
``consume``: a transformers model that takes them instead of running its tower.  docs/embeddings.md.

Imports are light (no torch) until a function that needs it runs.
"""
from .record import EmbeddingKey, VisionEmbeddings, weights_digest


# name -> the submodule defining it, imported on first use: ``vidcache verify --embeddings`` reads records without
# torch or transformers.  (The function ``compute`` is ``vidcache.embeddings.compute.compute``: the submodule keeps
# its name here.)
_LAZY = {"EmbeddingTier": "tier", "Tower": "compute", "tower_of": "compute", "embed_entries": "compute",
         "forward_kwargs": "consume"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)


__all__ = ["EmbeddingKey", "VisionEmbeddings", "weights_digest", *_LAZY]
