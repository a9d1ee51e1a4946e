"""The read path of a ``VideoCache``, as one object: from an entry's key to its checked frames, through the tiers.

Its shape is bb-storage's ``NewReadCachingBlobAccess(slow, fast, replicator)``: a read tries the node's local tier
(fast), then the shared tier (slow: its compact object, or raw frames), and what it pulls is copied into the local
tier behind it (``store/backfill``, the replicator).  The repair a read may find needed is handed in, and never runs
on the read.  What stays true (the checks themselves are ``integrity``'s):
  * every blob digest is checked on its first read in a process (or on every read, or never: ``verify_reads``),
    every pull from the shared tier before it is served or backfilled, every manifest against its seal, its options
    and its blob's size;
  * a copy that fails its check is never served.  One rule, written once (``_checked``): every bad copy of it is
    moved aside (``quarantine/``) and the read runs once more, so that a sound copy in another tier serves; a second
    failure is final, and the entry is a miss that the next ``ensure`` (or ``verify --repair``) rebuilds;
  * a read never encodes: a compact object that decodes exactly but whose bytes are not its record's is served, and
    its replacement is queued for the writer thread (``republish``, D42).  ``settle`` waits for that queue and for
    the local copies committing behind reads; the cache calls it before anything looks at the tiers;
  * one pull of an entry per node: a read asks once whether this node is pulling it already, and if so waits
    (bounded), then finds it local (``store/single_flight``, D47);
  * what a process remembers (manifests, blobs verified, why a copy was moved aside) is this object's; the memos
    keyed by entry or object hold at most ``MEMO_BOUND`` facts each.
"""
from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Callable, TypeVar

from . import keys
from .compact import UNFETCHED, CompactLayout
from .config import CacheConfig
from .errors import CorruptEntryError, CorruptManifestError, DigestMismatchError, NotCachedError
from .integrity import check_object, checked_frames, quarantine
from .manifest import Manifest
from .store.backfill import Backfill
from .store.base import Store
from .store.single_flight import SingleFlight

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

# Past this many facts a memo starts over: each fact is derived again on demand, so only memory is at stake.
MEMO_BOUND = 4096
# What the check of a stored copy raises when the copy is bad (the rule of ``_checked`` applies to these alone).
FOUND_CORRUPT = (DigestMismatchError, CorruptManifestError)


class Memo:
    """Facts this process keeps under keys whose meaning never changes, at most ``MEMO_BOUND`` of them."""

    def __init__(self) -> None:
        self._facts: dict = {}
        self._lock = threading.Lock()

    def __contains__(self, key: str) -> bool:
        return key in self._facts

    def __len__(self) -> int:
        return len(self._facts)

    def get(self, key: str):
        return self._facts.get(key)

    def put(self, key: str, fact) -> None:
        with self._lock:
            if len(self._facts) >= MEMO_BOUND:
                self._facts.clear()
            self._facts[key] = fact

    def drop(self, key: str | None = None) -> None:
        """Forget ``key``'s fact (None: every fact)."""
        with self._lock:
            if key is None:
                self._facts.clear()
            else:
                self._facts.pop(key, None)


