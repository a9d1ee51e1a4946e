"""The caches open in this process: the node's own, one per (directory, shared tier), and the lookup by
identity that a handle or a reference resolves through.

One registry, so a handle rebuilt from a sample's metadata, a plugin reference and Miles' flags all meet the
same ``VideoCache`` (and its memoised manifests and verified blobs).  Keyed by pid as well: a forked worker
opens caches of its own rather than sharing the parent's LMDB environment (LMDB forbids that).
"""
from __future__ import annotations

import os

from .cache import VideoCache, registered
from .config import ENV_DIR, ENV_SHARED, CacheConfig
from .errors import TierMismatchError

_OPEN: dict[tuple, VideoCache] = {}


def node_cache() -> VideoCache:
    """This process's node cache, from ``$VIDCACHE_DIR`` and ``$VIDCACHE_SHARED`` (one per process)."""
    k = (os.getpid(), "node", os.environ.get(ENV_DIR), os.environ.get(ENV_SHARED))
    if k not in _OPEN:
        _OPEN[k] = VideoCache()
    return _OPEN[k]


def open_cache(path=None, **settings) -> VideoCache:
    """A ``VideoCache`` for ``path`` (default: the node's), one per (directory, shared tier) per process.
    Other settings (``read_only``, budgets, a custom store...) make a cache of their own each call."""
    if path is None and not settings:
        return node_cache()
    if set(settings) - {"shared"}:
        return VideoCache(path, **settings)
    where = os.fspath(path) if path is not None else os.environ.get(ENV_DIR)   # unset: $VIDCACHE_DIR
    k = (os.getpid(), "open", where, settings.get("shared"))
    if k not in _OPEN:
        _OPEN[k] = VideoCache(path, **settings)
    return _OPEN[k]


def cache_for(identity: str) -> VideoCache:
    """The cache of this process that has ``identity``: one made here, else the node's own.  Never
    opens a path named by the caller; a foreign identity is a ``TierMismatchError``."""
    c = registered(identity)
    if c is not None:
        return c
    cfg = CacheConfig.resolve(read_only=True)
    if not cfg.shared and not os.path.exists(cfg.layout.node_file):
        # No shared tier and no local cache here yet: nothing can match, and nothing is created to say so.
        raise TierMismatchError(f"this names cache {identity!r}, but this node has no cache at {cfg.path} and "
                                "no VIDCACHE_SHARED: set it to the shared tier that made it")
    node = node_cache()
    if node.identity == identity:
        return node
    raise TierMismatchError(
        f"this names cache {identity!r}, but this node's cache ({node!r}, identity {node.identity!r}) is "
        f"another one. Set VIDCACHE_SHARED on this node to the shared tier that made it")
