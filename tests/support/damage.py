"""Damage cached bytes on purpose, the way the integrity tests need it."""
from vidcache import keys


def corrupt_blob(cache, key, at=100):
    """Flip every bit of one byte of ``key``'s stored frames (every tier ``cache.store`` writes); its store key."""
    blob_key = keys.cas(cache.manifest(key).frames.blob)
    raw = bytearray(cache.store.get(blob_key))
    raw[at] ^= 0xFF
    cache.store.set_many({blob_key: bytes(raw)})
    return blob_key


def flip_seen_by_decoder(value: bytes, m, at: float = 0.5, bit: int = 0x10) -> bytes:
    """``value`` (a compact object of the entry ``m`` describes) with one byte flipped where decoding sees it:
    the first position from ``at`` of the way in whose flip no longer decodes to ``m``'s frames.  A flip can
    fall where PyAV conceals it and the frames come out exact (a CI run met one); that is another fault, with a
    test of its own (tests/scenarios/test_compact_faults.py), so tests of a refused read damage it here."""
    from vidcache.integrity import compact_frames
    start = int(len(value) * at)
    for i in range(start, len(value)):
        rotted = bytearray(value)
        rotted[i] ^= bit
        if compact_frames(bytes(rotted), m)[1] is not None:
            return bytes(rotted)
    raise AssertionError(f"no flip from byte {start} on changes what the object decodes to")
