"""vidcache: decode each video once, feed SGLang and the trainer bit-identical frames.

Names are imported lazily, so ``vidcache.loader.dataset`` (lazy datasets, no frames)
can be used without importing torch.
"""
from importlib import import_module

_EXPORTS = {
    "VideoCache": "vidcache.cache", "open_cache": "vidcache.cache", "cache_key": "vidcache.cache",
    "VideoHandle": "vidcache.loader.handle", "VideoOptions": "vidcache.options", "Digest": "vidcache.digest",
    "PreparedRequest": "vidcache.processing", "prepare": "vidcache.processing",
    "train_inputs": "vidcache.processing", "LazyVideoDataset": "vidcache.loader.dataset",
    "VidcacheError": "vidcache.errors", "NotCachedError": "vidcache.errors", "ParityError": "vidcache.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vidcache' has no attribute {name!r}")


def __dir__():
    return __all__
