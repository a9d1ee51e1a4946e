"""Frozen files in the cache, for stock SGLang: this node's copies and the shared tier's, each checked
against the digest its tier recorded before it is handed out, remade from the frames when it is not.

Where they live: a node-local copy under ``<VIDCACHE_DIR>/frozen/`` (written and
verified once), and, with a shared tier, an immutable object ``frozen/<key><suffix>``
published there once, so that every SGLang node can read it by URL.  The MagicYUV
object is also the shared tier's compact copy of the entry (``VideoCache``), so a
stock-mode cluster stores each entry once.  The format itself: ``vidcache.frozen_file``.
"""
from __future__ import annotations

import os
import time

from .. import keys
from ..errors import FrozenFileError, VidcacheError
from ..frozen_file import (BY_SUFFIX, FORMATS, FrozenFormat, available_decoders, decode_all,  # noqa: F401 (re-exported)
                           verify_frozen, write_frozen)
from ..integrity import frozen_problem
from ..serving import SERVING_FORMAT


# --- in the cache ---------------------------------------------------------------------------
# Every frozen copy is checked before it is handed out: its bytes must hash to the digest its tier recorded
# when the copy was verified by decoding (vidcache.integrity).  A check holds for RECHECK_S seconds while the
# copy is unchanged (same size, mtime and inode for a file), then it is made again: bit rot, or a byte flipped
# in place with its mtime kept, changes none of those, and a long-lived server or trainer must not hand such a
# copy out for ever (D37).  Local files are cheap to hash (page cache); a shared object costs a GET, so the
# window is a bound on exposure, not a per-request check.
RECHECK_S = 60.0
_SOUND_FILES: dict[tuple, float] = {}      # stat id -> when its check was made (time.monotonic)
_SOUND_SHARED: dict[tuple, float] = {}     # (tier identity, store key) -> the same


def _still_sound(memo: dict, k) -> bool:
    checked = memo.get(k)
    return checked is not None and time.monotonic() - checked < RECHECK_S


def _stat_id(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


def _decodes_to_frames(cache, key: str, value: bytes, suffix: str) -> bool:
    """A copy without a sound record (made by an older vidcache, or its record damaged): sound only if it decodes
    to the entry's frames (digest-checked against the manifest)."""
    import tempfile
    os.makedirs(cache.tmp_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=suffix, dir=cache.tmp_dir) as tmp:
        tmp.write(value)
        tmp.flush()
        try:
            verify_frozen(tmp.name, cache.frames(key))
        except (FrozenFileError, RuntimeError, ValueError, OSError, VidcacheError):
            return False        # (the frames themselves unreadable: nothing to call this copy sound against)
    return True


def _copy_is_sound(cache, tier: str, key: str, f: FrozenFormat) -> bool | None:
    """Whether ``tier``'s copy is sound (None: absent).  A copy whose record is missing or disagrees is checked by
    decoding: one that decodes to the entry's frames is sound and (re)recorded, as the record is what was damaged
    (in the compact layout the shared copy *is* the entry's frames: quarantining it would lose the entry, D57).
    Only a copy that does not decode to the frames is quarantined."""
    value, record = cache.frozen.read(tier, key, f.suffix)
    if value is None:
        return None
    if record is not None and frozen_problem(value, record) is None:
        return True
    if _decodes_to_frames(cache, key, value, f.suffix):
        if not cache.read_only:
            cache.frozen.record(tier, key, f.suffix, value)
        return True
    cache.frozen.quarantine(tier, key, f.suffix)
    if cache.read_only:
        raise FrozenFileError(f"{tier} frozen file {key}{f.suffix} is corrupt and this cache is read-only: "
                              "`vidcache verify --repair` on a writable node")
    return False


def local_frozen_path(cache, key: str, fmt: str | None = None) -> str:
    """The node-local frozen file for ``key``, checked against its recorded digest; written from the
    digest-checked frames and verified by re-decoding when absent (or found corrupt)."""
    f = FORMATS[fmt or SERVING_FORMAT]
    path = os.path.join(cache.frozen.dir, keys.check_key(key) + f.suffix)
    if _still_sound(_SOUND_FILES, sid := _stat_id(path)):
        return path
    if sid is not None and _copy_is_sound(cache, "local", key, f):
        _SOUND_FILES[_stat_id(path)] = time.monotonic()
        return path
    frames = cache.frames(key)
    write_frozen(frames, path, f.name, verify=lambda p: verify_frozen(p, frames))
    with open(path, "rb") as fh:
        cache.frozen.record("local", key, f.suffix, fh.read())
    _SOUND_FILES[_stat_id(path)] = time.monotonic()
    return path


def published_frozen_key(cache, key: str, fmt: str | None = None) -> str:
    """The shared tier's frozen file of ``key`` (its store key), checked against its recorded digest (again
    after ``RECHECK_S``); published from the verified local copy when absent or found corrupt (immutable, first
    writer wins, its digest recorded after it)."""
    f = FORMATS[fmt or SERVING_FORMAT]
    skey = keys.frozen(key, f.suffix)
    shared = cache.shared
    if shared is None:
        raise ValueError(f"{cache!r} has no shared tier to publish frozen files into")
    memo = (cache.identity, skey)
    if _still_sound(_SOUND_SHARED, memo):
        return skey
    for _ in range(2):                  # a writer on another node may win the publish: check theirs
        if _copy_is_sound(cache, "shared", key, f):
            _SOUND_SHARED[memo] = time.monotonic()
            return skey
        with open(local_frozen_path(cache, key, f.name), "rb") as fh:
            value = fh.read()
        if shared.set_if_not_exists(skey, value):
            cache.frozen.record("shared", key, f.suffix, value)
            _SOUND_SHARED[memo] = time.monotonic()
            return skey
    raise FrozenFileError(f"shared frozen file {skey} could not be published soundly")


def repair_frozen(cache, key: str) -> list[str]:
    """``verify --repair`` for frozen files: check unrecorded copies by decoding (recorded or
    quarantined), and remake every copy that a check moved aside.  The formats remade."""
    remade = []
    quarantine = cache.layout.quarantine_dir
    for f in FORMATS.values():
        sound = _copy_is_sound(cache, "local", key, f)
        if sound is False or (sound is None and os.path.exists(os.path.join(quarantine, key + f.suffix))):
            local_frozen_path(cache, key, f.name)
            remade.append(f"local {f.suffix}")
        if cache.shared is None:
            continue
        bad = _copy_is_sound(cache, "shared", key, f) is False
        if bad or (not cache.shared.exists_many([keys.frozen(key, f.suffix)])[0]
                   and cache.shared.exists_many([keys.quarantined(keys.frozen(key, f.suffix))])[0]):
            _SOUND_SHARED.pop((cache.identity, keys.frozen(key, f.suffix)), None)
            published_frozen_key(cache, key, f.name)
            remade.append(f"shared {f.suffix}")
    return remade
