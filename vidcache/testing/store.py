"""``StoreContract``: the tests every store tier must pass.  Subclass it per backend.

A subclass provides a ``store`` fixture (a fresh, writable store) and
``raw_get`` (read a value bypassing the store's own methods, where possible).
"""
from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vidcache.errors import ReadOnlyStoreError


class StoreContract:
    def raw_get(self, store, key: str) -> bytes | None:
        return store.get(key)

    def test_absent_is_none(self, store):
        assert store.get("ac/missing") is None
        with store.read("ac/missing") as v:
            assert v is None

    def test_round_trip_and_batch(self, store):
        store.set_many({"cas/a": b"", "cas/b": b"x" * (3 << 20), "ac/k": b'{"m":1}'})
        assert store.get("cas/a") == b""
        assert self.raw_get(store, "cas/b") == b"x" * (3 << 20)
        with store.read("cas/b") as v:
            assert bytes(v[:4]) == b"xxxx" and len(v) == 3 << 20
        assert store.exists_many(["cas/a", "cas/z", "ac/k"]) == [True, False, True]

    def test_keys_by_prefix(self, store):
        store.set_many({"ac/1": b"1", "ac/2": b"2", "cas/1": b"3", "src/1": b"4"})
        assert list(store.keys("ac/")) == ["ac/1", "ac/2"]
        assert sorted(store.keys()) == ["ac/1", "ac/2", "cas/1", "src/1"]

    def test_delete(self, store):
        if not store.supports_deletes:
            pytest.skip("store does not support deletes")
        store.set_many({"ac/1": b"1"})
        store.delete("ac/1")
        assert store.get("ac/1") is None

    def test_read_only_refuses_writes(self, store, read_only_store):
        store.set_many({"ac/1": b"1"})
        ro = read_only_store(store)
        assert ro.get("ac/1") == b"1"
        with pytest.raises(ReadOnlyStoreError):
            ro.set_many({"ac/2": b"2"})

    def test_behaves_like_a_dict(self, store):
        model: dict = {}

        @settings(max_examples=25, deadline=None)
        @given(st.dictionaries(st.from_regex(r"(ac|cas|src)/[a-z0-9]{1,12}", fullmatch=True),
                               st.binary(max_size=512), max_size=12))
        def check(items):
            # Content-addressed namespaces never see different bytes under one key; src/ records may change.
            items = {k: (v if k.startswith("src/") else k.encode() * 3) for k, v in items.items()}
            store.set_many(items)
            model.update(items)
            for k, v in model.items():
                assert store.get(k) == v
            assert sorted(store.keys()) == sorted(model)

        check()


class PicklableStoreContract(StoreContract):
    def test_pickle_round_trip(self, store):
        store.set_many({"ac/p": b"v"})
        again = pickle.loads(pickle.dumps(store))
        assert again == store
        assert again.get("ac/p") == b"v"
