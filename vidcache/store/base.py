"""The abstract store: a small bytes key/value interface with capability flags.

Keys live in three namespaces, borrowing Bazel's vocabulary:
  ``cas/<digest>``  frame blobs, addressed by the digest of their bytes
  ``ac/<key>``      manifests (the "action cache"), addressed by the cache key
  ``src/<id>``      source records: source -> content digest, with validators

Callers (``VideoCache``) write blobs before the manifest that names them, in
one ``set_many`` call; a store that can, makes the call atomic.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Iterable, Iterator, Mapping

from ..errors import ReadOnlyStoreError


class Store(ABC):
    supports_atomic_batches: bool = False
    supports_deletes: bool = True
    supports_listing: bool = True

    def __init__(self, *, read_only: bool = False) -> None:
        self.read_only = read_only

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The value, or None when absent."""

    @contextlib.contextmanager
    def read(self, key: str) -> Iterator[memoryview | None]:
        """A view of the value, valid inside the ``with`` block.  Backends that can, make it zero-copy."""
        value = self.get(key)
        yield None if value is None else memoryview(value)

    @abstractmethod
    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Write all items, in order; atomic where ``supports_atomic_batches``."""

    def exists_many(self, keys: Iterable[str]) -> list[bool]:
        return [self.get(k) is not None for k in keys]

    @abstractmethod
    def keys(self, prefix: str = "") -> Iterator[str]:
        ...

    @abstractmethod
    def delete(self, key: str) -> None:
        ...

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass

    def _check_writable(self) -> None:
        if self.read_only:
            raise ReadOnlyStoreError(f"{self!r} is read-only")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
