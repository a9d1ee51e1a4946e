"""``VideoHandle``: a tiny, picklable reference to one cached video.

It holds strings and the options record only (no environment, decoder, file
or array), so it crosses fork, Ray and JSON.  Everything is resolved lazily
in the process that uses it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from ..errors import NotCachedError
from ..options import VideoOptions

if TYPE_CHECKING:   # torch is imported only where frames are touched
    import torch


@dataclass(frozen=True)
class VideoHandle:
    source: str
    options: VideoOptions
    cache: str                                   # the cache directory
    key: str | None = field(default=None, compare=False)   # memo of the resolved key

    # --- plumbing -----------------------------------------------------------
    def _cache(self):
        from ..cache import open_cache
        return open_cache(self.cache)

    def resolve(self, build: bool = True) -> str:
        """The cache key; on a miss, builds the entry when ``build`` else raises ``NotCachedError``."""
        if self.key is not None:
            return self.key
        cache = self._cache()
        key = cache.lookup(self.source, self.options)
        if key is None:
            if not build:
                raise NotCachedError(f"{self.source!r} is not cached in {self.cache} (run `vidcache prewarm`)")
            key = cache.ensure(self.source, self.options).key
        object.__setattr__(self, "key", key)     # a memo, not part of identity
        return key

    @property
    def manifest(self) -> dict:
        return self._cache().require_manifest(self.resolve())

    # --- public -------------------------------------------------------------
    @property
    def metadata(self) -> dict:
        """Source fps (float and rational), total frames, frame indices, sample fps, T, H, W, grid, tokens."""
        m = self.manifest
        return {**m["video"], **m["tokens"], "family": self.options.family, "key": m["key"]}

    @property
    def num_video_tokens(self) -> int:
        return self.manifest["tokens"]["video_pad_tokens"]

    def frames(self) -> "torch.Tensor":
        """The cached canonical frames, uint8 ``T x 3 x H x W``."""
        return self._cache().frames(self.resolve())

    def train_inputs(self, processor, mode: str = "plugin", memo: bool = True) -> "dict[str, torch.Tensor]":
        """Model kwargs for the trainer: tensors only."""
        from ..processing import train_inputs
        return train_inputs(processor, [self], mode=mode, memo=memo)

    def frozen_path(self, fmt: str | None = None) -> str:
        return self._cache().frozen_path(self.resolve(), fmt)

    def frozen_uri(self, fmt: str | None = None) -> str:
        """``file://`` URI of the lossless frozen file (``fmt``: "ffv1" or "utvideo"), percent-encoded
        because SGLang mishandles ``#``, ``?`` and ``%`` in plain paths."""
        return "file://" + quote(self.frozen_path(fmt))

    # --- serialisation --------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"source": self.source, "options": self.options.to_dict(), "cache": self.cache}
        if self.key is not None:
            d["key"] = self.key
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "VideoHandle":
        return cls(d["source"], VideoOptions.from_dict(d["options"]), d["cache"], key=d.get("key"))

    def __reduce__(self):
        return (_rebuild, (self.source, self.options.to_dict(), self.cache, self.key))


def _rebuild(source, options, cache, key):
    return VideoHandle(source, VideoOptions.from_dict(options), cache, key=key)
