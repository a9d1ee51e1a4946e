"""Is this copy sound?  The one answer, for pulls, reads, publishes and ``verify`` alike.

Every stored object is checked against something that does not travel in the same bytes:
  ``cas/<digest>``               the bytes hash to the digest in their own name (raw or zlib);
  ``ac/<key>``                   the manifest parses, is sealed, and agrees with its key and options
                                 (``Manifest.from_json``);
  ``frozen/<key><suffix>``       the file hashes to the digest recorded when it was made and verified
                                 (``frozen-digest/<key><suffix>``, in the same tier: two nodes may encode
                                 the same frames into different bytes, so each tier records its own copy);
  ``emb/<id>``                   the record hashes to the digest sealed in front of it, and says it was computed
                                 for ``<id>`` (``vidcache.embeddings.record``).
A copy that fails is never served, backfilled or published: callers move it aside
(``quarantine/``) and rebuild from a sound copy, the frames, or the source.

Functions over bytes and keys only: no cache, no store is needed to answer.
"""
from __future__ import annotations

import zlib
from typing import TYPE_CHECKING, NamedTuple

from . import keys
from .digest import Digest
from .errors import (CorruptEntryError, CorruptManifestError, DigestMismatchError, FrozenFileError,
                     PermissionDeniedError, ReadOnlyStoreError, warn_once)
from .manifest import Manifest, decode_frames

if TYPE_CHECKING:
    import numpy as np

    from .store.base import Store


def blob_matches(blob: str, value) -> bool:
    """Whether stored bytes are the blob ``blob`` names: raw, or zlib-compressed by a ``zlib`` cache."""
    if str(Digest.of(value)) == blob:
        return True
    try:
        return str(Digest.of(decode_frames(value, "zlib"))) == blob
    except zlib.error:
        return False


def frozen_problem(value, record) -> str | None:
    """Why a frozen file's bytes are not the ones recorded for it (None: sound).  ``value``: the bytes, or
    their ``Digest`` when they were hashed as they streamed in.  ``record`` is the ``frozen-digest/`` value of
    the same tier, or None for a file made before files were recorded."""
    if record is None:
        return "no recorded digest"
    try:
        want = Digest.parse(bytes(record).decode())
    except (ValueError, UnicodeDecodeError):
        return "its recorded digest is damaged"
    got = value if isinstance(value, Digest) else Digest.of(value)
    return None if got == want else f"hashes to {got}, recorded {want}"


def check_object(store_key: str, value, record=None) -> None:
    """Raise ``CorruptEntryError`` unless ``value`` is a sound copy of ``store_key`` (TieredStore's pull
    hook; ``record``: a frozen file's recorded digest)."""
    if store_key.startswith(keys.CAS):
        if not blob_matches(store_key[len(keys.CAS):], value):
            raise DigestMismatchError(f"shared object {store_key} does not hash to its digest")
    elif store_key.startswith(keys.AC):
        Manifest.from_json(value, keys.entry_key(store_key))
    elif store_key.startswith(keys.EMB):
        from .embeddings.record import claimed_id, unseal
        if (claim := claimed_id(unseal(value))) != store_key[len(keys.EMB):]:
            raise CorruptEntryError(f"embeddings object {store_key} holds the record of {claim}")
    elif store_key.startswith(keys.FROZEN):
        if (why := frozen_problem(value, record)) is not None:
            raise FrozenFileError(f"frozen file {store_key} {why}")


def is_sound(store_key: str, value, record=None) -> bool:
    try:
        check_object(store_key, value, record)
        return True
    except (CorruptEntryError, FrozenFileError):
        return False


def checked_frames(m: Manifest, view, verify: bool):
    """The frame bytes of ``m`` from a stored ``view``: decompressed, sized, and (``verify``) hashed;
    ``DigestMismatchError`` naming the entry otherwise."""
    fr = m.frames
    try:
        src = fr.decode(view)
    except zlib.error as e:
        raise DigestMismatchError(f"entry {m.key}: blob {fr.blob} does not decompress: {e}") from None
    if len(src) != fr.nbytes:
        raise DigestMismatchError(f"entry {m.key}: blob {fr.blob} has {len(src)} bytes, expected {fr.nbytes}")
    if verify and str(got := Digest.of(src)) != fr.blob:
        raise DigestMismatchError(f"entry {m.key}: blob hashes to {got}, expected {fr.blob}")
    return src


