"""Read-through tiers: a fast local store (LMDB) in front of a durable shared one.

Reads try the local tier first and backfill it on a shared hit; writes go to
the shared tier first (durable, visible to every node), then the local one.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Mapping

from .base import Store


class TieredStore(Store):
    supports_atomic_batches = False

    def __init__(self, local: Store, shared: Store, *, read_only: bool = False) -> None:
        super().__init__(read_only=read_only)
        self.local, self.shared = local, shared

    def get(self, key: str) -> bytes | None:
        v = self.local.get(key)
        if v is None:
            v = self.shared.get(key)
            if v is not None and not key.startswith("src/") and not self.local.read_only:
                self.local.set_many({key: v})        # backfill; src/ records are node-local hints
        return v

    @contextlib.contextmanager
    def read(self, key: str) -> Iterator[memoryview | None]:
        if not self.local.exists_many([key])[0]:
            self.get(key)
        with self.local.read(key) as v:
            if v is not None:
                yield v
                return
        v = self.shared.get(key)
        yield None if v is None else memoryview(v)

    def exists_many(self, keys) -> list[bool]:
        keys = list(keys)
        found = self.local.exists_many(keys)
        missing = [k for k, f in zip(keys, found) if not f]
        if missing:
            remote = dict(zip(missing, self.shared.exists_many(missing)))
            found = [f or remote.get(k, False) for k, f in zip(keys, found)]
        return found

    def set_many(self, items: Mapping[str, bytes]) -> None:
        self._check_writable()
        self.shared.set_many(items)
        self.local.set_many(items)

    def keys(self, prefix: str = "") -> Iterator[str]:
        return iter(sorted(set(self.local.keys(prefix)) | set(self.shared.keys(prefix))))

    def delete(self, key: str) -> None:
        self._check_writable()
        self.local.delete(key)
        self.shared.delete(key)

    def close(self) -> None:
        self.local.close()
        self.shared.close()

    def stats(self) -> dict:
        return {"local": self.local.stats(), "shared": self.shared.stats()}

    def __eq__(self, other) -> bool:
        return isinstance(other, TieredStore) and (self.local, self.shared) == (other.local, other.shared)

    def __hash__(self) -> int:
        return hash((self.local, self.shared))

    def __repr__(self) -> str:
        return f"TieredStore({self.local!r}, {self.shared!r})"
