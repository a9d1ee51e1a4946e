"""Damage cached bytes on purpose, the way the integrity tests need it."""
import os

from vidcache import keys


def flip_stored(store, key: str, at: int = 100, bit: int = 0xFF) -> str:
    """Flip ``bit`` of byte ``at`` of ``key``'s value in ``store``, written back under the same key; ``key``."""
    raw = bytearray(store.get(key))
    raw[at] ^= bit
    store.set_many({key: bytes(raw)})
    return key


def flip_file(path, at, bit: int = 0xFF, keep_mtime: bool = False) -> None:
    """Flip ``bit`` of one byte of the file at ``path``, in place (same inode and size): byte ``at``, or, for a
    float, the byte that fraction of the way in.  ``keep_mtime``: bit rot as a long-lived process meets it, the
    file's mtime as it was."""
    st = os.stat(path)
    at = int(st.st_size * at) if isinstance(at, float) else at
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ bit]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def corrupt_blob(cache, key, at=100):
    """Flip every bit of one byte of ``key``'s stored frames (every tier ``cache.store`` writes); its store key."""
    return flip_stored(cache.store, keys.cas(cache.manifest(key).frames.blob), at)


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
