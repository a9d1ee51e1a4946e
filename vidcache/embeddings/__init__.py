"""The frozen-vision embedding tier: a vision tower's output for a cached entry, computed once.

Only for a *frozen* tower: the key carries the digest of the tower's loaded weights, so a tower that trains
(or a fine-tuned checkpoint) never reads another tower's embeddings.  ``record``: what a record is and its bytes;
``tier``: where records live (node LMDB + shared tier); ``compute``: running a tower over cached entries;
``consume``: a transformers model that takes them instead of running its tower.  docs/embeddings.md.

Imports are light (no torch) until a function that needs it runs.
"""
from .record import EmbeddingKey, VisionEmbeddings, weights_digest


def __getattr__(name):
    # torch and transformers only when asked for: ``vidcache verify --embeddings`` reads records without them
    if name in ("EmbeddingTier",):
        from .tier import EmbeddingTier
        return EmbeddingTier
    if name in ("Tower", "tower_of", "compute", "embed_entries"):
        from . import compute
        return getattr(compute, name)
    if name == "forward_kwargs":
        from .consume import forward_kwargs
        return forward_kwargs
    raise AttributeError(name)


__all__ = ["EmbeddingKey", "VisionEmbeddings", "weights_digest", "EmbeddingTier", "Tower", "tower_of", "compute",
           "embed_entries", "forward_kwargs"]
