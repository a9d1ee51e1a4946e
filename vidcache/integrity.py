"""Is this copy sound?  The one answer, for pulls, reads, publishes and ``verify`` alike.

Every stored object is checked against something that does not travel in the same bytes:
  ``cas/<digest>``               the bytes hash to the digest in their own name (raw or zlib);
  ``ac/<key>``                   the manifest parses, is sealed, and agrees with its key and options
                                 (``Manifest.from_json``);
  ``frozen/<key><suffix>``       the file hashes to the digest recorded when it was made and verified
                                 (``frozen-digest/<key><suffix>``, in the same tier: two nodes may encode
                                 the same frames into different bytes, so each tier records its own copy).
A copy that fails is never served, backfilled or published: callers move it aside
(``quarantine/``) and rebuild from a sound copy, the frames, or the source.

Functions over bytes and keys only: no cache, no store is needed to answer.
"""
from __future__ import annotations

import zlib

from . import keys
from .digest import Digest
from .errors import CorruptEntryError, DigestMismatchError, FrozenFileError
from .manifest import Manifest


def blob_matches(blob: str, value) -> bool:
    """Whether stored bytes are the blob ``blob`` names: raw, or zlib-compressed by a ``zlib`` cache."""
    if str(Digest.of(value)) == blob:
        return True
    try:
        return str(Digest.of(zlib.decompress(value))) == blob
    except zlib.error:
        return False


def frozen_problem(value, record) -> str | None:
    """Why a frozen file's bytes are not the ones recorded for it (None: sound).  ``record`` is the
    ``frozen-digest/`` value of the same tier, or None for a file made before files were recorded."""
    if record is None:
        return "no recorded digest"
    try:
        want = Digest.parse(bytes(record).decode())
    except (ValueError, UnicodeDecodeError):
        return "its recorded digest is damaged"
    got = Digest.of(value)
    return None if got == want else f"hashes to {got}, recorded {want}"


def check_object(store_key: str, value, record=None) -> None:
    """Raise ``CorruptEntryError`` unless ``value`` is a sound copy of ``store_key`` (TieredStore's pull
    hook; ``record``: a frozen file's recorded digest)."""
    if store_key.startswith(keys.CAS):
        if not blob_matches(store_key[len(keys.CAS):], value):
            raise DigestMismatchError(f"shared object {store_key} does not hash to its digest")
    elif store_key.startswith(keys.AC):
        Manifest.from_json(value, keys.entry_key(store_key))
    elif store_key.startswith(keys.FROZEN):
        if (why := frozen_problem(value, record)) is not None:
            raise FrozenFileError(f"frozen file {store_key} {why}")


def is_sound(store_key: str, value, record=None) -> bool:
    try:
        check_object(store_key, value, record)
        return True
    except (CorruptEntryError, FrozenFileError):
        return False
