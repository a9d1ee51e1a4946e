"""``VideoCache``: a node's cache.  It resolves (source, options) to cached canonical frames, building on a
miss, reads them back, and keeps its house (evict, gc, listing, stats).

Its policies are objects of their own, handed the parts they need: the shared tier's compact layout
(``compact``), the frozen-file records (``frozen_copies``), verify and repair (``repair``).  The open caches of
a process are ``node``'s.

Integrity (the checks themselves live in ``vidcache.integrity``): every blob digest
is checked on its first read in a process (or on every read, or never:
``verify_reads``), every pull from the shared tier is checked before it is served
or backfilled, every manifest is sealed and checked against its options and its
blob's size.  A corrupt object is never served: it is moved aside
(``quarantine/``), and the entry becomes a miss that the next ``ensure`` (or
``verify --repair``) rebuilds.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import catalog, keys
from .compact import UNFETCHED, CompactLayout, as_tensor
from .config import CacheConfig
from .digest import Digest
from .errors import (ConfigError, CorruptEntryError, CorruptManifestError, DigestMismatchError, NotCachedError,
                     SharedUnavailableError, StoreError, VidcacheError, warn_once)
from .frozen_copies import FrozenCopies
from .identity import resolve_identity
from .integrity import blob_matches, check_object, checked_frames, quarantine
from .loader.fetch import fetch, fingerprint
from .loader.tmpdirs import run_tmp_dir
from .manifest import Manifest, SourceRecord, blob_of, build_manifest
from .options import VideoOptions
from .repair import Repair
from .store.backfill import Backfill
from .store.base import Store
from .store.single_flight import SingleFlight

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


class VideoCache:
    """A node's cache: LMDB (``path``), optionally in front of the cluster's shared tier (``shared``)."""

    def __init__(self, path=None, *, shared: str | None = None, config: CacheConfig | None = None,
                 **settings) -> None:
        """``path``: the node-local directory (default ``$VIDCACHE_DIR``).  ``shared``: the shared tier's
        URL (default ``$VIDCACHE_SHARED``).  ``settings``: the other fields of :class:`CacheConfig`."""
        self.config = config if config is not None else CacheConfig.resolve(path, shared, **settings)
        self._manifests: dict[str, Manifest] = {}
        self._verified: set[str] = set()        # blob digests checked in this process
        self._found_corrupt: dict[str, DigestMismatchError] = {}    # blob digest -> why a copy was quarantined
        self.store: Store = self.config.build_store(check=self._check_pulled)
        self._identity: str | None = None
        # The shared tier's failure when the identity was read and the remembered one served instead.
        self.shared_unreachable: SharedUnavailableError | None = None
        self._lock = threading.Lock()
        # Local copies of expanded compact objects commit behind the read that expanded them; a full disk
        # costs only the copy, by the tiers' own rule (TieredStore.local_copy_failed).
        self._backfill = Backfill(self.local, self.store.local_copy_failed)
        self._pulls = SingleFlight(self.layout.locks_dir)    # one pull of an entry per node (read_ahead)
        self.frozen = FrozenCopies(self.layout, self.local, self.shared, self.read_only)
        self.compact = CompactLayout(self.shared, self.local, frozen=self.frozen, backfill=self._backfill,
                                     verified=self._verified, tmp_dir=self.tmp_dir,
                                     writes=not self.read_only and self.config.shared_layout == "compact")
        self._repair = Repair(self._tiers(), self.compact, self.frozen, quarantine=self._quarantine_bad,
                              forget=lambda key: self._manifests.pop(key, None), rebuild=self._rebuild,
                              read_only=self.read_only)
        if self.config.store is None and not self.read_only:
            # Named before anything is written: a local cache once, at creation; a new shared tier by the
            # first writer that opens it (race-safe, identity.shared_identity), so no object ever sits in a
            # tier without its identity.
            self.identity

    def _check_pulled(self, key: str, value) -> None:
        """Check bytes pulled from the shared tier; a blob that passes counts as verified in this process."""
        check_object(key, value)
        if key.startswith(keys.CAS):
            self._verified.add(key[len(keys.CAS):])

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
        self.compact.republish.drain()      # a replacement queued by a read (D42) before the stores close
        self._backfill.close()
        self.store.close()

    def sync(self) -> None:
        """A durability checkpoint for the local tier (LMDB runs with sync=False), after every local copy this
        process has in flight."""
        self.compact.republish.drain()
        self._backfill.drain()
        self.local.sync()

    # --- lookup -------------------------------------------------------------
    def _recorded_digest(self, source: str, fp: dict | None) -> Digest | None:
        if fp is None:
            return None
        raw = self.store.get(keys.src(source))
        rec = None if raw is None else SourceRecord.from_json(raw)    # damaged: a miss, hashed again
        return rec.digest if rec is not None and rec.matches(source, fp) else None

    def find(self, source: str, options: VideoOptions | None = None, *, sound: bool = False) -> str | None:
        """The key of the entry cached for ``(source, options)``, found without fetching (one stat or HEAD
        for the source's validators); None when the source is unknown or the entry absent.  ``sound``: its
        blob must pass its checks too (a corrupt copy is quarantined and reported absent)."""
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
        self._verified.add(str(blob))
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

    def sound_manifest(self, key: str) -> Manifest | None:
        """The manifest of a present entry whose blob passes its checks; None (after quarantine) otherwise."""
        try:
            m = self.manifest(key)
            if m is None:
                return None
            blob_key = keys.cas(m.frames.blob)
            if self.shared is not None and not self.local.exists_many([blob_key])[0]:
                # Only in the shared tier: present is enough here (every pull is checked), and a resume on
                # a fresh node must not download the whole tier to count its hits.
                return m if self.compact.holds(key, m.frames.blob) else None
            with self._blob(m):
                pass
            return m
        except (CorruptEntryError, NotCachedError):
            return None

    # --- read ---------------------------------------------------------------
    def manifest(self, key: str) -> Manifest | None:
        """The checked manifest of ``key``, or None when absent (or found corrupt and quarantined)."""
        keys.check_key(key)
        m = self._manifests.get(key)          # immutable under a key, so safe to keep
        if m is not None:
            return m
        for attempt in range(2):
            raw = self.store.get(keys.ac(key))
            if raw is None:
                return None
            try:
                m = Manifest.from_json(raw, key)
                break
            except CorruptManifestError:
                self._quarantine_bad(keys.ac(key))
                if attempt:
                    return None
        with self._lock:
            if len(self._manifests) > 4096:
                self._manifests.clear()
            self._manifests[key] = m
        return m

    def require_manifest(self, key: str) -> Manifest:
        m = self.manifest(key)
        if m is None:
            raise NotCachedError(f"no entry {key} in {self!r}")
        return m

    def _manifest_for_read(self, key: str) -> tuple[Manifest, object]:
        """``key``'s manifest for a read of its frames, and its compact object when this node has neither
        (else ``UNFETCHED``): the two are fetched side by side, so a first read waits for one round trip to
        the shared tier, not two in a row.  Only reads do this: a resume check must not pull frames (and a
        read that has no compact object started here starts one in ``CompactLayout.expand``)."""
        keys.check_key(key)
        if (self.shared is None or self.config.shared_layout != "compact" or key in self._manifests
                or self.local.exists_many([keys.ac(key)])[0]):
            return self.require_manifest(key), UNFETCHED
        if self._waited_for_pull(key):       # another thread or process of this node brought it meanwhile
            return self.require_manifest(key), UNFETCHED
        compact = self.compact.prefetch(key)   # decoded as it arrives (store/prefetch)
        return self.require_manifest(key), compact

    def _waited_for_pull(self, key: str) -> bool:
        """Wait while this node pulls ``key`` elsewhere (``bring_local``), so a read does not pull it again;
        True if it waited.  Bounded: a stuck puller is outwaited, then the read pulls by itself."""
        return not self.local.read_only and self._pulls.wait(key, self._pull_wait_s)

    @property
    def _pull_wait_s(self) -> float:
        # a pull is one bounded transfer of the object plus its decode and local commit
        return 2 * ((self.shared.timeout_s if self.shared is not None else None) or 60.0)

    def bring_local(self, key: str) -> bool:
        """Make this node's local tier hold entry ``key``, manifest and frames, committed: pulled from the
        shared tier if it must be, checked as every pull is (a corrupt copy is quarantined and raised, never
        kept).  True if it pulled.  One pull per key per node: a pull of ``key`` under way in another thread
        or process of this node is waited for, then found local (``store/single_flight``)."""
        if self.shared is None or self.local.read_only:
            return False
        with self._pulls.hold(key, self._pull_wait_s):
            m = self.require_manifest(key)           # a pulled manifest is kept locally by the tiers
            blob_key = keys.cas(m.frames.blob)
            self._backfill.wait(blob_key)
            if self.local.exists_many([blob_key])[0]:
                return False
            with self._blob(m, pulling=True):
                pass
            self._backfill.wait(blob_key)            # committed before the lock goes: other processes read it
        return True

    @contextlib.contextmanager
    def _blob(self, m: Manifest, verify: bool | None = None, compact=UNFETCHED, pulling: bool = False):
        """The frame bytes of ``m``, checked for presence and size, and for their digest when due.
        ``compact``: the shared tier's compact object, when ``_manifest_for_read`` fetched it already.
        ``pulling``: the caller holds the entry's pull lock (``bring_local``): no waiting for it."""
        fr = m.frames
        blob_key = keys.cas(fr.blob)
        if verify is None:
            verify = self.config.verify_reads == "always" or (
                self.config.verify_reads == "first" and fr.blob not in self._verified)
        why = None
        for attempt in range(2):
            with contextlib.ExitStack() as stack:
                try:   # every pull from the shared tier is checked before it is served: it may raise too
                    view = src = None
                    if self.shared is not None:    # local, then the compact object, then raw frames
                        self._backfill.wait(blob_key)      # this process's copy, if its commit is under way
                        view = stack.enter_context(self.local.read(blob_key))
                        if (view is None and attempt == 0 and compact is UNFETCHED and not pulling
                                and self._waited_for_pull(m.key)):
                            view = stack.enter_context(self.local.read(blob_key))   # what that pull brought
                        # The object fetched beforehand serves the first attempt only: after a quarantine,
                        # what the tier holds now.
                        if view is None and (expanded := self.compact.expand(
                                m, compact if attempt == 0 else UNFETCHED)) is not None:
                            src = expanded       # an array of its own, decoded and digest-checked already
                    if src is None:
                        if view is None:
                            view = stack.enter_context(self.store.read(blob_key))
                        if view is None:
                            if why is not None:    # every copy was corrupt and is now quarantined
                                raise why
                            earlier = self._found_corrupt.get(fr.blob)   # why a read here quarantined it
                            raise NotCachedError(f"entry {m.key}: its blob {fr.blob} is not in {self!r}" + (
                                f" (this process quarantined a corrupt copy: {earlier})" if earlier else ""))
                        src = checked_frames(m, view, verify)
                        if verify:
                            self._verified.add(m.frames.blob)
                except DigestMismatchError as e:
                    why = e if m.key in str(e) else DigestMismatchError(f"entry {m.key}: {e}")
                else:
                    yield src
                    return
            # Corrupt: never served.  Move the bad copies aside, then try once more (a sound shared copy).
            self._quarantine_bad(blob_key)
            with self._lock:        # so that a later read's miss (after read-ahead met it, say) names the cause
                if len(self._found_corrupt) > 4096:
                    self._found_corrupt.clear()
                self._found_corrupt[fr.blob] = why
            if attempt:
                raise why

    @contextlib.contextmanager
    def read_frames(self, key: str):
        """Zero-copy: a read-only uint8 TCHW numpy view into the memory map, valid inside the block."""
        import numpy as np          # here, not at import: the CLI's manifest commands never need it
        m, compact = self._manifest_for_read(key)
        with self._blob(m, compact=compact) as src:
            view = np.frombuffer(src, dtype=np.uint8).reshape(m.frames.shape)
            view.flags.writeable = False      # an expanded compact object is an array of ours: read-only all the same
            yield view

    def frames(self, key: str, manifest: Manifest | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The cached uint8 TCHW frames: one copy out of the memory map (into ``out`` if given), or none
        when they were just expanded from the shared tier's compact object."""
        import numpy as np
        import torch
        m, compact = (manifest, UNFETCHED) if manifest is not None else self._manifest_for_read(key)
        shape = list(m.frames.shape)
        if out is not None and (out.dtype != torch.uint8 or list(out.shape) != shape or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous uint8 tensor of shape {shape}")
        with self._blob(m, compact=compact) as src:
            if out is None:
                if isinstance(src, np.ndarray):
                    # Just expanded from the shared tier's compact object: a buffer of our own, so it is
                    # the tensor (the copy out was 6% of a first read).
                    return torch.from_numpy(src).reshape(shape)
                out = torch.empty(shape, dtype=torch.uint8)
            np.copyto(out.numpy().reshape(-1), np.frombuffer(src, dtype=np.uint8))   # the one copy
        return out

    # --- integrity ------------------------------------------------------------
    def _tiers(self) -> list[tuple[str, Store]]:
        return [("local", self.local)] + ([("shared", self.shared)] if self.shared is not None else [])

    def _quarantine_bad(self, store_key: str) -> None:
        """Move every copy of ``store_key`` that fails its check aside (``quarantine/``); keep sound ones."""
        if self.read_only:
            return
        quarantine([tier for _, tier in self._tiers()], store_key)
        if store_key.startswith(keys.AC):
            self._manifests.pop(store_key[len(keys.AC):], None)

    # --- verify and repair (vidcache.repair), the compact layout's conversion -----------------
    def verify(self, key: str, repair: bool = False) -> list[str]:
        """Check ``key`` in every tier, its frozen files included; the problems found (empty: sound).
        ``repair`` quarantines bad copies, restores them from a sound copy in another tier, or rebuilds the
        entry from its source (bad frozen files are quarantined here and remade by the serving layer)."""
        self.compact.republish.drain()   # a replacement a read of this process queued is in the tier
        self._backfill.drain()       # what this process wrote is in the local tier
        return self._repair.verify(key, repair)

    def _rebuild(self, key: str, options: VideoOptions) -> bool:
        """The repair's last resort: build ``key`` again from a source recorded for its content."""
        for src in self._sources_by_digest().get(str(keys.source_digest_of(key)), []):
            with contextlib.suppress(VidcacheError):    # an unreachable source: try the next one
                if self.ensure(src, options).key == key:
                    return True
        return False

    def upgrade_shared(self, entry_keys: list[str], stop=lambda: False) -> dict:
        """Convert entries an older vidcache wrote to the shared tier as raw frames into compact objects
        (``CompactLayout.upgrade``).  Only on request (``vidcache verify --shared --upgrade``)."""
        self._backfill.drain()       # what this process wrote is in the local tier
        if self.shared is None or self.read_only:
            raise ConfigError(f"{self!r}: upgrading needs a writable shared tier")
        return self.compact.upgrade(entry_keys, self.manifest, stop)

    # --- eviction, listing, stats ------------------------------------------------------
    def _blobs_in_use(self, tier: Store, but: str) -> set[str]:
        """Blobs that manifests in ``tier`` other than entry ``but`` reference (the same frames under
        other options share one blob: deleting it would break those entries too)."""
        used = set()
        for k in tier.keys(keys.AC):
            if k != keys.ac(but) and (b := blob_of(tier.get(k))) is not None:
                used.add(b)
        return used

    def evict(self, key: str, shared: bool = False) -> bool:
        """Drop an entry from this node: its manifest, its blob unless another entry shares it, and its
        frozen files.  ``shared=True`` drops it from the cluster's shared tier as well, so every node loses
        it (the CLI asks first).  True if anything was removed."""
        self._backfill.drain()       # what this process wrote is in the local tier
        keys.check_key(key)
        if shared and self.shared is None:
            raise ConfigError(f"{self!r} has no shared tier to evict from")
        tiers = [self.local] + ([self.shared] if shared else [])
        removed = False
        for tier in tiers:
            doomed = [keys.ac(key)]
            blob = blob_of(tier.get(keys.ac(key)))
            if blob is not None and blob not in self._blobs_in_use(tier, key):
                doomed.append(keys.cas(blob))
            doomed += [*tier.keys(keys.FROZEN + key), *tier.keys(keys.FROZEN_DIGEST + key)]
            for k in doomed:
                if tier.exists_many([k])[0]:
                    tier.delete(k)
                    removed = True
        frozen_dir = self.frozen.dir
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(frozen_dir):
                if name.startswith(key):
                    os.unlink(os.path.join(frozen_dir, name))
                    removed = True
        self._manifests.pop(key, None)
        return removed

    def gc(self, max_local_bytes: int | None = None) -> dict:
        """Evict least-recently-used local entries down to the budget; the shared tier is never touched.
        Without a shared tier, manifests whose blob went are dropped too (no entry is left half there)."""
        self._backfill.drain()       # what this process wrote is in the local tier
        budget = max_local_bytes if max_local_bytes is not None else self.config.max_local_bytes
        if budget is None:
            raise ValueError("no budget: pass max_local_bytes or configure the cache with one")
        before = sum(1 for _ in self.local.keys(keys.AC))
        out = self.local.gc(budget)
        if self.shared is None and out.get("evicted"):
            for k in list(self.local.keys(keys.AC)):
                blob = blob_of(self.local.get(k))
                if blob is None or not self.local.exists_many([keys.cas(blob)])[0]:
                    self.local.delete(k)
            self._manifests.clear()
        out["entries_evicted"] = before - sum(1 for _ in self.local.keys(keys.AC))
        return out

    def entries(self) -> list[str]:
        self._backfill.drain()       # what this process wrote is in the local tier
        out = []
        for k in self.store.keys(keys.AC):
            with contextlib.suppress(StoreError):
                out.append(keys.entry_key(k))
        return out

    def listing(self) -> list[dict]:
        """One record per entry: sources, family, T x H x W, fps, tokens, bytes, tiers (``catalog.listing``)."""
        self._backfill.drain()       # what this process wrote is in the local tier
        return catalog.listing(self)

    def options_cached_for(self, source: str) -> list[dict]:
        """The options under which ``source`` is cached (by its recorded digest), for a helpful miss."""
        d = self._recorded_digest(source, fingerprint(source, self.config.limits))
        return [] if d is None else catalog.options_under(self, d)

    def stats(self) -> dict:
        """The counts of the cache and of each tier (``catalog.stats``)."""
        self._backfill.drain()       # what this process wrote is in the local tier
        return catalog.stats(self)

    def _sources_by_digest(self) -> dict[str, list[str]]:
        return catalog.sources_by_digest(self.store)


# --- the caches of this process, by identity (vidcache.node looks them up) --------------------
_REGISTRY: dict[str, VideoCache] = {}


def _register(cache: VideoCache) -> None:
    if cache._identity is not None:
        _REGISTRY[cache._identity] = cache


def registered(identity: str) -> VideoCache | None:
    """The cache of this process whose identity was read as ``identity``, if any."""
    return _REGISTRY.get(identity)
