"""``verify`` and its repair: check an entry in every tier, move bad copies aside, put a sound copy back where one
is missing, else rebuild the entry from its source.

The order is bb-storage's repair strategy: quarantine what is bad; replicate a sound copy from another tier
(its mirrored store's job); only when no tier holds one, rebuild through a callback the cache hands in (its
``RepairFunc``: here ``VideoCache.ensure`` over the entry's recorded sources).  Whether a copy is sound is
``integrity``'s answer; this module only decides what to do about it.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable

from . import keys
from .compact import CompactLayout, as_tensor
from .errors import VidcacheError
from .frozen_copies import FrozenCopies
from .integrity import TierCopy, compact_frames, max_object_bytes, tier_copy
from .manifest import Manifest, options_of
from .options import VideoOptions
from .store.base import Store

if TYPE_CHECKING:
    from .reads import ReadPath


class Repair:
    """Verify and repair entries across ``tiers`` ((name, store), local first)."""

    def __init__(self, tiers: list[tuple[str, Store]], compact: CompactLayout, frozen: FrozenCopies, *,
                 reads: ReadPath, rebuild: Callable[[str, VideoOptions], bool], read_only: bool) -> None:
        self.tiers, self.compact, self.frozen = tiers, compact, frozen
        self.reads = reads                # its quarantine (bad copies aside, its memo too) and its forget
        self.rebuild = rebuild            # (key, options) -> rebuilt from a recorded source?
        self.read_only = read_only

    def copy(self, name: str, tier: Store, key: str) -> TierCopy:
        return tier_copy(tier, key, self.compact.key(key) if name == "shared" else None)

    def verify(self, key: str, repair: bool = False) -> list[str]:
        """The problems of ``key`` in every tier, its frozen files included (empty: sound).  ``repair``
        quarantines bad copies, restores them from a sound copy in another tier, or rebuilds the entry from
        its source (bad frozen files are quarantined here and remade by the serving layer)."""
        keys.check_key(key)
        copies = [(name, tier, self.copy(name, tier, key)) for name, tier in self.tiers]
        shared = next((c for name, _, c in copies if name == "shared"), None)

        def decodes(tier: str, suffix: str, value: bytes) -> bool:
            # The compact object needs no record to be checked: the frames it decodes to have the blob's digest.
            # tier_copy decoded it already when the tier holds no raw frames; else it is decoded here.
            if tier != "shared" or suffix != self.compact.suffix() or shared is None or shared.manifest is None:
                return False
            if shared.compact:
                return shared.problem is None and shared.damage is None
            got = compact_frames(value, shared.manifest)
            return got.frames is not None and got.trailing is None
        # The compact object is the entry's frames in that tier: rewritten (write-then-retire) by ``repair`` below,
        # never quarantined first (D57: deleted before its replacement existed), and read as far as its manifest
        # bounds it (D59).
        problems = self.frozen.problems(
            key, repair, decodes, replaced=lambda tier, suffix: tier == "shared" and suffix == self.compact.suffix(),
            limit=None if shared is None or shared.manifest is None else max_object_bytes(shared.manifest))
        has_shared = any(name == "shared" for name, _ in self.tiers)
        for name, tier, c in copies:
            if c.problem is None:
                if c.damage is not None:
                    problems.append(f"{name}: {c.damage}")      # sound frames; repair writes a clean copy (D55)
                continue
            if name == "local" and (c.manifest_bytes is None
                                    or (c.manifest is not None and c.blob is None and has_shared)):
                continue            # absent locally, or its blob evicted: reads go through to the shared tier
            problems.append(f"{name}: {c.problem}")
        if not any(t.exists_many([keys.ac(key)])[0] for _, t in self.tiers):
            problems.append("not cached")
        if problems and repair and not self.read_only:
            self.repair(key)
        return problems

    def repair(self, key: str) -> None:
        """Put sound copies of ``key`` where they are missing or bad.  Write-then-retire, as the read path does
        (D42): a bad raw blob or manifest holds no sound frames and is moved aside at once; the shared tier's
        compact object is replaced only once its replacement is verified (``CompactLayout.publish``), and removed
        only when no sound copy of the frames exists to replace it with, in which case it holds none either
        (D57: it was deleted first, and a kill in between left the entry in no tier)."""
        good = None                            # (manifest bytes, raw frame bytes, manifest) of a sound copy
        options = None
        found = None                           # (manifest bytes, manifest) of a sound manifest
        unsound_object = None                  # the shared compact object, when it does not hold the frames
        for name, tier in self.tiers:
            c = self.copy(name, tier, key)
            if c.manifest_bytes is not None and c.manifest is None:
                self.reads.quarantine(keys.ac(key))
            if c.manifest is None:
                continue
            options = c.manifest.video_options()
            found = found or (c.manifest_bytes, c.manifest)
            if c.problem is None:
                good = good or (c.manifest_bytes, c.frames, c.manifest)
            elif c.compact:
                unsound_object = c.manifest
            elif c.blob is not None:
                self.reads.quarantine(keys.cas(c.manifest.frames.blob))
        self.reads.forget(key)
        if good is None and found is not None:
            good = self._from_quarantine(key, *found)
        if good is not None:
            self.restore(key, *good)
            return
        if unsound_object is not None:         # no sound frames anywhere: this object holds none either
            self.frozen.quarantine("shared", key, self.compact.suffix(), limit=max_object_bytes(unsound_object))
        options = options or self._quarantined_options(key)
        if options is not None:
            self.rebuild(key, options)

    def restore(self, key: str, manifest_raw: bytes, frames: bytes, m: Manifest) -> None:
        """Put a sound copy back into every tier that lacks one: frames first (raw locally; the shared tier
        its compact object, or raw frames), the manifest last.  A shared compact object that is not a clean,
        recorded copy is replaced by ``CompactLayout.publish``: the new object is written over it in one step
        after the old one's bytes are set aside, so the name never goes empty (D57)."""
        blob_key = keys.cas(m.frames.blob)
        for name, tier in self.tiers:
            if name == "shared":
                if (not tier.exists_many([blob_key])[0] and self.compact.sound(key, m) is None
                        and not self.compact.publish(key, as_tensor(frames, m), m)):
                    tier.set_many({blob_key: m.frames.encode(frames)})
            elif not tier.exists_many([blob_key])[0]:
                tier.set_many({blob_key: m.frames.encode(frames)})
            if not tier.exists_many([keys.ac(key)])[0]:
                tier.set_many({keys.ac(key): manifest_raw})

    def _from_quarantine(self, key: str, manifest_raw: bytes, m: Manifest):
        """A copy of ``key``'s frames from the shared tier's ``quarantine/``, when the compact object moved
        there decodes to exactly ``m``'s frames (the blob digest proves them; D42: an object that decoded
        exactly was moved aside and deleted, and nothing read it back once the source was gone)."""
        shared = next((t for name, t in self.tiers if name == "shared"), None)
        if shared is None:
            return None
        value, _ = shared.get_bounded(keys.quarantined(self.compact.key(key)), max_object_bytes(m))
        if value is None:
            return None
        frames = compact_frames(value, m).frames     # whatever follows the frames does not matter here (D55)
        return None if frames is None else (manifest_raw, frames, m)

    def _quarantined_options(self, key: str) -> VideoOptions | None:
        # A quarantined manifest still records the options it was built with.
        for _, tier in self.tiers:
            if (d := options_of(tier.get(keys.quarantined(keys.ac(key))))) is not None:
                with contextlib.suppress(ValueError, TypeError, KeyError, VidcacheError):
                    return VideoOptions.from_dict(d)
        return None
