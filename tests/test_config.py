"""``vidcache.config``: what a node directory holds, the settings a cache is built from (and refuses), where the
shared tier is found (arguments, environment, the node's record).  The cache's identity: ``test_identity.py``."""
import json
import os
import pickle

import pytest

from vidcache import keys
from vidcache.config import NODE_FILE, SHARED_LAYOUTS, VERIFY_READS, CacheConfig, NodeLayout, read_node_file
from vidcache.manifest import ENCODINGS
from vidcache.store.fsspec import FsspecStore
from vidcache.store.lmdb import LMDBStore
from vidcache.store.memory import MemoryStore
from vidcache.store.tiered import TieredStore


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv("VIDCACHE_DIR", raising=False)
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)


# --- the node directory ---------------------------------------------------------------------------------
def test_node_layout_names_every_part_under_the_root(tmp_path):
    root = str(tmp_path / "node")
    n = NodeLayout(root)
    parts = {"lmdb_dir": "lmdb", "tmp_dir": "tmp", "frozen_dir": "frozen", "quarantine_dir": "quarantine",
             "node_file": NODE_FILE}
    for attr, name in parts.items():
        assert getattr(n, attr) == os.path.join(root, name), attr
    assert n.lmdb_file == os.path.join(n.lmdb_dir, "data.mdb")
    assert len({getattr(n, a) for a in parts}) == len(parts)          # no two parts share a path


def test_has_local_tier_only_once_lmdb_made_its_file(tmp_path):
    n = NodeLayout(str(tmp_path / "node"))
    assert not n.has_local_tier()
    os.makedirs(n.lmdb_dir)
    assert not n.has_local_tier()                                     # an empty directory is no tier
    LMDBStore(n.lmdb_dir).set_many({"ac/x": b"1"})
    assert n.has_local_tier()


# --- settings ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting,bad,allowed", [
    ("encoding", "lz4", ENCODINGS), ("verify_reads", "sometimes", VERIFY_READS),
    ("shared_layout", "tarball", SHARED_LAYOUTS)])
def test_named_settings_take_their_listed_values_only(tmp_path, setting, bad, allowed):
    for ok in allowed:
        assert getattr(CacheConfig(str(tmp_path), **{setting: ok}), setting) == ok
    with pytest.raises(ValueError, match=f"{setting} must be one of"):
        CacheConfig(str(tmp_path), **{setting: bad})


@pytest.mark.parametrize("budget", [0, -1, -(1 << 40)])
def test_max_local_bytes_must_be_positive_or_none(tmp_path, budget):
    assert CacheConfig(str(tmp_path)).max_local_bytes is None
    assert CacheConfig(str(tmp_path), max_local_bytes=1).max_local_bytes == 1
    with pytest.raises(ValueError, match="max_local_bytes must be a positive"):
        CacheConfig(str(tmp_path), max_local_bytes=budget)


def test_config_pickles_and_keeps_credentials_out_of_equality(tmp_path):
    c = CacheConfig(str(tmp_path), shared="s3://b/p", shared_storage_options={"secret": "s"}, encoding="zlib",
                    verify_reads="always", max_local_bytes=1 << 20, shared_layout="raw")
    again = pickle.loads(pickle.dumps(c))
    assert again == c and again.shared_storage_options == {"secret": "s"}
    assert "secret" not in repr(c)
    assert c.replace(encoding="raw") != c and c.replace(encoding="raw").encoding == "raw"
    with pytest.raises(ValueError):
        c.replace(verify_reads="no")                                   # replace validates too


# --- where the shared tier is found -----------------------------------------------------------------------
def test_resolve_records_the_shared_tier_without_credentials(tmp_path, no_env):
    node = tmp_path / "node"
    c = CacheConfig.resolve(node, shared="s3://bucket/vc",
                            shared_storage_options={"endpoint_url": "http://x", "secret": "s", "key": "k"})
    assert c.path == str(node) and c.shared == "s3://bucket/vc"
    rec = json.loads((node / NODE_FILE).read_text())
    assert rec["shared"] == "s3://bucket/vc" and rec["shared_storage_options"] == {"endpoint_url": "http://x"}
    assert CacheConfig.resolve(node).shared == "s3://bucket/vc"        # a later command on the node finds it


def test_resolve_prefers_arguments_then_environment_then_the_record(tmp_path, no_env, monkeypatch):
    node = tmp_path / "node"
    CacheConfig.resolve(node, shared="/nfs/recorded")
    monkeypatch.setenv("VIDCACHE_SHARED", "/nfs/from-env")
    assert CacheConfig.resolve(node).shared == "/nfs/from-env"
    assert CacheConfig.resolve(node, shared="/nfs/given", read_only=True).shared == "/nfs/given"
    assert read_node_file(str(node))["shared"] == "/nfs/recorded"      # read-only: nothing written
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "env-dir"))
    assert CacheConfig.resolve().path == str(tmp_path / "env-dir")
    assert CacheConfig.resolve(tmp_path / "given").path == str(tmp_path / "given")


def test_a_damaged_node_record_reads_as_empty(tmp_path):
    (tmp_path / NODE_FILE).write_bytes(b"\xff{not json")
    assert read_node_file(str(tmp_path)) == {}
    (tmp_path / NODE_FILE).write_text("[1, 2]")
    assert read_node_file(str(tmp_path)) == {}
    assert read_node_file(str(tmp_path / "absent")) == {}


# --- the tiers a configuration assembles ------------------------------------------------------------------
def test_build_store_assembles_the_tiers(tmp_path):
    alone = CacheConfig(str(tmp_path / "a")).build_store(check=None)
    assert isinstance(alone, LMDBStore) and alone.path == os.path.join(str(tmp_path / "a"), "lmdb")
    tiered = CacheConfig(str(tmp_path / "b"), shared=str(tmp_path / "nfs")).build_store(check=None)
    assert isinstance(tiered, TieredStore) and isinstance(tiered.shared, FsspecStore)
    assert isinstance(tiered.local, LMDBStore) and tiered.local_only == keys.LOCAL_ONLY
    custom = MemoryStore()
    assert CacheConfig(str(tmp_path / "c"), shared="/x", store=custom).build_store(check=None) is custom


def test_a_read_only_fresh_node_creates_nothing(tmp_path):
    node = tmp_path / "fresh"
    s = CacheConfig(str(node), shared=str(tmp_path / "nfs"), read_only=True).build_store(check=None)
    assert s.read_only and isinstance(s.local, MemoryStore) and s.local.read_only
    assert not node.exists()
