"""What a cache holds, as the CLI reports it: one record per entry (``ls``), the counts of each tier (``stats``),
the options a source is cached under (a helpful miss in ``inspect``), and the sources recorded for a content
digest (what a repair rebuilds from).  Read-only summaries over a ``VideoCache``'s stores and manifests."""
from __future__ import annotations

import contextlib
import heapq
import itertools
from operator import itemgetter
from typing import TYPE_CHECKING, Iterable, Iterator, Protocol

from . import keys
from .digest import Digest
from .errors import VidcacheError
from .loader.tmpdirs import tmp_bytes
from .manifest import SourceRecord

if TYPE_CHECKING:
    from .config import CacheConfig
    from .manifest import Manifest
    from .store.base import Store


class Cache(Protocol):
    """What these summaries read of a ``VideoCache``: named here, so this module sits below ``cache.py`` (which
    calls it) instead of beside it."""
    @property
    def path(self) -> str: ...

    @property
    def identity(self) -> str: ...

    @property
    def tmp_dir(self) -> str: ...

    @property
    def config(self) -> "CacheConfig": ...

    @property
    def store(self) -> "Store": ...

    @property
    def local(self) -> "Store": ...

    @property
    def shared(self) -> "Store | None": ...

    def manifest(self, key: str) -> "Manifest | None": ...

    def entries(self) -> list[str]: ...


def sources_by_digest(store: "Store") -> dict[str, list[str]]:
    """Source digest -> the sources recorded for it (``src/`` records of every tier)."""
    out: dict[str, list[str]] = {}
    for k in store.keys(keys.SRC):
        raw = store.get(k)
        if raw is not None and (rec := SourceRecord.from_json(raw)) is not None:
            out.setdefault(str(rec.digest), []).append(rec.source)
    return out


def listing(cache: Cache) -> list[dict]:
    """One record per entry: sources, family, T x H x W, fps, tokens, bytes, and the tiers that hold it."""
    return list(iter_listing(cache))


def tiered_entries(cache: Cache) -> Iterator[tuple[str, list[str]]]:
    """Each entry key once, in key order, with the tiers whose ``ac/`` names hold it; stray names skipped.  The two
    tiers' sorted listings are merged as they are read (issue 50: ``ls`` held both tiers' names in sets, ~1.3 kB an
    entry with its prefix table).  The shared tier's listing is made at the call (LMDB's is read a page at a time
    as the walk goes), so a tier that cannot be listed fails the call, not a later row."""
    tagged = [((n, "local") for n in cache.local.keys(keys.AC))]
    if cache.shared is not None:
        tagged.append(((n, "shared") for n in cache.shared.keys(keys.AC)))
    return _entries(heapq.merge(*tagged))


def _entries(tagged) -> Iterator[tuple[str, list[str]]]:
    for name, group in itertools.groupby(tagged, key=itemgetter(0)):
        try:
            key = keys.entry_key(name)
        except VidcacheError:                           # a stray name: not an entry
            continue
        yield key, [tier for _, tier in group]


def entry_record(cache: Cache, key: str, tiers: list[str], srcs: dict[str, list[str]]) -> dict | None:
    """``listing``'s record of one entry (``srcs``: ``sources_by_digest``), its manifest read now and not kept; None
    for a damaged manifest or one gone since it was listed."""
    m = None
    with contextlib.suppress(VidcacheError):
        m = cache.manifest(key)
    if m is None:
        return None
    t, _, h, w = m.frames.shape
    return {"key": key, "sources": sorted(srcs.get(m.source_digest, [])), "family": m.family,
            "frames": t, "height": h, "width": w, "fps": m.sampling.sample_fps,
            "tokens": m.tokens.video_pad_tokens, "bytes": m.frames.nbytes, "tiers": tiers}


def iter_listing(cache: Cache, entries: "Iterable[tuple[str, list[str]]] | None" = None) -> Iterator[dict]:
    """``listing``'s records one at a time, in key order, each manifest read as its record is made and not kept
    (issue 50: ``ls`` held every manifest and printed nothing until it had read them all).  What stays in memory is
    the sources map.  ``entries``: ``tiered_entries``, if listed already."""
    entries = tiered_entries(cache) if entries is None else entries
    srcs = sources_by_digest(cache.store)
    for key, tiers in entries:
        if (r := entry_record(cache, key, tiers, srcs)) is not None:
            yield r


def options_under(cache: Cache, digest: Digest) -> list[dict]:
    """The options of every entry cached for the content ``digest``."""
    prefix = f"{digest.hash}.{digest.size_bytes}."
    return [m.video_options().to_dict() for key in cache.entries()
            if key.startswith(prefix) and (m := cache.manifest(key)) is not None]


def stats(cache: Cache) -> dict:
    """Entries, blobs, sources, frozen files and quarantined objects of the whole cache and of each tier."""
    def count(store, ns):
        return sum(1 for _ in store.keys(ns))
    out = {"path": cache.path, "identity": cache.identity,
           "entries": count(cache.store, keys.AC), "blobs": count(cache.store, keys.CAS),
           "sources": count(cache.store, keys.SRC), "frozen_files": count(cache.store, keys.FROZEN),
           "quarantined": count(cache.store, keys.QUARANTINE), "tmp_bytes": tmp_bytes(cache.tmp_dir),
           "shared": None, "store": cache.store.stats()}
    # A node alone: its store is its local tier, whose walks were just made (each is O(n) keys; at 10^6 entries,
    # when the LMDB file outgrows the page cache, each is disk-bound: issue 50's scale run).
    out["local"] = ({"entries": out["entries"], "blobs": out["blobs"]} if cache.local is cache.store else
                    {"entries": count(cache.local, keys.AC), "blobs": count(cache.local, keys.CAS)})
    if cache.shared is not None:
        if cache.shared.supports_usage:             # one listing of the tier (S3: one paged LIST)
            u = cache.shared.usage()
            n = u.pop("objects")
        else:
            u, n = {}, {ns.rstrip("/"): count(cache.shared, ns) for ns in (keys.AC, keys.CAS, keys.FROZEN,
                                                                           keys.QUARANTINE)}
        out["shared"] = {"url": cache.config.shared, "entries": n.get("ac", 0), "blobs": n.get("cas", 0),
                         "sources": n.get("src", 0), "frozen_files": n.get("frozen", 0),
                         "quarantined": n.get("quarantine", 0), **u}
    return out
