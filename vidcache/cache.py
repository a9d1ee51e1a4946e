"""``VideoCache``: a node's cache.  It resolves (source, options) to cached canonical frames, building on a
miss, and keeps its house (evict, gc, listing, stats).  Its read path (``reads``: the checks, the memos, the one
quarantine-and-retry rule) and its policies are objects of their own, handed the parts they need: the shared
tier's compact layout (``compact``), the frozen-file records (``frozen_copies``), verify and repair (``repair``).
The open caches of a process are ``node``'s.
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import catalog, keys
from .compact import CompactLayout, as_tensor
from .config import CacheConfig
from .digest import Digest
from .errors import ConfigError, CorruptEntryError, SharedUnavailableError, StoreError, VidcacheError, warn_once
from .frozen_copies import FrozenCopies
from .identity import resolve_identity
from .integrity import blob_matches
from .loader.fetch import canonical_source, fetch, fingerprint
from .loader.tmpdirs import run_tmp_dir
from .manifest import Manifest, SourceRecord, blob_of, blob_users, build_manifest
from .options import VideoOptions
from .reads import ReadPath
from .repair import Repair
from .store.backfill import Backfill
from .store.base import Store

if TYPE_CHECKING:
    import torch

# torch (and the decoders, via loader.build / loader.resize) are imported where frames are built or
# copied out, not here: commands that only read manifests (stats, ls, verify, inspect, sglang-config,
# evict, gc, doctor) then start in a fraction of torch's import time.

@dataclass(frozen=True)
class EnsureResult:
    key: str
    status: str          # "hit", "new", or "published" (a local hit the shared tier lacked, now published)
    frame_bytes: int


def _read_path(name: str):
    """``VideoCache.<name>``: its read path's method of that name (docstring and signature included)."""
    method = getattr(ReadPath, name)
    return functools.wraps(method)(lambda self, *args, **kwargs: method(self.reads, *args, **kwargs))


