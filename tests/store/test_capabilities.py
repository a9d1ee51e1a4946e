"""Every store's declared capabilities (``Store.supports_*``, ``timeout_s``, ``tiers()``) against what it does:
one class, as zarr's ``StoreTests``, run on every store the package has, writable and opened read-only.  A caller
branches on these declarations instead of probing a store's type or attributes, so a declaration that is not
the store's behaviour is a bug here."""
import os
import time
import uuid
from urllib.parse import unquote, urlparse

import pytest

from vidcache import errors
from vidcache.errors import ReadOnlyStoreError
from vidcache.store import FsspecStore, LMDBStore, MemoryStore, Store, TieredStore
from vidcache.store.base import CAPABILITIES

NAMESPACES = ("ac/", "cas/", "frozen/")


def _memory(tmp_path):
    return MemoryStore()


def _lmdb(tmp_path):
    return LMDBStore(tmp_path / "db", map_size=1 << 20)


def _directory(tmp_path):
    return FsspecStore(str(tmp_path / "shared"))


def _fsspec_memory(tmp_path):
    return FsspecStore(f"memory://caps-{uuid.uuid4().hex}")


def _tiered(tmp_path):
    return TieredStore(LMDBStore(tmp_path / "local"), MemoryStore(), local_only=("src/",))


def _tiered_directory(tmp_path):
    return TieredStore(LMDBStore(tmp_path / "local"), FsspecStore(str(tmp_path / "shared")))


STORES = {"memory": _memory, "lmdb": _lmdb, "directory": _directory, "fsspec-memory": _fsspec_memory,
          "tiered": _tiered, "tiered-directory": _tiered_directory}
# What each store must declare: the values are part of its contract, not only their agreement with behaviour.
DECLARED = {
    "memory": dict(supports_urls=False, supports_usage=False, supports_partial_sweep=False, tiered=False),
    "lmdb": dict(supports_urls=False, supports_usage=False, supports_partial_sweep=False, tiered=False),
    "directory": dict(supports_urls=True, supports_usage=True, supports_partial_sweep=True, tiered=False),
    # a generic fsspec filesystem: no URLs, and no partial files to sweep (only a directory's publish leaves them)
    "fsspec-memory": dict(supports_urls=False, supports_usage=True, supports_partial_sweep=False, tiered=False),
    "tiered": dict(supports_urls=False, supports_usage=False, supports_partial_sweep=False, tiered=True),
    "tiered-directory": dict(supports_urls=True, supports_usage=False, supports_partial_sweep=False, tiered=True),
}


@pytest.fixture(params=[(name, ro) for name in STORES for ro in (False, True)],
                ids=lambda p: p[0] + ("-read-only" if p[1] else ""))
def case(request, tmp_path):
    """(name, writable store, the store under test: the writable one or its read-only opening)."""
    name, read_only = request.param
    writable = STORES[name](tmp_path)
    yield name, writable, writable.with_read_only() if read_only else writable
    writable.close()


