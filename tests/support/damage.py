"""Damage cached bytes on purpose, the way the integrity tests need it."""
from vidcache import keys


def corrupt_blob(cache, key, at=100):
    """Flip every bit of one byte of ``key``'s stored frames (every tier ``cache.store`` writes); its store key."""
    blob_key = keys.cas(cache.manifest(key).frames.blob)
    raw = bytearray(cache.store.get(blob_key))
    raw[at] ^= 0xFF
    cache.store.set_many({blob_key: bytes(raw)})
    return blob_key
