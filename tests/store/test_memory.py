"""``vidcache.store.memory``: the dict-backed reference store, under the store contract."""
import pytest

from vidcache.errors import ReadOnlyStoreError
from vidcache.store.memory import MemoryStore
from vidcache.testing.store import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self):
        return MemoryStore()

    def raw_get(self, store, key):
        return store._data.get(key)

    def raw_set(self, store, key, value):
        store._data[key] = value

    def test_read_only_copy_sees_later_writes(self, store):
        ro = store.with_read_only()
        store.set_many({"ac/late": b"1"})           # one dict under both: a view, not a snapshot
        assert ro.get("ac/late") == b"1" and list(ro.keys()) == ["ac/late"]
        assert ro.with_read_only(False).set_if_not_exists("ac/other", b"2") and store.get("ac/other") == b"2"

    def test_values_are_copied_in(self, store):
        buf = bytearray(b"abc")
        store.set_many({"cas/m": buf})
        assert store.set_if_not_exists("cas/n", memoryview(buf)) is True
        buf[0] = ord("z")                            # the caller's buffer changes afterwards
        assert store.get("cas/m") == b"abc" and store.get("cas/n") == b"abc"
        assert type(store.get("cas/m")) is bytes


def test_starts_from_the_dict_it_is_given():
    data = {"ac/a": b"1"}
    s = MemoryStore(data, read_only=True)
    assert s.get("ac/a") == b"1" and s.read_only
    with pytest.raises(ReadOnlyStoreError):
        s.set_if_not_exists("ac/b", b"2")
    assert data == {"ac/a": b"1"}