class TierCopy(NamedTuple):
    """One tier's copy of an entry, as ``verify`` and repair see it."""
    manifest_bytes: bytes | None   # the manifest as stored
    manifest: Manifest | None      # parsed and checked (None: absent or corrupt)
    blob: bytes | None             # the frames' stored bytes (decoded, for a compact copy)
    problem: str | None            # why this copy is not sound (None: it is)
    compact: bool = False          # the frames are the tier's compact object, not raw bytes
    damage: str | None = None      # a sound compact copy's damage beyond its frames: rewrite it, never delete it

    @property
    def frames(self):
        """The copy's frame bytes (for a sound copy): its compact object decoded, or its blob decompressed."""
        return self.blob if self.compact else self.manifest.frames.decode(self.blob)


def tier_copy(tier: "Store", key: str, compact_key: str | None = None) -> TierCopy:
    """``compact_key``: where this tier may hold the entry's compact object instead of raw frames.  That object is
    read only as far as its manifest bounds it (``max_object_bytes``, D59: a bloated one was read whole)."""
    manifest_bytes = tier.get(keys.ac(key))
    if manifest_bytes is None:
        return TierCopy(None, None, None, "no manifest")
    try:
        m = Manifest.from_json(manifest_bytes, key)
    except CorruptManifestError as e:
        return TierCopy(manifest_bytes, None, None, str(e))
    try:
        blob = tier.get(keys.cas(m.frames.blob))
    except CorruptEntryError as e:           # not an object at all (a FIFO at its name, D58)
        return TierCopy(manifest_bytes, m, None, str(e))
    if blob is None and compact_key is not None:
        try:
            value, more = tier.get_bounded(compact_key, max_object_bytes(m))
        except CorruptEntryError as e:       # not a regular file, or past even the tier's bound: not read
            return TierCopy(manifest_bytes, m, None, f"compact object {compact_key}: {e}", True)
        if value is not None:
            got = compact_frames(value, m)
            damage = f"is more than {max_object_bytes(m)} bytes, more than its entry writes" if more \
                else got.trailing
            problem = None if got.why is None else f"compact object {compact_key} {got.why}"
            return TierCopy(manifest_bytes, m, got.frames, problem, True,
                            None if damage is None else f"compact object {compact_key} {damage}")
    if blob is None:
        return TierCopy(manifest_bytes, m, None, f"blob {m.frames.blob} missing")
    if not blob_matches(m.frames.blob, blob):
        return TierCopy(manifest_bytes, m, blob, f"blob {m.frames.blob} does not hash to its digest")
    return TierCopy(manifest_bytes, m, blob, None)


def max_object_bytes(m: Manifest) -> int:
    """The most a sound compact object of ``m`` can be: its frames uncompressed, an eighth more for a codec that
    does not compress them, and a MiB of container (D51: a 2 GiB object for a 1.3 MB entry was read whole)."""
    return m.frames.nbytes + m.frames.nbytes // 8 + (1 << 20)


def quarantine(tiers: "list[Store]", store_key: str) -> None:
    """Move every copy of ``store_key`` that fails its check aside (``quarantine/``, kept for inspection,
    never served); sound copies stay.  A tier that refuses the move (read-only, no permission) keeps its bad
    copy, which its caller still refuses to serve: one warning, and the other tiers are still cleaned."""
    for tier in tiers:
        value = tier.get(store_key)
        if value is not None and not is_sound(store_key, value):
            try:
                tier.set_many({keys.quarantined(store_key): value})
                tier.delete(store_key)
            except (ReadOnlyStoreError, PermissionDeniedError) as e:
                warn_once("quarantine", "vidcache: could not move a corrupt copy aside: %s", e)


class Expanded(NamedTuple):
    """What a compact object decodes to, checked against its manifest."""
    frames: "np.ndarray | None"    # exactly the entry's frames (None: the object does not hold them)
    why: str | None                # why not (None: it does)
    trailing: str | None = None    # damage after the last frame: the frames are sound, the object is to be rewritten


def compact_frames(value, m: Manifest) -> Expanded:
    """Whether a compact object (a frozen file: bytes, or a file being fetched) decodes to exactly ``m``'s frames.
    The blob digest is the frames' own, so this check needs no record of the object.  The rule (D55): an object
    whose frames hash to the blob digest is sound, whatever follows them; what does is ``trailing``, a reason to
    write a clean copy, never to delete this one."""
    from .frozen_file import frames_bytes
    try:
        raw, trailing = frames_bytes(value, tuple(m.frames.shape))
    except FrozenFileError as e:
        return Expanded(None, str(e))
    if str(got := Digest.of(raw)) != m.frames.blob:
        return Expanded(None, f"decodes to frames hashing to {got}, expected {m.frames.blob}")
    return Expanded(raw, None, trailing)
