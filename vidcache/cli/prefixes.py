"""Keys as a person gives them: the shortest prefixes ``ls`` prints, and a prefix completed back to the one
entry key it starts (``inspect``, ``evict``), as git abbreviates and completes object names."""
from __future__ import annotations

import os


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


def unique_prefixes(all_keys: list[str], minimum: int = MIN_PREFIX) -> dict[str, str]:
    """Each key's shortest prefix that no other key shares, at least ``minimum`` characters (git's rule for
    abbreviated object names), never ending on a ``.``: what ``inspect`` and ``evict`` complete back."""
    ks = sorted(set(all_keys))
    out = {}
    for i, key in enumerate(ks):
        common = max((len(os.path.commonprefix([key, o])) for o in (ks[i - 1:i] + ks[i + 1:i + 2])), default=0)
        n = min(len(key), max(minimum, common + 1))
        while n < len(key) and key[n - 1] == ".":
            n += 1
        out[key] = key[:n]
    return out
