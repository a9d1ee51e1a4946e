"""vidcache: decode each video once, feed SGLang and the trainer bit-identical frames.

Names are imported lazily, so ``vidcache.dataset`` (lazy datasets, no frames) can be
used without importing torch.

Floors, bottom up (each imports only from below; vidcache/floors.py states them, tests/test_layers.py keeps them):
  errors, families, engines, digest, keys, options, serving, sglang_facts, token_layout, attest   facts: exceptions, the model families and types and the rollout engines served (one record each), digests, keys, options, serving and SGLang facts, token layouts, train-tensor digests
  store/                          bytes under keys (LMDB, fsspec, tiers); imports only errors
  loader/                         the pure pipeline: source bytes -> canonical frames
  manifest, encode, frozen_file, config, identity, embeddings.record   entry records; the video writer; the frozen-file format; node settings; the cache's identity; the embedding record
  integrity                       is this copy sound? (blobs, manifests, frozen files): one answer for every path
  frozen_copies, compact, repair, catalog   the cache's policies: frozen files, compact layout, repair, listing/stats
  reads                           the read path: tiers, checks, the quarantine-and-retry rule, the memos
  cache                           VideoCache: lookup, build, housekeeping
  node                            the caches open in this process, and the lookup by identity
  processing, device, mrope       the trainer side: tensors from cached frames and manifests (no handles); M-RoPE rules
  handle, dataset, prompt_files, parquet_cells, readahead, inputs_ahead, pullworker, positions, embeddings/   references above the cache; datasets (one parquet cell at a time); read-ahead, the next batches' tensors, its pull worker; positions; the frozen-vision embedding tier
  sglang/, vllm/, rollout/        the rollout side: SGLang's and vLLM's adapters (neither imports the other) on rollout/, the engine-neutral core
  planning, prewarming, pulling, embeddings.jobs, cli/, doctor   the jobs
"""
from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.2.0"       # pyproject.toml reads it from here

_EXPORTS = {
    "VideoCache": "vidcache.cache", "open_cache": "vidcache.node", "node_cache": "vidcache.node",
    "cache_key": "vidcache.keys", "CacheConfig": "vidcache.config",
    "VideoHandle": "vidcache.handle", "get": "vidcache.handle", "lazy": "vidcache.handle",
    "from_key": "vidcache.handle", "VideoOptions": "vidcache.options", "Digest": "vidcache.digest",
    "PreparedRequest": "vidcache.sglang.request", "prepare": "vidcache.sglang.request",
    "train_inputs": "vidcache.handle", "rope_positions": "vidcache.positions",
    "mm_token_type_ids": "vidcache.positions",
    "train_inputs_batch": "vidcache.handle", "LazyVideoDataset": "vidcache.dataset",
    "read_ahead": "vidcache.readahead", "ReadAhead": "vidcache.readahead",
    "train_inputs_ahead": "vidcache.inputs_ahead",
    "prewarm": "vidcache.prewarming", "PrewarmSummary": "vidcache.prewarming",
    "VidcacheError": "vidcache.errors", "NotCachedError": "vidcache.errors", "ParityError": "vidcache.errors",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:      # the same names, for type checkers and IDEs (at run time they stay lazy: __getattr__)
    from vidcache.cache import VideoCache
    from vidcache.node import node_cache, open_cache
    from vidcache.config import CacheConfig
    from vidcache.dataset import LazyVideoDataset
    from vidcache.digest import Digest
    from vidcache.errors import NotCachedError, ParityError, VidcacheError
    from vidcache.handle import VideoHandle, from_key, get, lazy, train_inputs, train_inputs_batch
    from vidcache.inputs_ahead import train_inputs_ahead
    from vidcache.keys import cache_key
    from vidcache.options import VideoOptions
    from vidcache.positions import mm_token_type_ids, rope_positions
    from vidcache.prewarming import PrewarmSummary, prewarm
    from vidcache.readahead import ReadAhead, read_ahead
    from vidcache.sglang.request import PreparedRequest, prepare


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vidcache' has no attribute {name!r}")


def __dir__():
    return __all__
