"""``VideoHandle``: a tiny, picklable reference to one cached video.

Handles sit *above* the cache: they name an entry by the cache's cluster-wide
identity (the shared tier's id) and the entry key, never by a node-local path,
so a handle made on one node resolves on any node configured for the same
shared tier (``VIDCACHE_SHARED``).  In the process that made it, a handle is
bound to its ``VideoCache`` object; unpickled elsewhere it finds the cache
through ``vidcache.cache.cache_for`` (a cache made in that process with that
identity, or the node's own), and a foreign identity is an error, never a
silent rebuild into some other directory.

Properties never build: on a miss they raise ``NotCachedError``.  ``resolve``,
``frames`` and ``train_inputs`` build on a miss unless told not to.

Handles are made by :func:`get` (pinned: built first on a miss), :func:`lazy` (nothing
happens until use) and :func:`from_key`; the cache itself knows nothing of handles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import CorruptEntryError, NotCachedError
from .options import VideoOptions

if TYPE_CHECKING:   # torch is imported only where frames are touched
    import torch

    from .cache import VideoCache
    from .manifest import Manifest


@dataclass(frozen=True)
class VideoHandle:
    source: str | None                          # None for handles made from a key alone
    options: VideoOptions
    tier: str                                   # the cache's identity (see vidcache.config)
    key: str | None = field(default=None, compare=False)   # memo of the resolved key

    # --- plumbing -----------------------------------------------------------
    def _bind(self, cache: "VideoCache") -> "VideoHandle":
        object.__setattr__(self, "_cache_obj", cache)      # in-process only; never pickled
        return self

    def _cache(self) -> "VideoCache":
        c = self.__dict__.get("_cache_obj")
        if c is None:
            from .cache import cache_for
            c = cache_for(self.tier)
            object.__setattr__(self, "_cache_obj", c)
        return c

    def resolve(self, build: bool = True) -> str:
        """The cache key; on a miss, builds the entry when ``build`` else raises ``NotCachedError``."""
        if self.key is not None:
            return self.key
        if self.source is None:
            raise NotCachedError("a handle without a source must carry its key")
        cache = self._cache()
        key = cache.lookup(self.source, self.options)
        if key is None:
            if not build:
                raise NotCachedError(f"{self.source!r} is not cached in {cache!r} (run `vidcache prewarm`)")
            key = cache.ensure(self.source, self.options).key
        object.__setattr__(self, "key", key)     # a memo, not part of identity
        return key

    def pinned(self) -> "VideoHandle":
        """This handle with its key resolved (building on a miss): what to send to another node,
        which may not see the source."""
        self.resolve()
        return self

    # --- no building ------------------------------------------------------------
    @property
    def manifest(self) -> "Manifest":
        return self._cache().require_manifest(self.resolve(build=False))

    @property
    def metadata(self) -> dict:
        """Source fps, total frames, frame indices, sample fps, T, H, W, grid, tokens: from the manifest."""
        return self.manifest.metadata()

    @property
    def num_video_tokens(self) -> int:
        return self.manifest.tokens.video_pad_tokens

    # --- may build ----------------------------------------------------------------
    def frames(self) -> "torch.Tensor":
        """The cached canonical frames, uint8 ``T x 3 x H x W``.  A corrupt or lost entry is rebuilt
        from the source when the source is reachable; otherwise the error names the key."""
        cache = self._cache()
        key = self.resolve()
        try:
            return cache.frames(key)
        except (CorruptEntryError, NotCachedError):
            if self.source is None:
                raise
            cache.ensure(self.source, self.options)      # the bad copy was quarantined: a miss now
            return cache.frames(key)

    def train_inputs(self, processor, mode: str = "plugin", memo: bool = True) -> "dict[str, torch.Tensor]":
        """Model kwargs for the trainer: tensors only."""
        from .processing import train_inputs
        return train_inputs(processor, [self], mode=mode, memo=memo)

    # --- serialisation --------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"source": self.source, "options": self.options.to_dict(), "tier": self.tier}
        if self.key is not None:
            d["key"] = self.key
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "VideoHandle":
        from .keys import check_key
        key = d.get("key")
        return cls(d["source"], VideoOptions.from_dict(d["options"]), d["tier"],
                   key=check_key(key) if key is not None else None)

    def __reduce__(self):
        return (_rebuild, (self.source, self.options.to_dict(), self.tier, self.key))


def _cache_or_node(cache):
    if cache is not None:
        return cache
    from .cache import node_cache
    return node_cache()


def get(source: str, options: VideoOptions, cache: "VideoCache | None" = None) -> VideoHandle:
    """A pinned handle to (source, options), fetched, decoded and cached first on a miss.
    ``cache``: a ``VideoCache``; default: this node's (``VIDCACHE_DIR`` + ``VIDCACHE_SHARED``)."""
    c = _cache_or_node(cache)
    res = c.ensure(source, options)
    return VideoHandle(source, options, c.identity, key=res.key)._bind(c)


def lazy(source: str, options: VideoOptions, cache: "VideoCache | None" = None) -> VideoHandle:
    """A lazy handle: nothing is fetched or decoded until it is used."""
    c = _cache_or_node(cache)
    return VideoHandle(source, options, c.identity)._bind(c)


def from_key(key: str, cache: "VideoCache | None" = None) -> VideoHandle:
    """A handle to an entry known by key alone (no source: it must stay cached)."""
    from .keys import check_key
    c = _cache_or_node(cache)
    m = c.require_manifest(check_key(key))
    return VideoHandle(None, m.video_options(), c.identity, key=key)._bind(c)


def _rebuild(source, options, tier, key):
    return VideoHandle(source, VideoOptions.from_dict(options), tier, key=key)
