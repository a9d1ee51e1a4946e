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


def test_keys_merge_the_tiers_listings_instead_of_holding_them(tmp_path):
    """Issue 50: the tiers' union was two sets of names and a sorted copy, built before the first name (``stats``
    behind a directory tier of 10^5 entries held all three).  Each tier lists in key order, so the union is a merge:
    the first name costs a page of the local walk (traced allocations, 30,000 local names: the sets alone took
    megabytes), and the walk is every name of either tier, in order, once."""
    from support.traced import first_and_peak
    local, shared = LMDBStore(tmp_path / "l"), MemoryStore()
    n = 30_000
    local.set_many({f"ac/{i:06d}": b"m" for i in range(0, n, 2)} | {"cas/0": b"b"})
    shared.set_many({f"ac/{i:06d}": b"m" for i in range(0, n, 3)} | {"src/0": b"s"})
    t = TieredStore(local, shared)
    first, it, peak = first_and_peak(lambda: t.keys("ac/"))
    assert first == "ac/000000"
    assert peak < 1 << 20, f"the first name of a {n}-name union cost {peak} traced bytes"
    assert [first, *it] == [f"ac/{i:06d}" for i in range(n) if i % 2 == 0 or i % 3 == 0]
    assert list(t.keys()) == sorted(set(local.keys()) | set(shared.keys()))


def test_keys_fail_when_the_shared_tier_cannot_be_listed(tmp_path):
    """The merge is lazy, but the shared tier's listing is made when ``keys`` is called: a tier that cannot be
    listed fails the call (where callers such as ``ls`` catch a tier that is down), not a later step of the walk."""
    class Down(MemoryStore):
        def keys(self, prefix=""):
            raise ConnectionError("tier down")
    t = TieredStore(LMDBStore(tmp_path / "l"), Down())
    with pytest.raises(ConnectionError, match="tier down"):
        t.keys("ac/")