class VideoCache:
    """A node's cache: LMDB (``path``), optionally in front of the cluster's shared tier (``shared``)."""

    def __init__(self, path=None, *, shared: str | None = None, config: CacheConfig | None = None,
                 **settings) -> None:
        """``path``: the node-local directory (default ``$VIDCACHE_DIR``).  ``shared``: the shared tier's
        URL (default ``$VIDCACHE_SHARED``).  ``settings``: the other fields of :class:`CacheConfig`."""
        self.config = config if config is not None else CacheConfig.resolve(path, shared, **settings)
        # Every pull is checked by the read path, which is built on this store (hence bound late, at the call).
        self.store: Store = self.config.build_store(check=lambda key, value: self.reads.check_pulled(key, value))
        self._identity: str | None = None
        # The shared tier's failure when the identity was read and the remembered one served instead.
        self.shared_unreachable: SharedUnavailableError | None = None
        # Local copies of expanded compact objects commit behind the read that expanded them; a full disk
        # costs only the copy, by the tiers' own rule (TieredStore.local_copy_failed).
        self._backfill = Backfill(self.local, self.store.local_copy_failed)
        self.frozen = FrozenCopies(self.layout, self.local, self.shared, self.read_only)
        self.compact = CompactLayout(self.shared, self.local, frozen=self.frozen, backfill=self._backfill,
                                     tmp_dir=self.tmp_dir,
                                     writes=not self.read_only and self.config.shared_layout == "compact")
        self.reads = ReadPath(self.store, self.config, compact=self.compact,
                              backfill=self._backfill, name=repr(self))
        self._repair = Repair(self.reads.tiers, self.compact, self.frozen, reads=self.reads, rebuild=self._rebuild,
                              read_only=self.read_only)
        if self.config.store is None and not self.read_only:
            # Named before anything is written: a local cache once, at creation; a new shared tier by the
            # first writer that opens it (race-safe, identity.shared_identity), so no object ever sits in a
            # tier without its identity.
            self.identity

    @classmethod
    def from_config(cls, config: CacheConfig) -> "VideoCache":
        return cls(config=config)

    def __reduce__(self):
        # Workers rebuild the cache from its whole configuration: custom stores and settings included.
        return (VideoCache.from_config, (self.config,))

    # --- configuration (read-only views) ------------------------------------------
    path = property(lambda self: self.config.path)
    read_only = property(lambda self: self.config.read_only)
    layout = property(lambda self: self.config.layout)        # where the node directory keeps what
    tmp_dir = property(lambda self: self.config.layout.tmp_dir)

    @property
    def local(self) -> Store:
        return self.store.tiers()[0]

    @property
    def shared(self) -> Store | None:
        return self.store.tiers()[1]

    @property
    def identity(self) -> str:
        """The cluster-wide name of this cache: the shared tier's id, or a node-local id without one
        (``identity.resolve_identity``; ``shared_unreachable`` says when the remembered one stood in)."""
        if self._identity is None:
            self._identity, self.shared_unreachable = resolve_identity(self.config, self.shared, repr(self))
            _register(self)
        return self._identity

    def with_settings(self, **changes) -> "VideoCache":
        return VideoCache(config=self.config.replace(**changes))

    def __repr__(self) -> str:
        shared = f", shared={self.config.shared!r}" if self.config.shared else ""
        return f"VideoCache({self.path!r}{shared})"

    def close(self) -> None:
        self.reads.settle()
        self._backfill.close()
        self.store.close()
        _unregister(self)           # a closed cache is never found by identity again (nor kept alive by the registry)

    def sync(self) -> None:
        """A durability checkpoint for the local tier (LMDB runs with sync=False), after every local copy this
        process has in flight."""
        self.reads.settle()
        self.local.sync()

    # --- lookup -------------------------------------------------------------
    def _recorded_digest(self, source: str, fp: dict | None) -> Digest | None:
        """The digest recorded for ``source`` (canonical: ``canonical_source``) if its validators still match."""
        if fp is None:
            return None
        for spelling in (source, "file://" + source) if source.startswith("/") else (source,):
            # Caches written before sources were canonical hold a dataset's ``file:///abs`` spelling: found too.
            raw = self.store.get(keys.src(spelling))
            if raw is not None:
                rec = SourceRecord.from_json(raw)      # damaged: a miss, hashed again
                return rec.digest if rec is not None and rec.matches(spelling, fp) else None
        return None

    def find(self, source: str, options: VideoOptions | None = None, *, sound: bool = False) -> str | None:
        """The key of the entry cached for ``(source, options)``, found without fetching (one stat or HEAD
        for the source's validators); None when the source is unknown or the entry absent.  ``sound``: its
        blob must pass its checks too (a corrupt copy is quarantined and reported absent)."""
        source = canonical_source(source)
        d = self._recorded_digest(source, fingerprint(source, self.config.limits))
        if d is None:
            return None
        key = keys.cache_key(d, options or VideoOptions())
        if sound:
            return key if self.sound_manifest(key) is not None else None
        return key if self.contains([key])[0] else None

    def contains(self, cache_keys: list[str]) -> list[bool]:
        return self.store.exists_many([keys.ac(k) for k in cache_keys])

    # --- build --------------------------------------------------------------
    def ensure(self, source: str, options: VideoOptions) -> EnsureResult:
        """Make sure (source, options) is cached and sound; fetch, decode and write it on a miss."""
        source = canonical_source(source)     # one file, one record, however it is spelled
        fp = fingerprint(source, self.config.limits)      # one stat / HEAD, reused for the record below
        d = self._recorded_digest(source, fp)
        if d is not None:
            key = keys.cache_key(d, options)
            if (m := self.sound_manifest(key)) is not None:
                return self._hit(key, m, {keys.src(source): SourceRecord.of(source, fp, d).to_json()})
        from .loader.build import decode_sample_resize
        fetched = fetch(source, self.config.limits, tmp_dir=run_tmp_dir(self.tmp_dir))
        try:
            key = keys.cache_key(fetched.digest, options)
            record = {}
            if fp is not None:
                record[keys.src(source)] = SourceRecord.of(source, fp, fetched.digest).to_json()
            if (m := self.sound_manifest(key)) is not None:
                if record:
                    self.store.set_many(record)
                return self._hit(key, m, {})
            budget = {} if self.config.max_decoded_bytes is None else {
                "max_decoded_bytes": self.config.max_decoded_bytes}
            frames, built = decode_sample_resize(fetched.path, options, self.config.decoder,
                                                 decoder_threads=self.config.decoder_threads, **budget)
            fetched.check_unchanged()           # decoded what was hashed, or nothing is cached (D35)
        finally:
            fetched.cleanup()
        raw = memoryview(frames.numpy()).cast("B")     # no second copy of the frames (peak memory)
        blob = Digest.of(raw)
        man = build_manifest(key, fetched.digest, options, blob, tuple(frames.shape), self.config.encoding, built,
                             {"created_unix": round(time.time(), 3)})
        # Blob first, manifest last: one transaction locally; on the shared tier the manifest is
        # published only after its frames (compact or raw), so no reader sees a manifest without them.
        items = {keys.cas(str(blob)): man.frames.encode(raw), keys.ac(key): man.to_json(), **record}
        if self.shared is not None and not self.read_only and self.shared.exists_many([keys.ac(key)])[0]:
            # Another node built this entry while this one decoded it (D31).  Harmless -- the key is the content,
            # and the frames are checked wherever they are read -- but the decode was wasted: say how to avoid it.
            warn_once("duplicate_build", "vidcache: entry %s was built by another node at the same time as this "
                      "one (the same frames; this decode was wasted). To build each video once, run one "
                      "`vidcache prewarm --ray` for the cluster, or give each node its own rows.", key)
        if self.compact.publish(key, frames, man):
            self.shared.set_many({k: v for k, v in items.items() if not k.startswith(keys.CAS)})
            self.local.set_many(items)
        else:
            self.store.set_many(items)
        self.reads.verified(str(blob))
        return EnsureResult(key, "new", raw.nbytes)

    def _hit(self, key: str, m: Manifest, record: dict) -> EnsureResult:
        status = "published" if self._publish_missing(key, m, record) else "hit"
        return EnsureResult(key, status, m.frames.nbytes)

    def _publish_missing(self, key: str, m: Manifest | None = None, record: dict | None = None) -> bool:
        """Publish a local entry that the configured shared tier lacks (a node that cached it before the
        tier was configured, or under another one); True if it did.  Blob first, manifest last; a local
        copy that is not sound is never published."""
        sh = self.shared
        if sh is None or self.read_only or sh.exists_many([keys.ac(key)])[0]:
            return False
        m = m or self.require_manifest(key)
        blob_key = keys.cas(m.frames.blob)
        items = {}
        if not self.compact.holds(key, m.frames.blob):
            value = self.local.get(blob_key)
            if value is None or not blob_matches(m.frames.blob, value):
                raise CorruptEntryError(f"entry {key}: its local blob is missing or unsound; not published "
                                        "(`vidcache verify --repair`)")
            # the bytes just checked, not a re-read
            if not self.compact.publish(key, as_tensor(m.frames.decode(value), m), m):
                items[blob_key] = value
        raw = self.local.get(keys.ac(key))
        if raw is None:
            return False
        sh.set_many({**items, **(record or {}), keys.ac(key): raw})
        return True

    # --- read: the read path's own methods (vidcache.reads: the checks, the one quarantine-and-retry rule) ---
    manifest, require_manifest, sound_manifest, read_frames, frames, bring_local = map(_read_path, (
        "manifest", "require_manifest", "sound_manifest", "read_frames", "frames", "bring_local"))

    # --- verify and repair (vidcache.repair), the compact layout's conversion -----------------
    def verify(self, key: str, repair: bool = False) -> list[str]:
        """Check ``key`` in every tier, its frozen files included; the problems found (empty: sound).
        ``repair`` quarantines bad copies, restores them from a sound copy in another tier, or rebuilds the
        entry from its source (bad frozen files are quarantined here and remade by the serving layer)."""
        self.reads.settle()
        return self._repair.verify(key, repair)

    def _rebuild(self, key: str, options: VideoOptions) -> bool:
        """The repair's last resort: build ``key`` again from a source recorded for its content."""
        for src in catalog.sources_by_digest(self.store).get(str(keys.source_digest_of(key)), []):
            with contextlib.suppress(VidcacheError):    # an unreachable source: try the next one
                if self.ensure(src, options).key == key:
                    return True
        return False

    def upgrade_shared(self, entry_keys: list[str], stop=lambda: False) -> dict:
        """Convert entries an older vidcache wrote to the shared tier as raw frames into compact objects
        (``CompactLayout.upgrade``).  Only on request (``vidcache verify --shared --upgrade``)."""
        self.reads.settle()
        if self.shared is None or self.read_only:
            raise ConfigError(f"{self!r}: upgrading needs a writable shared tier")
        return self.compact.upgrade(entry_keys, self.manifest, stop)

    # --- eviction, listing, stats ------------------------------------------------------
    def evict(self, key: str, shared: bool = False) -> bool:
        """Drop an entry from this node: its manifest, its blob unless another entry shares it, and its
        frozen files.  ``shared=True`` drops it from the cluster's shared tier as well, so every node loses
        it (the CLI asks first).  True if anything was removed."""
        self.reads.settle()
        keys.check_key(key)
        if shared and self.shared is None:
            raise ConfigError(f"{self!r} has no shared tier to evict from")
        removed = False
        for tier in [self.local] + ([self.shared] if shared else []):
            doomed = [keys.ac(key)]
            blob = blob_of(tier.get(keys.ac(key)))
            if blob is not None and all(u == key for u in blob_users(tier).get(blob, [])):
                doomed.append(keys.cas(blob))
            doomed += [*tier.keys(keys.FROZEN + key), *tier.keys(keys.FROZEN_DIGEST + key)]
            for k in doomed:
                if tier.exists_many([k])[0]:
                    tier.delete(k)
                    removed = True
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.frozen.dir):
                if name.startswith(key):
                    os.unlink(os.path.join(self.frozen.dir, name))
                    removed = True
        self.reads.forget(key)
        return removed

    def gc(self, max_local_bytes: int | None = None) -> dict:
        """Evict least-recently-used local entries down to the budget; the shared tier is never touched.
        Without a shared tier, manifests whose blob went are dropped too (no entry is left half there)."""
        self.reads.settle()
        budget = max_local_bytes if max_local_bytes is not None else self.config.max_local_bytes
        if budget is None:
            raise ValueError("no budget: pass max_local_bytes or configure the cache with one")
        before = sum(1 for _ in self.local.keys(keys.AC))
        out = self.local.gc(budget)
        if self.shared is None and out.get("evicted"):
            for k in self.local.keys(keys.AC):       # paged: deleting the key in hand is safe
                blob = blob_of(self.local.get(k))
                if blob is None or not self.local.exists_many([keys.cas(blob)])[0]:
                    self.local.delete(k)
            self.reads.forget()
        out["entries_evicted"] = before - sum(1 for _ in self.local.keys(keys.AC))
        return out

    def entries(self) -> list[str]:
        self.reads.settle()
        out = []
        for k in self.store.keys(keys.AC):
            with contextlib.suppress(StoreError):
                out.append(keys.entry_key(k))
        return out

    def listing(self) -> list[dict]:
        """One record per entry: sources, family, T x H x W, fps, tokens, bytes, tiers (``catalog.listing``)."""
        self.reads.settle()
        return catalog.listing(self)

    def options_cached_for(self, source: str) -> list[dict]:
        """The options under which ``source`` is cached (by its recorded digest), for a helpful miss."""
        source = canonical_source(source)
        d = self._recorded_digest(source, fingerprint(source, self.config.limits))
        return [] if d is None else catalog.options_under(self, d)

    def stats(self) -> dict:
        """The counts of the cache and of each tier (``catalog.stats``)."""
        self.reads.settle()
        return catalog.stats(self)


# --- the caches of this process, by identity (vidcache.node looks them up) --------------------
_REGISTRY: dict[str, VideoCache] = {}


def _register(cache: VideoCache) -> None:
    if cache._identity is not None:
        _REGISTRY[cache._identity] = cache


def _unregister(cache: VideoCache) -> None:
    if cache._identity is not None and _REGISTRY.get(cache._identity) is cache:
        del _REGISTRY[cache._identity]


def registered(identity: str) -> VideoCache | None:
    """The cache of this process whose identity was read as ``identity``, if any."""
    return _REGISTRY.get(identity)
