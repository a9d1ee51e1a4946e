"""Content digests: xxh3-128 of the bytes plus their size, ``xxh3_128:<hex>:<size>``.

The size rides in the digest (as in Bazel's REAPI ``Digest``) so a reader can
check a blob's length without a second lookup.
"""
from __future__ import annotations

from dataclasses import dataclass
import xxhash

ALGO = "xxh3_128"
CHUNK = 1 << 20


@dataclass(frozen=True, order=True)
class Digest:
    hash: str
    size_bytes: int

    def __str__(self) -> str:
        return f"{ALGO}:{self.hash}:{self.size_bytes}"

    @classmethod
    def parse(cls, text: str) -> "Digest":
        try:
            algo, hexdigest, size = text.split(":")
            if algo != ALGO or len(hexdigest) != 32:
                raise ValueError
            int(hexdigest, 16)
            return cls(hexdigest, int(size))
        except ValueError:
            raise ValueError(f"not a vidcache digest: {text!r} (expected '{ALGO}:<32 hex>:<size>')") from None

    @classmethod
    def of(cls, data) -> "Digest":
        mv = memoryview(data).cast("B")
        return cls(xxhash.xxh3_128_hexdigest(mv), mv.nbytes)


class StreamingDigest:
    """Feed chunks as they stream in; ``digest()`` at the end."""

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()
        self.size_bytes = 0

    def update(self, chunk) -> None:
        self._h.update(chunk)
        self.size_bytes += len(chunk)

    def digest(self) -> Digest:
        return Digest(self._h.hexdigest(), self.size_bytes)
