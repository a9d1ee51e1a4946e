"""A dict-backed store: the reference model for tests."""
from __future__ import annotations

from typing import Iterator, Mapping

from .base import Store


class MemoryStore(Store):
    supports_writes = supports_deletes = supports_listing = True

    def __init__(self, data: dict[str, bytes] | None = None, *, read_only: bool = False) -> None:
        super().__init__(read_only=read_only)
        self._data: dict[str, bytes] = {} if data is None else data   # shared with with_read_only() copies

    def get(self, key: str) -> bytes | None:
        return self._data.get(key)

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._check_writable()
        self._data.update({k: bytes(v) for k, v in items.items()})

    def set_if_not_exists(self, key: str, value: bytes) -> bool:
        self._check_writable()
        if key in self._data:
            return False
        self._data[key] = bytes(value)
        return True

    def keys(self, prefix: str = "") -> Iterator[str]:
        return iter(sorted(k for k in self._data if k.startswith(prefix)))

    def delete(self, key: str) -> None:
        self._check_writable()
        self._data.pop(key, None)

    # --- value semantics (Store's, from _args) ----------------------------------------
    # Where the data is: the dict itself, the same object (a pickled copy holds a copy of it: another store).
    _location = ("data",)

    def _args(self) -> dict:
        return {"data": self._data, "read_only": self.read_only}

    def _identity(self) -> tuple:
        return (type(self), id(self._data), self.read_only)

    def __repr__(self) -> str:
        return f"MemoryStore(<{len(self._data)} keys>{', read_only=True' if self.read_only else ''})"
