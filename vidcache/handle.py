"""``VideoHandle``: a tiny, picklable reference to one cached video.

Handles sit *above* the cache: they name an entry by the cache's cluster-wide
identity (the shared tier's id) and the entry key, never by a node-local path,
so a handle made on one node resolves on any node configured for the same
shared tier (``VIDCACHE_SHARED``).  In the process that made it, a handle is
bound to its ``VideoCache`` object; unpickled elsewhere it finds the cache
through ``vidcache.node.cache_for`` (a cache made in that process with that
identity, or the node's own), and a foreign identity is an error, never a
silent rebuild into some other directory.

Properties never build: on a miss they raise ``NotCachedError``.  ``resolve``,
``frames`` and ``train_inputs`` build on a miss unless told not to.

Handles are made by :func:`get` (pinned: built first on a miss), :func:`lazy` (nothing
happens until use) and :func:`from_key`; the cache itself knows nothing of handles.

:func:`train_inputs` and :func:`train_inputs_batch` turn handles into the trainer's tensors: they
read the frames (into pinned memory, in parallel, copying each to the device as it arrives) and
hand frames and manifests down to ``vidcache.processing``, which knows nothing of handles.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .errors import CorruptEntryError, NotCachedError
from .loader.fetch import canonical_source
from .options import VideoOptions

if TYPE_CHECKING:   # torch is imported only where frames are touched
    import torch

    from .cache import VideoCache
    from .manifest import Manifest


@dataclass(frozen=True)
class VideoHandle:
    source: str | None                          # None for handles made from a key alone
    options: VideoOptions
    identity: str                               # the cache's identity (see vidcache.identity)
    key: str | None = field(default=None, compare=False)   # memo of the resolved key

    # --- plumbing -----------------------------------------------------------
    def _bind(self, cache: "VideoCache") -> "VideoHandle":
        object.__setattr__(self, "_cache_obj", cache)      # in-process only; never pickled
        return self

    @property
    def cache(self) -> "VideoCache":
        """The ``VideoCache`` this handle reads: the one it was made with, or, unpickled in another
        process, the one this process has for its identity (``vidcache.node.cache_for``)."""
        c = self.__dict__.get("_cache_obj")
        if c is None:
            from .node import cache_for
            c = cache_for(self.identity)
            object.__setattr__(self, "_cache_obj", c)
        return c

    def resolve(self, build: bool = True) -> str:
        """The cache key; on a miss, builds the entry when ``build`` else raises ``NotCachedError``."""
        if self.key is not None:
            return self.key
        if self.source is None:
            raise NotCachedError("a handle without a source must carry its key")
        cache = self.cache
        key = cache.find(self.source, self.options)
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
        return self.cache.require_manifest(self.resolve(build=False))

    @property
    def metadata(self) -> dict:
        """Source fps, total frames, frame indices, sample fps, T, H, W, grid, tokens: from the manifest."""
        return self.manifest.metadata()

    @property
    def num_video_tokens(self) -> int:
        return self.manifest.tokens.video_pad_tokens

    # --- may build ----------------------------------------------------------------
    def frames(self, out: "torch.Tensor | None" = None) -> "torch.Tensor":
        """The cached canonical frames, uint8 ``T x 3 x H x W`` (into ``out`` if given).  A corrupt or
        lost entry is rebuilt from the source when the source is reachable; otherwise the error names
        the key."""
        cache = self.cache
        key = self.resolve()
        try:
            return cache.frames(key, out=out)
        except (CorruptEntryError, NotCachedError):
            if self.source is None:
                raise
            cache.ensure(self.source, self.options)      # the bad copy was quarantined: a miss now
            return cache.frames(key, out=out)

    def train_inputs(self, processor, mode: str | None = None, memo: bool = True,
                     device: "str | torch.device | None" = None) -> "dict[str, torch.Tensor]":
        """Model kwargs for the trainer: tensors only, on ``device`` (see :func:`train_inputs`)."""
        return train_inputs(processor, [self], mode=mode, memo=memo, device=device)

    # --- serialisation --------------------------------------------------------
    def to_dict(self) -> dict:
        d = {"source": self.source, "options": self.options.to_dict(), "identity": self.identity}
        if self.key is not None:
            d["key"] = self.key
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "VideoHandle":
        from .keys import check_key
        key = d.get("key")
        # Datasets keep handles written by vidcache 0.1, which called the identity "tier": stored data, still read.
        identity = d["identity"] if "identity" in d else d["tier"]
        return cls(d["source"], VideoOptions.from_dict(d["options"]), identity,
                   key=check_key(key) if key is not None else None)

    def __reduce__(self):
        return (_rebuild, (self.source, self.options.to_dict(), self.identity, self.key))


def _cache_or_node(cache):
    if cache is not None:
        return cache
    from .node import node_cache
    return node_cache()


def get(source: str, options: VideoOptions, cache: "VideoCache | None" = None) -> VideoHandle:
    """A pinned handle to (source, options), fetched, decoded and cached first on a miss.
    ``cache``: a ``VideoCache``; default: this node's (``VIDCACHE_DIR`` + ``VIDCACHE_SHARED``)."""
    c = _cache_or_node(cache)
    source = canonical_source(source)       # a handle outlives the current directory it was made in
    res = c.ensure(source, options)
    return VideoHandle(source, options, c.identity, key=res.key)._bind(c)


def lazy(source: str, options: VideoOptions, cache: "VideoCache | None" = None) -> VideoHandle:
    """A lazy handle: nothing is fetched or decoded until it is used."""
    c = _cache_or_node(cache)
    return VideoHandle(canonical_source(source), options, c.identity)._bind(c)


