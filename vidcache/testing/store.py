"""``StoreContract``: the tests every store tier must pass.  Subclass it per backend.

A subclass provides a ``store`` fixture (a fresh, writable store) and two raw
accessors that read and write the *medium* without the store's own methods
(the LMDB file, the directory, the bucket), so the suite checks the store
against the medium, never the store against itself.
"""
from __future__ import annotations

import os
import pickle
from abc import ABC, abstractmethod

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vidcache.errors import ReadOnlyStoreError


class StoreContract(ABC):
    @abstractmethod
    def raw_get(self, store, key: str) -> bytes | None:
        """The bytes under ``key`` in the medium, read without ``store``'s methods (None: absent)."""

    @abstractmethod
    def raw_set(self, store, key: str, value: bytes) -> None:
        """Put ``value`` under ``key`` in the medium without ``store``'s methods."""

    def test_absent_is_none(self, store):
        assert store.get("ac/missing") is None
        with store.read("ac/missing") as v:
            assert v is None
        assert store.size("ac/missing") is None

    def test_writes_reach_the_medium(self, store):
        store.set_many({"cas/a": b"", "cas/b": b"x" * (3 << 20), "ac/k": b'{"m":1}'})
        assert self.raw_get(store, "cas/a") == b""
        assert self.raw_get(store, "cas/b") == b"x" * (3 << 20)
        assert self.raw_get(store, "ac/k") == b'{"m":1}'
        assert self.raw_get(store, "ac/absent") is None

    def test_reads_come_from_the_medium(self, store):
        self.raw_set(store, "cas/r", b"from the medium")
        assert store.get("cas/r") == b"from the medium"
        with store.read("cas/r") as v:
            assert bytes(v) == b"from the medium"
        assert store.exists_many(["cas/r", "cas/z"]) == [True, False]
        assert store.size("cas/r") == len(b"from the medium")

    def test_stream_hands_over_the_medium_s_bytes_in_order(self, store):
        value = os.urandom(3 << 20) + b"tail"          # several of a remote store's pieces
        self.raw_set(store, "cas/s", value)
        self.raw_set(store, "cas/e", b"")
        pieces: list[bytes] = []
        assert store.stream("cas/s", pieces.append) is True and b"".join(pieces) == value
        empty: list[bytes] = []
        assert store.stream("cas/e", empty.append) is True and b"".join(empty) == b""
        assert store.stream("cas/missing", pieces.append) is False

    def test_set_replaces(self, store):
        store.set_many({"src/s": b"old"})
        store.set_many({"src/s": b"new"})
        assert self.raw_get(store, "src/s") == b"new"

    def test_set_if_not_exists_never_replaces(self, store):
        assert store.set_if_not_exists("cas/once", b"first") is True
        assert store.set_if_not_exists("cas/once", b"second") is False
        assert self.raw_get(store, "cas/once") == b"first"

    def test_keys_by_prefix(self, store):
        for k, v in {"ac/1": b"1", "ac/2": b"2", "cas/1": b"3", "src/1": b"4"}.items():
            self.raw_set(store, k, v)
        assert list(store.keys("ac/")) == ["ac/1", "ac/2"]
        assert sorted(store.keys()) == ["ac/1", "ac/2", "cas/1", "src/1"]

    def test_delete(self, store):
        self.raw_set(store, "ac/1", b"1")
        store.delete("ac/1")
        assert self.raw_get(store, "ac/1") is None
        store.delete("ac/never-there")            # absent keys are not an error

    def test_read_only_refuses_writes(self, store):
        self.raw_set(store, "ac/1", b"1")
        ro = store.with_read_only()
        assert ro.read_only and ro.get("ac/1") == b"1"
        with pytest.raises(ReadOnlyStoreError):
            ro.set_many({"ac/2": b"2"})
        with pytest.raises(ReadOnlyStoreError):
            ro.delete("ac/1")
        assert self.raw_get(store, "ac/2") is None and self.raw_get(store, "ac/1") == b"1"

    def test_behaves_like_a_dict(self, store):
        model: dict = {}

        @settings(max_examples=25, deadline=None)
        @given(st.dictionaries(st.from_regex(r"(ac|cas|src)/[a-z0-9]{1,12}", fullmatch=True),
                               st.binary(max_size=512), max_size=12))
        def check(items):
            store.set_many(items)
            model.update(items)
            for k, v in model.items():
                assert self.raw_get(store, k) == v
            assert sorted(store.keys()) == sorted(model)

        check()


class PicklableStoreContract(StoreContract):
    def test_pickle_round_trip(self, store):
        store.set_many({"ac/p": b"v"})
        again = pickle.loads(pickle.dumps(store))
        assert again == store
        assert self.raw_get(again, "ac/p") == b"v" and again.get("ac/p") == b"v"