class TestCapabilities:
    def test_every_capability_is_declared_as_a_bool(self, case):
        name, _, store = case
        for cap in CAPABILITIES:
            assert isinstance(getattr(store, cap), bool), (name, cap)
        want = DECLARED[name]
        assert {c: getattr(store, c) for c in want if c != "tiered"} == {c: v for c, v in want.items() if c != "tiered"}
        assert store.supports_writes and store.supports_deletes and store.supports_listing   # every store here
        assert store.timeout_s is None or (isinstance(store.timeout_s, float) and store.timeout_s > 0)

    def test_a_read_only_opening_keeps_the_backend_s_capabilities(self, case):
        _, writable, store = case
        assert [getattr(store, c) for c in CAPABILITIES] == [getattr(writable, c) for c in CAPABILITIES]
        assert store.timeout_s == writable.timeout_s

    def test_writes_as_declared(self, case):
        _, writable, store = case
        assert store.supports_writes
        if not store.read_only:
            store.set_many({"ac/w": b"1"})
            assert store.set_if_not_exists("cas/w", b"2") is True
            assert writable.get("ac/w") == b"1" and writable.get("cas/w") == b"2"
            return
        writable.set_many({"ac/kept": b"kept"})
        for write in (lambda: store.set_many({"ac/w": b"1"}), lambda: store.set_if_not_exists("cas/w", b"2"),
                      lambda: store.set_many_staged({"ac/s": b"3"}, lambda: None), lambda: store.delete("ac/kept")):
            with pytest.raises(ReadOnlyStoreError):
                write()
        assert writable.exists_many(["ac/w", "cas/w", "ac/s", "ac/kept"]) == [False, False, False, True]

    def test_deletes_as_declared(self, case):
        _, writable, store = case
        assert store.supports_deletes
        writable.set_many({"ac/d": b"1"})
        if store.read_only:
            with pytest.raises(ReadOnlyStoreError):
                store.delete("ac/d")
            assert writable.get("ac/d") == b"1"
        else:
            store.delete("ac/d")
            store.delete("ac/never-there")
            assert store.get("ac/d") is None and writable.get("ac/d") is None

    def test_listing_as_declared(self, case):
        _, writable, store = case
        assert store.supports_listing
        writable.set_many({"cas/2": b"b", "ac/1": b"a", "cas/1": b"c"})
        assert list(store.keys("cas/")) == ["cas/1", "cas/2"]
        assert list(store.keys()) == ["ac/1", "cas/1", "cas/2"]

    def test_urls_as_declared(self, case):
        _, writable, store = case
        writable.set_many({"frozen/k.nut": b"frames"})
        if not store.supports_urls:
            with pytest.raises(NotImplementedError):
                store.url_for("frozen/k.nut")
            return
        url = store.url_for("frozen/k.nut")
        assert urlparse(url).scheme == "file"           # the only URL medium here; S3's: test_shared_tier.py
        with open(unquote(urlparse(url).path), "rb") as f:
            assert f.read() == b"frames"

    def test_usage_as_declared(self, case):
        _, writable, store = case
        writable.set_many({"ac/1": b"a", "cas/1": b"bb", "cas/2": b"ccc"})
        if not store.supports_usage:
            with pytest.raises(NotImplementedError):
                store.usage()
            return
        u = store.usage()
        assert u["objects"] == {ns.rstrip("/"): n for ns in NAMESPACES if (n := len(list(store.keys(ns))))}
        assert u["bytes"] == 6 and u["partial_files"] == 0

    def test_partial_sweep_as_declared(self, case):
        _, writable, store = case
        if not store.supports_partial_sweep:
            with pytest.raises(NotImplementedError):
                store.sweep_partials()
            return
        if store.read_only:
            with pytest.raises(ReadOnlyStoreError):
                store.sweep_partials()
            return
        writable.set_many({"cas/k": b"kept"})
        local = urlparse(writable.url).scheme in ("", "file")
        if local:       # a writer killed mid-publish leaves its temporary file beside the object
            partial = os.path.join(os.path.dirname(writable._path("cas/k")), ".x.1234.partial")
            with open(partial, "wb") as f:
                f.write(b"half")
            os.utime(partial, (time.time() - 7200,) * 2)
        swept = store.sweep_partials()
        assert swept == {"partial_files_removed": int(local), "partial_bytes_removed": 4 * int(local)}
        assert store.get("cas/k") == b"kept" and list(store.keys()) == ["cas/k"]

    def test_tiers_as_declared(self, case):
        name, writable, store = case
        local, shared = store.tiers()
        if not DECLARED[name]["tiered"]:
            assert local is store and shared is None
            return
        assert isinstance(local, Store) and isinstance(shared, Store)
        assert (local.read_only, shared.read_only) == (store.read_only,) * 2
        writable.set_many({"cas/t": b"both", "src/n": b"node"})         # src/: local-only in "tiered"
        assert local.get("cas/t") == b"both" and shared.get("cas/t") == b"both"
        assert shared.get("src/n") is None if name == "tiered" else shared.get("src/n") == b"node"

    def test_sync_is_a_checkpoint_every_store_takes(self, case):
        _, writable, store = case
        writable.set_many({"ac/s": b"durable"})
        assert store.sync() is None
        assert store.get("ac/s") == b"durable"

    def test_a_local_copy_failure_is_forgiven_only_in_front_of_a_shared_tier(self, case, monkeypatch):
        # The tiered store warns once per process for a full disk: a set of its own here, so the warning a later
        # test counts (tests/test_shared_layout.py, D20) is not spent by this one.
        monkeypatch.setattr(errors, "_WARNED", set())
        name, _, store = case
        full = OSError(28, os.strerror(28))           # ENOSPC
        assert store.local_copy_failed(full, 1) is DECLARED[name]["tiered"]
        assert store.local_copy_failed(ValueError("not space"), 1) is False
