"""``vidcache.node``: one cache per (directory, shared tier) per process, the node's own from the environment,
and the lookup by identity that never opens a path a caller names."""
from __future__ import annotations

import os

import pytest

from vidcache import VideoCache, node
from vidcache.errors import TierMismatchError


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.setattr(node, "_OPEN", {})


def test_open_cache_is_one_per_directory_and_shared_tier(tmp_path):
    a = node.open_cache(tmp_path / "a", shared=str(tmp_path / "tier"))
    assert node.open_cache(str(tmp_path / "a"), shared=str(tmp_path / "tier")) is a     # same place, same cache
    assert node.open_cache(tmp_path / "b", shared=str(tmp_path / "tier")) is not a
    c = node.open_cache(tmp_path / "c", shared=str(tmp_path / "other"))
    assert c is not a and node.open_cache(tmp_path / "c", shared=str(tmp_path / "other")) is c
    other = node.open_cache(tmp_path / "a", shared=str(tmp_path / "tier"), read_only=True)
    assert other is not a and other.read_only                       # other settings: a cache of its own


def test_node_cache_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "n1"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    n1 = node.node_cache()
    assert node.node_cache() is n1 and node.open_cache() is n1 and n1.path == str(tmp_path / "n1")
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "n2"))
    assert node.node_cache() is not n1


def test_a_forked_child_opens_its_own_cache(tmp_path):
    """LMDB forbids using an environment across fork: the registry is keyed by pid."""
    parent = node.open_cache(tmp_path / "a")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child: report whether it got the parent's object
        os.close(r)
        os.write(w, b"same" if node.open_cache(tmp_path / "a") is parent else b"own")
        os._exit(0)
    os.close(w)
    said = os.read(r, 16)
    os.waitpid(pid, 0)
    assert said == b"own"


def test_cache_for_finds_a_registered_cache_and_refuses_a_foreign_identity(tmp_path, monkeypatch):
    c = VideoCache(tmp_path / "a")
    assert node.cache_for(c.identity) is c
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "empty"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    with pytest.raises(TierMismatchError, match="no cache at"):
        node.cache_for("local-0123456789abcdef")
    assert not (tmp_path / "empty").exists()          # nothing created to say so
