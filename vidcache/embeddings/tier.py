"""The embedding tier: a node-local LMDB of its own in front of the cluster's shared tier (``emb/`` objects).

The store layer is the frames' (``LMDBStore``, ``TieredStore``, the shared ``FsspecStore``); only the namespace
and the budget are the tier's own:
  * **its own LMDB and budget** (``<node dir>/embeddings``, ``max_bytes``): embeddings are 1.5-2x an entry's frames,
    so they must never evict frames, nor frames them.  Eviction is LMDB's LRU, as for frames (``gc``);
  * **the same integrity rules**: a value is its record behind its own digest (``record.seal``), checked on every
    read and on every pull before it is served or backfilled (``integrity.check_object``); a bad copy is moved
    aside (``quarantine/``) and the read runs once more, so a sound copy in the other tier serves; a write is one
    LMDB transaction / one published object, so nothing partial is ever visible;
  * **a key names what computed it**: another weights digest, dtype or code is another ``emb/`` name, a miss;
    a record whose bytes claim another key is refused (``CorruptEntryError``) and moved aside.
  * **off unless asked**: nothing opens this tier (or creates its directory) but the code that asks for it
    (``vidcache embed``, a trainer that reads embeddings).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import keys
from ..errors import CorruptEntryError
from ..integrity import check_object, is_sound, quarantine
from .record import EmbeddingKey, VisionEmbeddings, seal, unseal

if TYPE_CHECKING:
    from ..cache import VideoCache
    from ..store.base import Store


class EmbeddingTier:
    """The embeddings of ``cache``'s node (its node directory) and of its shared tier, if it has one."""

    def __init__(self, cache: "VideoCache", *, max_bytes: int | None = None) -> None:
        self.cache = cache
        self.read_only = cache.read_only
        self.local: Store = _local_store(cache, max_bytes)
        self.shared: Store | None = cache.shared          # the same shared tier (and connection) as the frames
        if self.shared is None:
            self.store: Store = self.local
        else:
            from ..store.tiered import TieredStore
            self.store = TieredStore(self.local, self.shared, check=check_object, read_only=self.read_only)

    def __repr__(self) -> str:
        return f"EmbeddingTier({self.cache!r})"

    @property
    def tiers(self) -> list[tuple[str, "Store"]]:
        return [("local", self.local)] + ([("shared", self.shared)] if self.shared is not None else [])

    # --- read, write ------------------------------------------------------------------------
    def get(self, key: EmbeddingKey) -> VisionEmbeddings | None:
        """``key``'s embeddings, checked; None when no tier holds them (a fresh node pulls them from the shared
        tier and keeps a local copy).  A bad copy is moved aside and the read runs once more; a copy that stays
        bad (a read-only node cannot move it) raises ``CorruptEntryError``, never serves."""
        sk = keys.emb(key.id)
        for attempt in range(2):
            try:
                # A view of the local copy (LMDB's memory map; a pull is checked before its copy is kept): the
                # digest is checked over it and each tensor copied out of it once, inside the read.
                with self.store.read(sk) as view:
                    if view is None:
                        return None
                    return VisionEmbeddings.from_bytes(unseal(view), expect=key)   # the digest, then the key
            except CorruptEntryError:
                if attempt or self.read_only:
                    raise
                quarantine([t for _, t in self.tiers], sk)
        raise AssertionError("unreachable")

    def put(self, emb: VisionEmbeddings) -> int:
        """Store ``emb`` (shared tier first, then this node's); the bytes stored."""
        value = seal(emb.to_bytes())
        self.store.set_many({keys.emb(emb.key.id): value})
        return len(value)

    def contains(self, wanted: list[EmbeddingKey]) -> list[bool]:
        return self.store.exists_many([keys.emb(k.id) for k in wanted])

    def ids(self, shared: bool = False) -> list[str]:
        """The ids held locally (``shared``: in the shared tier)."""
        tier = self.shared if shared else self.local
        return [] if tier is None else [k[len(keys.EMB):] for k in tier.keys(keys.EMB)]

    # --- verify and repair, budget ------------------------------------------------------------
    def verify(self, ids: list[str] | None = None, repair: bool = False, shared: bool = False) -> dict[str, list[str]]:
        """Check every copy of ``ids`` (default: every record of this node, and of the shared tier with
        ``shared``); ``{id: problems}`` (empty: sound).  ``repair`` moves bad copies aside and restores them
        from a sound copy in the other tier."""
        todo = ids if ids is not None else sorted(set(self.ids()) | (set(self.ids(True)) if shared else set()))
        out = {}
        for emb_id in todo:
            sk = keys.emb(emb_id)
            values = {name: tier.get(sk) for name, tier in self.tiers}
            bad = [name for name, v in values.items() if v is not None and not is_sound(sk, v)]
            problems = [f"{name} copy fails its check" for name in bad]
            if repair and bad:
                quarantine([t for _, t in self.tiers], sk)
                sound = next((v for name, v in values.items() if v is not None and name not in bad), None)
                if sound is not None:
                    for name, tier in self.tiers:
                        if name in bad:
                            tier.set_many({sk: sound})
            out[emb_id] = problems
        return out

    def gc(self, max_bytes: int) -> dict:
        """Evict least-recently-used local records down to ``max_bytes`` (the shared tier is never touched)."""
        return self.local.gc(max_bytes)

    def stats(self) -> dict:
        n, nbytes = 0, 0
        for k in self.local.keys(keys.EMB):
            n += 1
            nbytes += self.local.size(k) or 0
        return {"records": n, "bytes": nbytes}

    def close(self) -> None:
        self.local.close()


def _local_store(cache: "VideoCache", max_bytes: int | None) -> "Store":
    import os

    from ..store.lmdb import LMDBStore
    path = cache.layout.embeddings_dir
    if cache.read_only and not os.path.isdir(path):
        # A read-only node that never made the tier reads through to the shared tier and creates nothing.
        from ..store.memory import MemoryStore
        return MemoryStore(read_only=True)
    return LMDBStore(path, read_only=cache.read_only, max_bytes=max_bytes)