def from_key(key: str, cache: "VideoCache | None" = None) -> VideoHandle:
    """A handle to an entry known by key alone (no source: it must stay cached)."""
    from .keys import check_key
    c = _cache_or_node(cache)
    m = c.require_manifest(check_key(key))
    return VideoHandle(None, m.video_options(), c.identity, key=key)._bind(c)


# --- the trainer's tensors ------------------------------------------------------------------------------
def train_inputs(processor, handles, mode: str | None = None, memo: bool = True,
                 device: "str | torch.device | None" = None, batched: bool = True) -> "dict[str, torch.Tensor]":
    """HF processor outputs for the handles' cached frames (one sample's videos), on ``device``.

    ``mode``: the processing mode the rollout was made in (``"stock"`` or ``"plugin"``; a ``PreparedRequest``'s
    ``mode``).  Required for Qwen2.5-VL, whose ``second_per_grid_ts`` differ by mode (``processing.resolve_mode``);
    the other families' tensors are the same in both.

    Sampling and resizing are off (both were done once).  On a CUDA device the uint8 frames go there from
    pinned memory and HF's processor runs there, when shown bit-identical to the CPU for this processor
    (``vidcache.device.exact_device``; else it runs on the CPU, logged once, and the tensors are moved).
    Results are memoised per video in-process (``vidcache.processing.MEMO``, bounded per device); treat
    the returned tensors as read-only.
    """
    return train_inputs_batch(processor, [handles], mode=mode, memo=memo, device=device, batched=batched)[0]


def train_inputs_batch(processor, groups, mode: str | None = None, memo: bool = True,
                       device: "str | torch.device | None" = None, batched: bool = True,
                       workers: int = 8) -> "list[dict[str, torch.Tensor]]":
    """:func:`train_inputs` for each group of handles of one micro-batch, in one call.

    Each distinct video is read once (``n_samples_per_prompt`` copies share it) into one pinned buffer,
    each copied to the device as soon as it is read, so reads overlap copies (``workers``: threads for
    reads on the CPU path).
    ``batched``: one processor call for all the videos, else one per video; each group's tensors are
    exactly those ``train_inputs`` gives it alone (tested with ``torch.equal``).
    """
    import torch

    from .device import exact_device
    from .processing import MEMO, join_videos, process, processor_fingerprint

    from .processing import resolve_mode

    groups = [list(g) for g in groups]
    if mode is None:
        for fam in sorted({h.options.family for g in groups for h in g}):
            mode = resolve_mode(fam, None)
    fp = processor_fingerprint(processor)
    target = torch.device("cpu" if device is None else device)
    run_on = exact_device(processor, target, fp)
    if target.type == "cuda":
        target = run_on if run_on.type == "cuda" else torch.device("cuda", target.index if target.index is not None
                                                                  else torch.cuda.current_device())
    videos: dict[tuple[str, str], VideoHandle] = {}    # (cache identity, key): a memo hit never skips
    for g in groups:                                    # the check that this process has the handle's cache
        for h in g:
            videos.setdefault((h.identity, h.resolve()), h)   # builds a lazy handle's entry first, if it must
    done = {}
    if memo:
        for k in videos:
            if (hit := MEMO.get((*k, mode, fp), str(target))) is not None:
                done[k] = hit
    todo = [(k, h) for k, h in videos.items() if k not in done]
    if todo:
        manifests = [h.manifest for _, h in todo]
        frames = _read_frames([h for _, h in todo], manifests, run_on, workers)
        for (k, _), out in zip(todo, process(processor, frames, manifests, mode, batched=batched)):
            out = {n: t.to(target) for n, t in out.items()}
            done[k] = out
            if memo:   # a slice of a batched output would keep the whole batch alive: keep a compact copy
                MEMO.put((*k, mode, fp), str(target), {n: t if t.untyped_storage().nbytes() == t.nbytes
                                                      else t.clone() for n, t in out.items()})
    return [join_videos([done[h.identity, h.resolve()] for h in g]) if g else {} for g in groups]


def _read_frames(handles, manifests, device, workers: int) -> "list[torch.Tensor]":
    """Each handle's uint8 frames on ``device``.  For a CUDA device: each video is copied out of the cache's
    memory map (zero-copy view; torch's copy runs on all intra-op threads) into its slice of one pinned
    buffer, and that slice's host-to-device copy is enqueued at once, overlapping the next video's read."""
    import torch

    from .device import PINNED

    if device.type == "cpu":
        if len(handles) == 1:
            return [handles[0].frames()]
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(min(workers, len(handles))) as pool:
            return list(pool.map(lambda h: h.frames(), handles))
    sizes = [m.frames.nbytes for m in manifests]
    buf = PINNED.take(sum(sizes))
    out, off = [], 0
    try:
        for h, m, size in zip(handles, manifests, sizes):
            host = buf[off:off + size].view(*m.frames.shape)
            off += size
            _read_into(h, host)
            out.append(host.to(device, non_blocking=True))
    finally:
        PINNED.give(buf)          # reusable once the copies enqueued from it are done
    return out


def _read_into(h: VideoHandle, host: "torch.Tensor") -> None:
    """``h``'s frames into ``host``: one parallel copy out of the memory map; through ``frames`` (which
    rebuilds a corrupt or lost entry from its source) when the map cannot serve them."""
    import warnings

    import torch
    try:
        with h.cache.read_frames(h.resolve()) as view, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)     # the view is read-only; it is only read
            host.copy_(torch.from_numpy(view))
    except (CorruptEntryError, NotCachedError):
        h.frames(out=host)

def _rebuild(source, options, identity, key):
    return VideoHandle(source, VideoOptions.from_dict(options), identity, key=key)
