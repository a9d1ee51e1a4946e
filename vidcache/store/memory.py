"""A dict-backed store: the reference model for tests."""
from __future__ import annotations

from typing import Iterator, Mapping

from .base import Store


class MemoryStore(Store):
    supports_atomic_batches = True

    def __init__(self, *, read_only: bool = False) -> None:
        super().__init__(read_only=read_only)
        self._data: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._check_writable()
        self._data.update({k: bytes(v) for k, v in items.items()})

    def keys(self, prefix: str = "") -> Iterator[str]:
        return iter(sorted(k for k in self._data if k.startswith(prefix)))

    def delete(self, key: str) -> None:
        self._check_writable()
        self._data.pop(key, None)

    def __repr__(self) -> str:
        return f"MemoryStore(<{len(self._data)} keys>)"
