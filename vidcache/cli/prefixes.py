"""Keys as a person gives them: the shortest prefixes ``ls`` prints, and a prefix completed back to the one
entry key it starts (``inspect``, ``evict``), as git abbreviates and completes object names."""
from __future__ import annotations

import os
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")


def key_stem(given: str) -> str | None:
    """``given`` without the ``..`` that `vidcache ls` prints, when it is a key or a prefix of one; else None."""
    from .. import keys as k
    stem = given[:-2] if given.endswith("..") else given
    return stem if k.is_key_prefix(stem) else None


def full_key(cache, given: str) -> str:
    """``given`` as a whole entry key: a key as it is, or a prefix of one (``vidcache ls`` prints 16 hex digits
    and ``..``) completed over the entries of every tier, as git completes object names: refused when no entry or
    more than one starts with it."""
    from .. import keys as k
    from ..errors import InvalidKeyError
    stem = key_stem(given)
    if stem is None:
        k.check_key(given)               # the usual "not a vidcache key" error
    if k.is_key(stem):
        return stem
    found = [e for e in cache.entries() if e.startswith(stem)]   # every tier's, merged in key order
    if len(found) == 1:
        return found[0]
    if not found:
        raise InvalidKeyError(f"no cached entry's key starts with {stem!r}")
    raise InvalidKeyError(f"{stem!r} is ambiguous: {len(found)} entries start with it ({', '.join(found[:4])}"
                          f"{', ...' if len(found) > 4 else ''}); give more of the key")


MIN_PREFIX = 16      # hex digits `ls` shows at least (git's core.abbrev, for 128-bit digests)


def streamed_prefixes(items: Iterable[T], key: Callable[[T], str] = lambda k: k,
                      minimum: int = MIN_PREFIX) -> Iterator[tuple[T, str]]:
    """Each item with its key's shortest prefix that no other key shares, at least ``minimum`` characters (git's
    rule for abbreviated object names), never ending on a ``.``: what ``inspect`` and ``evict`` complete back.
    The keys come sorted and distinct; each item is passed on with one item of look-ahead: in key order a key's
    shortest unique prefix depends on its two neighbours only, so a listing of any size is abbreviated without
    holding it (issue 50)."""
    it = iter(items)
    prev, cur = None, next(it, _NONE)
    while cur is not _NONE:
        nxt = next(it, _NONE)
        k = key(cur)
        common = max((len(os.path.commonprefix([k, o])) for o in (prev, None if nxt is _NONE else key(nxt))
                      if o is not None), default=0)
        n = min(len(k), max(minimum, common + 1))
        while n < len(k) and k[n - 1] == ".":
            n += 1
        yield cur, k[:n]
        prev, cur = k, nxt


_NONE = object()
