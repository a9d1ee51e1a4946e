"""The abstract store: bytes under string keys, nothing more.

Stores know bytes and keys, never what a key means (``vidcache.keys`` does);
policy such as "these prefixes stay on the node" is handed in by the cache.
Modelled on zarr-python v3's store layer: a miss is ``None``, capabilities are
data (``supports_*``, ``timeout_s``, ``tiers()``: declared by each store, so a
caller asks the store, never its type or its attributes), ``with_read_only()``
returns a new store, ``set_if_not_exists`` publishes without overwriting, and
a store is a value: its type, where its data is and
``read_only`` make its ``==``, ``hash`` and ``repr``, all derived here from the
constructor arguments it gives (``_args``), as are ``with_read_only`` and, for
stores that reopen where they are unpickled, pickling.
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Callable, Iterable, Iterator, Mapping

from ..errors import ReadOnlyStoreError
from .publish import PARTIAL_MAX_AGE_S


# The capabilities every store declares (tests/store/test_capabilities.py holds each store to its word).
CAPABILITIES = ("supports_writes", "supports_deletes", "supports_listing", "supports_urls", "supports_usage",
                "supports_partial_sweep")


class _Enough(Exception):
    """``get_bounded``'s sink has the bytes it wants: the stream stops here."""


class Store(ABC):
    # --- capabilities ---------------------------------------------------------------------------------
    # Of the backend, not of this opening: a store that supports writes, opened ``read_only``, refuses them
    # (``ReadOnlyStoreError``) and still says it supports them.  The first three every store must declare.
    @property
    @abstractmethod
    def supports_writes(self) -> bool:
        """``set_many``, ``set_if_not_exists``."""

    @property
    @abstractmethod
    def supports_deletes(self) -> bool:
        """``delete``."""

    @property
    @abstractmethod
    def supports_listing(self) -> bool:
        """``keys(prefix)``."""

    # Can give a URL that another machine can read the value from (see ``url_for``).
    supports_urls: bool = False
    # Can count its objects and bytes per namespace from one listing (see ``usage``).
    supports_usage: bool = False
    # Writers killed mid-publish may leave partial objects that ``sweep_partials`` removes.
    supports_partial_sweep: bool = False
    # The most one call on one object may take, for a store on the other side of a network; None: a store
    # with no bound of its own (its medium is this machine's).
    timeout_s: float | None = None
    # The ``_args()`` that say where the data is (a path, a URL): with the type and ``read_only`` they are the
    # store's identity (==, hash) and what its repr shows.  A store naming none is equal only to itself.
    _location: tuple[str, ...] = ()
    # True: pickled as ``_args()`` and rebuilt by the constructor where it is unpickled, so no open handle (an
    # LMDB environment, an fsspec filesystem) crosses a process.  False: pickled as its attributes.
    _pickle_args: bool = False

    def __init__(self, *, read_only: bool = False) -> None:
        self.read_only = read_only

    @abstractmethod
    def get(self, key: str) -> bytes | None:
        """The value, or None when absent."""

    def stream(self, key: str, sink: Callable[[bytes], None]) -> bool:
        """Hand ``key``'s value to ``sink`` in pieces, in order, as they arrive, so that a consumer can begin
        before the end (a first read decodes while the object downloads); False when absent.  This default
        hands over the whole value at once; remote stores override it."""
        value = self.get(key)
        if value is None:
            return False
        sink(value)
        return True

    def get_bounded(self, key: str, limit: int) -> tuple[bytes | None, bool]:
        """At most the first ``limit`` bytes of ``key``'s value, and whether it holds more; (None, False) when
        absent.  Through ``stream``, which stops once the bound is passed: a value grown far past what its writer
        wrote (D59: a 2 GiB object of a 1.3 MB entry) costs ``limit`` bytes, not its size."""
        got, more = bytearray(), [False]

        def sink(piece: bytes) -> None:
            room = limit - len(got)
            got.extend(piece[:room])
            if len(piece) > room:
                more[0] = True
                raise _Enough

        try:
            if not self.stream(key, sink):
                return None, False
        except _Enough:
            pass
        return bytes(got), more[0]

    @contextlib.contextmanager
    def read(self, key: str) -> Iterator[memoryview | None]:
        """A view of the value, valid inside the ``with`` block.  Backends that can, make it zero-copy."""
        value = self.get(key)
        yield None if value is None else memoryview(value)

    @abstractmethod
    def set_many(self, items: Mapping[str, bytes]) -> None:
        """Write all items in order, replacing existing values.  One transaction where the backend has them."""

    def set_many_staged(self, items: Mapping[str, bytes], staged: Callable[[], None]) -> None:
        """``set_many``, calling ``staged()`` as soon as the write no longer needs the values' buffers, so
        that a caller may hand them on while the write finishes.  This default calls it after the write;
        LMDB calls it once the values are copied into the transaction, before the commit."""
        self.set_many(items)
        staged()

    def set_if_not_exists(self, key: str, value: bytes) -> bool:
        """Write ``value`` unless ``key`` exists; True if this call wrote it.

        This default is exists-then-set and NOT safe for concurrent writers; backends
        that can publish exclusively override it.
        """
        self._check_writable()
        if self.exists_many([key])[0]:
            return False
        self.set_many({key: value})
        return True

    def exists_many(self, keys: Iterable[str]) -> list[bool]:
        return [self.get(k) is not None for k in keys]

    @abstractmethod
    def keys(self, prefix: str = "") -> Iterator[str]:
        """Every key starting with ``prefix``, sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; absent keys are not an error."""

    def size(self, key: str) -> int | None:
        """Bytes stored under ``key``, or None when absent."""
        with self.read(key) as v:
            return None if v is None else len(v)

    def url_for(self, key: str, expires_s: float | None = None) -> str:
        """A URL another machine can fetch the value from (``supports_urls`` stores only)."""
        raise NotImplementedError(f"{type(self).__name__} cannot hand out URLs")

    def usage(self) -> dict:
        """Objects per namespace (``objects``) and bytes, from one listing (``supports_usage`` stores only)."""
        raise NotImplementedError(f"{type(self).__name__} does not count its usage in one listing")

    def sweep_partials(self, older_than_s: float = PARTIAL_MAX_AGE_S) -> dict:
        """Remove partial objects older than ``older_than_s`` (``supports_partial_sweep`` stores only)."""
        raise NotImplementedError(f"{type(self).__name__} leaves no partial objects")

    def tiers(self) -> tuple["Store", "Store | None"]:
        """(the node-local tier, the shared tier behind it).  A single store is its own local tier, with none
        behind it; a store in front of another (``TieredStore``) names both."""
        return self, None

    def local_copy_failed(self, exc: BaseException, nbytes: int) -> bool:
        """Whether a failed local copy of a value the shared tier holds costs only the copy (``exc`` is then
        not raised).  A store with no tier behind it holds no such copies: never."""
        return False

    def sync(self) -> None:
        """A durability checkpoint: what was written before it survives a crash.  This default has nothing
        to do (the store's writes are durable when they return, or it keeps nothing across a crash); LMDB,
        which commits without fsync, overrides it."""

    def with_read_only(self, read_only: bool = True) -> "Store":
        """The same store, opened read-only (or writable)."""
        return type(self)(**{**self._args(), "read_only": read_only})

    def stats(self) -> dict:
        return {}

    def close(self) -> None:
        pass

    def _check_writable(self) -> None:
        if self.read_only or not self.supports_writes:
            raise ReadOnlyStoreError(f"{self!r} is read-only")

    # --- value semantics, from _args() -------------------------------------------------------
    def _args(self) -> dict:
        """The constructor's arguments by name, ``read_only`` included: ``type(self)(**self._args())`` opens
        this store again."""
        raise NotImplementedError(f"{type(self).__name__} does not give its constructor arguments (_args)")

    def _identity(self) -> tuple | None:
        """What ``==`` and ``hash`` compare; None: only the object itself."""
        if not self._location:
            return None
        args = self._args()
        return (type(self), *(args[n] for n in self._location), self.read_only)

    def __eq__(self, other) -> bool:
        mine = self._identity()
        if mine is None:
            return self is other
        return isinstance(other, Store) and mine == other._identity()

    def __hash__(self) -> int:
        mine = self._identity()
        return id(self) if mine is None else hash(mine)

    def __repr__(self) -> str:
        if not self._location:
            return object.__repr__(self)
        args = self._args()
        shown = [repr(args[n]) for n in self._location] + (["read_only=True"] if self.read_only else [])
        return f"{type(self).__name__}({', '.join(shown)})"

    def __getstate__(self) -> dict:
        return self._args() if self._pickle_args else self.__dict__

    def __setstate__(self, state: dict) -> None:
        if self._pickle_args:
            self.__init__(**state)
        else:
            self.__dict__.update(state)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
