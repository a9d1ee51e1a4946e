"""``vidcache.store.tiered``: the local tier in front of the shared one, under the store contract (as seen in the
shared medium), backfill, local-only prefixes, checked pulls."""
import pytest

from vidcache.errors import DigestMismatchError
from vidcache.store.lmdb import LMDBStore
from vidcache.store.memory import MemoryStore
from vidcache.store.tiered import TieredStore
from vidcache.testing.store import StoreContract


class TestTieredStore(StoreContract):
    """Raw access: what is in the *shared* medium (writes must reach it; reads come through it)."""

    @pytest.fixture
    def store(self, tmp_path):
        return TieredStore(LMDBStore(tmp_path / "local"), MemoryStore())

    def raw_get(self, store, key):
        return store.shared._data.get(key)

    def raw_set(self, store, key, value):
        store.shared._data[key] = value
        store.local.delete(key)

    def test_reads_backfill_the_local_tier(self, tmp_path):
        shared = MemoryStore()
        shared.set_many({"cas/x": b"blob", "ac/y": b"manifest"})
        t = TieredStore(LMDBStore(tmp_path / "l"), shared)
        assert t.local.get("cas/x") is None
        with t.read("cas/x") as v:
            assert bytes(v) == b"blob"
        assert t.local.get("cas/x") == b"blob"
        assert t.exists_many(["ac/y", "ac/z"]) == [True, False]

    def test_local_only_prefixes_never_reach_the_shared_tier(self, tmp_path):
        shared = MemoryStore()
        t = TieredStore(LMDBStore(tmp_path / "l"), shared, local_only=("src/",))
        t.set_many({"src/a": b"node hint", "cas/b": b"blob"})
        assert "src/a" not in shared._data and shared._data["cas/b"] == b"blob"
        assert t.get("src/a") == b"node hint"

    def test_checked_pulls_never_serve_or_backfill_bad_bytes(self, tmp_path):
        def check(key, value):
            if value == b"bad":
                raise DigestMismatchError(key)
        shared = MemoryStore({"cas/x": b"bad"})
        t = TieredStore(LMDBStore(tmp_path / "l"), shared, check=check)
        with pytest.raises(DigestMismatchError):
            t.get("cas/x")
        assert t.local.get("cas/x") is None
