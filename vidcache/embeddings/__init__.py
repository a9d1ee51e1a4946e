"""The frozen-vision embedding tier: a vision tower's output for a cached entry, computed once.

Only for a *frozen* tower: the key carries the digest of the tower's loaded weights, so a tower that trains
(or a fine-tuned checkpoint) never reads another tower's embeddings.
"""
from .record import EmbeddingKey, VisionEmbeddings, weights_digest

__all__ = ["EmbeddingKey", "VisionEmbeddings", "weights_digest"]