class ReadPath:
    """The reads of one cache: ``store`` (the tiers: ``local``, in front of ``shared`` when there is one), the shared
    tier's ``compact`` layout, and the ``backfill`` that commits pulled copies locally.  Its repair strategy is the
    compact layout's ``republish`` queue: a read hands that writer the replacement of a damaged object."""

    def __init__(self, store: Store, config: CacheConfig, *, compact: CompactLayout, backfill: Backfill,
                 name: str) -> None:
        self.store, self.config = store, config
        self.local, self.shared = store.tiers()
        self.compact, self.backfill, self.name = compact, backfill, name
        self.republish = compact.republish      # the writer's queue: what a read found to re-encode waits there
        self.pulls = SingleFlight(config.layout.locks_dir)      # one pull of an entry per node
        self._manifests = Memo()                # entry key -> its checked manifest (immutable under its key)
        self._moved_aside = Memo()              # store key -> why a read of this process quarantined a copy
        self._verified: set[str] = set()        # blob digests checked in this process

    @property
    def tiers(self) -> list[tuple[str, Store]]:
        return [("local", self.local)] + ([("shared", self.shared)] if self.shared is not None else [])

    # --- what the cache and its policies are handed ------------------------------------------------
    def verified(self, blob: str) -> None:
        """Count ``blob`` as checked in this process (``verify_reads="first"`` does not hash it again)."""
        self._verified.add(blob)

    def forget(self, key: str | None = None) -> None:
        """Drop what this process remembers of entry ``key``'s manifest (None: of every entry's)."""
        self._manifests.drop(key)

    def quarantine(self, store_key: str) -> None:
        """Move every copy of ``store_key`` that fails its check aside (``quarantine/``); keep sound ones."""
        if self.config.read_only:
            return
        quarantine([tier for _, tier in self.tiers], store_key)
        if store_key.startswith(keys.AC):
            self.forget(store_key[len(keys.AC):])

    def moved_aside(self, store_key: str) -> BaseException | None:
        """Why a read of this process moved ``store_key``'s copy aside; None if none did."""
        return self._moved_aside.get(store_key)

    def note_moved_aside(self, store_key: str, why: BaseException) -> None:
        """Another process of this node (read-ahead's pull worker) moved ``store_key``'s copy aside for ``why``:
        remembered as this process's own, so the read that misses it next names the cause."""
        self._moved_aside.put(store_key, why)

    def check_pulled(self, store_key: str, value) -> None:
        """The tiers' check of bytes pulled from the shared tier; a blob that passes counts as verified."""
        check_object(store_key, value)
        if store_key.startswith(keys.CAS):
            self.verified(store_key[len(keys.CAS):])

    def settle(self) -> None:
        """Return once the work the reads of this process left behind has run.  A read returns before its local
        copy commits (``backfill``), and hands the replacement of a damaged compact object to the writer rather
        than encode it (``republish``): whatever looks at the tiers next (``verify``, ``sync``, ``close``, evict,
        gc, listing, stats) must find both done."""
        self.republish.drain()
        self.backfill.drain()

    # --- the one rule for a copy that fails its check ----------------------------------------------
    def _checked(self, store_key: str, read: Callable[[bool], T]) -> T:
        """``read(retry)`` under the rule for a bad copy: never served; every bad copy of ``store_key`` is moved
        aside and ``read`` runs once more (a sound copy in another tier serves); a second failure is raised.  A
        retry that finds nothing raises the first failure: every copy there was is bad, and is now aside."""
        why = None
        for retry in (False, True):
            try:
                return read(retry)
            except NotCachedError:
                if not retry:
                    raise
                raise why from None
            except FOUND_CORRUPT as e:
                why = e
                self.quarantine(store_key)
                self._moved_aside.put(store_key, e)     # so that a later miss (read-ahead met it, say) names it
                if retry:
                    raise
        raise AssertionError("unreachable")

    # --- manifests ---------------------------------------------------------------------------------
    def manifest(self, key: str) -> Manifest | None:
        """The checked manifest of ``key``, or None when absent (or found corrupt and quarantined)."""
        keys.check_key(key)
        if (m := self._manifests.get(key)) is not None:
            return m
        ac = keys.ac(key)
        # Outside the rule: a shared copy the tiers' check refuses is raised as it is (not moved aside), so that
        # read-ahead and the read after it both name it.
        first = self.store.get(ac)

        def parsed(retry: bool) -> Manifest | None:
            raw = self.store.get(ac) if retry else first
            return None if raw is None else Manifest.from_json(raw, key)
        try:
            m = self._checked(ac, parsed)
        except CorruptManifestError:
            return None
        if m is not None:
            self._manifests.put(key, m)
        return m

    def require_manifest(self, key: str) -> Manifest:
        m = self.manifest(key)
        if m is None:
            raise NotCachedError(f"no entry {key} in {self.name}")
        return m

    def sound_manifest(self, key: str) -> Manifest | None:
        """The manifest of a present entry whose blob passes its checks; None (after quarantine) otherwise."""
        try:
            m = self.manifest(key)
            if m is None:
                return None
            if self.shared is not None and not self.local.exists_many([keys.cas(m.frames.blob)])[0]:
                # Only in the shared tier: present is enough here (every pull is checked), and a resume on
                # a fresh node must not download the whole tier to count its hits.
                return m if self.compact.holds(key, m.frames.blob) else None
            with self.blob(m):
                pass
            return m
        except (CorruptEntryError, NotCachedError):
            return None

    def _begin(self, key: str) -> tuple[Manifest, object, bool]:
        """``key``'s manifest for a read of its frames; its compact object's fetch when this node has neither (else
        ``UNFETCHED``): the two are fetched side by side, so a first read waits for one round trip to the shared
        tier, not two in a row; and whether the read has asked already if this node is pulling the entry.  Only
        reads prefetch: a resume check must not pull frames (and ``CompactLayout.expand`` starts a fetch itself)."""
        keys.check_key(key)
        if (self.shared is None or self.config.shared_layout != "compact" or key in self._manifests
                or self.local.exists_many([keys.ac(key)])[0]):
            return self.require_manifest(key), UNFETCHED, False
        if self._waited_for_pull(key):       # another thread or process of this node brought it meanwhile
            return self.require_manifest(key), UNFETCHED, True
        prefetch = self.compact.prefetch(key)   # decoded as it arrives (store/prefetch)
        return self.require_manifest(key), prefetch, True

    # --- frames ------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def blob(self, m: Manifest, verify: bool | None = None, prefetch=UNFETCHED, asked: bool = False):
        """The frame bytes of ``m``, checked for presence and size, and for their digest when due.  ``prefetch``:
        the ``Prefetch`` of the shared tier's compact object, when ``_begin`` started it.  ``asked``: the caller
        knows already whether this node is pulling the entry (it asked, or holds the pull lock: ``bring_local``)."""
        if verify is None:
            verify = self.config.verify_reads == "always" or (
                self.config.verify_reads == "first" and m.frames.blob not in self._verified)
        # The fetch begun beforehand serves the first attempt only: after a quarantine, what the tier holds now.
        stack, src = self._checked(keys.cas(m.frames.blob), lambda retry: self._open(
            m, verify, UNFETCHED if retry else prefetch, asked or retry))
        with stack:
            yield src

    def _open(self, m: Manifest, verify: bool, prefetch, asked: bool) -> tuple[contextlib.ExitStack, object]:
        """One attempt of ``blob``: the local copy, then the compact object, then raw frames through the tiers;
        the frames, and the views they lie in (left open for the caller)."""
        blob_key = keys.cas(m.frames.blob)
        try:
            with contextlib.ExitStack() as stack:
                view = None
                if self.shared is not None:
                    self.backfill.wait(blob_key)      # this process's copy, if its commit is under way
                    view = stack.enter_context(self.local.read(blob_key))
                    if view is None and not asked and self._waited_for_pull(m.key):
                        view = stack.enter_context(self.local.read(blob_key))   # what that pull brought
                    if view is None and (expanded := self.compact.expand(m, prefetch)) is not None:
                        self.verified(m.frames.blob)  # decoded and checked against the blob digest by expand
                        return stack.pop_all(), expanded      # an array of its own
                if view is None:
                    view = stack.enter_context(self.store.read(blob_key))
                if view is None:
                    earlier = self._moved_aside.get(blob_key)
                    raise NotCachedError(f"entry {m.key}: its blob {m.frames.blob} is not in {self.name}" + (
                        f" (this process quarantined a corrupt copy: {earlier})" if earlier else ""))
                src = checked_frames(m, view, verify)
                if verify:
                    self.verified(m.frames.blob)
                return stack.pop_all(), src
        except DigestMismatchError as e:   # every pull from the shared tier is checked before it is served, too
            if m.key in str(e):
                raise
            raise DigestMismatchError(f"entry {m.key}: {e}") from e

    @contextlib.contextmanager
    def read_frames(self, key: str):
        """Zero-copy: a read-only uint8 TCHW numpy view into the memory map, valid inside the block."""
        import numpy as np          # here, not at import: the CLI's manifest commands never need it
        m, prefetch, asked = self._begin(key)
        with self.blob(m, prefetch=prefetch, asked=asked) as src:
            view = np.frombuffer(src, dtype=np.uint8).reshape(m.frames.shape)
            view.flags.writeable = False      # an expanded compact object is an array of ours: read-only all the same
            yield view

    def frames(self, key: str, manifest: Manifest | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The cached uint8 TCHW frames: one copy out of the memory map (into ``out`` if given), or none
        when they were just expanded from the shared tier's compact object."""
        import numpy as np
        import torch
        m, prefetch, asked = (manifest, UNFETCHED, False) if manifest is not None else self._begin(key)
        shape = list(m.frames.shape)
        if out is not None and (out.dtype != torch.uint8 or list(out.shape) != shape or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous uint8 tensor of shape {shape}")
        with self.blob(m, prefetch=prefetch, asked=asked) as src:
            if out is None:
                if isinstance(src, np.ndarray):
                    # Just expanded from the shared tier's compact object: a buffer of our own, so it is
                    # the tensor (the copy out was 6% of a first read).
                    return torch.from_numpy(src).reshape(shape)
                out = torch.empty(shape, dtype=torch.uint8)
            np.copyto(out.numpy().reshape(-1), np.frombuffer(src, dtype=np.uint8))   # the one copy
        return out

    # --- pulls -------------------------------------------------------------------------------------
    def bring_local(self, key: str) -> bool:
        """Make this node's local tier hold entry ``key``, manifest and frames, committed: pulled from the
        shared tier if it must be, checked as every pull is (a corrupt copy is quarantined and raised, never
        kept).  True if it pulled.  One pull per key per node: a pull of ``key`` under way in another thread
        or process of this node is waited for, then found local (``store/single_flight``)."""
        if self.shared is None or self.local.read_only:
            return False
        with self.pulls.hold(key, self._pull_wait_s):
            m = self.require_manifest(key)           # a pulled manifest is kept locally by the tiers
            blob_key = keys.cas(m.frames.blob)
            self.backfill.wait(blob_key)
            if self.local.exists_many([blob_key])[0]:
                return False
            with self.blob(m, asked=True):           # this pull holds the entry's lock: nobody else to wait for
                pass
            self.backfill.wait(blob_key)            # committed before the lock goes: other processes read it
        return True

    def _waited_for_pull(self, key: str) -> bool:
        """Wait while this node pulls ``key`` elsewhere (``bring_local``), so a read does not pull it again;
        True if it waited.  Bounded: a stuck puller is outwaited, then the read pulls by itself."""
        return not self.local.read_only and self.pulls.wait(key, self._pull_wait_s)

    @property
    def _pull_wait_s(self) -> float:
        # A pull is one bounded transfer of the object plus its decode and local commit.  (Imported here: the
        # fsspec store brings fsspec, which a cache without a shared tier never needs.)
        from .store.fsspec import DEFAULT_TIMEOUT_S
        return 2 * ((self.shared.timeout_s if self.shared is not None else None) or DEFAULT_TIMEOUT_S)
