"""A first read's local copy commits behind the read (vidcache/store/backfill.py).

The commit is held open by a gate in these tests, so each property is shown while the write is in flight:
the read has returned, the caller's buffer is its own, a second read waits instead of pulling again,
``close`` waits, and a forked child does not wait on its parent's writer.
"""
from __future__ import annotations

import json
import os
import threading

import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.store.lmdb import LMDBStore

from support.cli import run_cli


@pytest.fixture
def held_commit(monkeypatch):
    """Hold every blob commit of the local LMDB tier until ``release`` is set; ``staged`` is set once the
    values are in the transaction (the point where the reader is let go)."""
    staged_seen, release = threading.Event(), threading.Event()
    orig = LMDBStore.set_many_staged

    def gated(self, items, staged):
        if staged is None or not any(k.startswith(K.CAS) for k in items):
            return orig(self, items, staged)

        def hold():
            staged()
            staged_seen.set()
            assert release.wait(60), "the test never released the commit"
        return orig(self, items, hold)
    monkeypatch.setattr(LMDBStore, "set_many_staged", gated)
    yield staged_seen, release
    release.set()


@pytest.fixture
def entry(node_a, tmp_path, videos):
    tier, a = node_a.tier, node_a.cache
    (k,) = node_a.build("h264_30")
    return tier, k, a.frames(k)


def test_a_first_read_returns_before_its_commit_and_the_callers_writes_never_reach_the_copy(
        tmp_path, entry, held_commit):
    tier, k, want = entry
    staged_seen, release = held_commit
    b = VideoCache(tmp_path / "b", shared=str(tier))
    got = b.frames(k)                                           # returns while the commit is held
    assert staged_seen.is_set() and not release.is_set()
    blob = K.cas(b.manifest(k).frames.blob)
    assert LMDBStore(b.local.path).get(blob) is None            # not committed yet: another reader sees nothing
    assert torch.equal(got, want)
    got.fill_(7)                                                # the caller's buffer, while the commit waits
    release.set()
    b.close()                                                   # waits for the commit
    alone = VideoCache(tmp_path / "b")                          # this node's copy alone, no shared tier
    assert torch.equal(alone.frames(k), want)                   # the frames, not the caller's 7s
    assert alone.verify(k) == []


def test_a_second_read_waits_for_the_commit_in_flight_instead_of_pulling_again(tmp_path, entry, held_commit,
                                                                                monkeypatch):
    tier, k, want = entry
    staged_seen, release = held_commit
    b = VideoCache(tmp_path / "b", shared=str(tier))
    pulls = []
    get, stream = type(b.shared).get, type(b.shared).stream
    monkeypatch.setattr(type(b.shared), "get", lambda self, key: pulls.append(key) or get(self, key))
    monkeypatch.setattr(type(b.shared), "stream", lambda self, key, sink: pulls.append(key) or stream(self, key, sink))
    b.frames(k)
    compact_pulls = pulls.count(b.compact.key(k))
    assert compact_pulls == 1
    second = []
    t = threading.Thread(target=lambda: second.append(b.frames(k)))
    t.start()
    t.join(0.5)
    assert t.is_alive() and second == []                        # waiting on the commit, not pulling
    release.set()
    t.join(60)
    assert torch.equal(second[0], want)
    assert pulls.count(b.compact.key(k)) == compact_pulls       # the compact object was fetched once
    b.close()


def test_a_forked_child_does_not_wait_on_its_parents_commit(tmp_path, entry, held_commit):
    tier, k, want = entry
    staged_seen, release = held_commit
    b = VideoCache(tmp_path / "b", shared=str(tier))
    b.frames(k)
    pid = os.fork()
    if pid == 0:                       # the child: no writer of the parent's to wait for
        code = 1
        try:
            b._backfill.drain()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    release.set()
    b.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_a_reader_that_exits_without_closing_leaves_its_local_copy_committed(tmp_path, videos):
    """As a cluster runs it, on fresh node directories with only VIDCACHE_DIR + VIDCACHE_SHARED: node A
    prewarms into the shared tier (CLI); on node B a trainer-like process reads the entry and exits without
    ``close()`` (its commit was still behind the read); then node B's CLI `verify` finds the copy in node B's
    own tier, sound, with the shared tier gone."""
    tier, a, b = tmp_path / "tier", tmp_path / "nodeA", tmp_path / "nodeB"
    ds = tmp_path / "ds.jsonl"
    ds.write_text(json.dumps({"prompt": "<video> what happens?", "videos": [videos["h264_30"]]}) + "\n")

    def run(args, node, shared=tier, code=None):
        r = run_cli(args, node, shared, code=code)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout
    run(["prewarm", str(ds)], a)
    key = json.loads(run(["ls", "--json"], a))[0]["key"]
    read = f"import vidcache; print(tuple(vidcache.open_cache().frames({key!r}).shape))"
    shape = run([], b, code=read)                               # exits right after the read, no close()
    os.rename(tier, tmp_path / "tier-gone")                     # node B on its own now
    out = run(["verify", key], b, shared=None)
    assert "verify: 1 ok, 0 bad" in out, out
    os.rename(tmp_path / "tier-gone", tier)
    st = json.loads(run(["stats", "--json"], b))
    assert st["local"] == {"entries": 1, "blobs": 1}, st                  # the frames, not only the manifest
    assert json.loads(run(["ls", "--json"], b))[0]["frames"] == int(shape.strip("()\n").split(",")[0])


def test_close_stops_the_writer_thread_and_a_later_read_starts_another(tmp_path, entry):
    tier, k, want = entry
    writers = lambda: [t for t in threading.enumerate() if t.name.startswith("vidcache-backfill")]  # noqa: E731
    before = len(writers())
    b = VideoCache(tmp_path / "b", shared=str(tier))
    b.frames(k)
    assert len(writers()) == before + 1
    b.close()
    assert len(writers()) == before                             # no idle thread per closed cache
    c = VideoCache(tmp_path / "c", shared=str(tier))
    assert torch.equal(c.frames(k), want)
    c.close()
    assert torch.equal(VideoCache(tmp_path / "c").frames(k), want)   # committed by the writer close waited for
