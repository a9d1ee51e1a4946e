"""``vidcache.reads``: the read path as one object.  Its one rule for a bad copy (move it aside, read once more, a
second failure is final), a read that queues a damaged object's replacement rather than encode it, the pull
question asked once per read, and the bound on its memos.  (The cache's reads through it, corruption and repair
included, are tests/test_cache.py's, tests/test_corruption.py's and tests/test_shared_*.py's.)"""
from __future__ import annotations

import threading
import time

import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache import reads as reads_mod
from vidcache.compact import CompactLayout, Republish
from vidcache.digest import Digest
from vidcache.errors import DigestMismatchError, NotCachedError
from vidcache.reads import MEMO_BOUND, Memo, ReadPath
from vidcache.store.single_flight import SingleFlight


def _flip(store, key, at=500):
    raw = bytearray(store.get(key))
    raw[at] ^= 0x10
    store.set_many({key: bytes(raw)})


@pytest.fixture
def counted(monkeypatch):
    """Every attempt of a blob read, and every quarantine, in order."""
    attempts, moved = [], []
    real_open, real_quarantine = ReadPath._open, ReadPath.quarantine
    monkeypatch.setattr(ReadPath, "_open", lambda self, m, *a: attempts.append(m.key) or real_open(self, m, *a))
    monkeypatch.setattr(ReadPath, "quarantine", lambda self, k: moved.append(k) or real_quarantine(self, k))
    return attempts, moved


def test_a_bad_local_copy_is_moved_aside_and_read_once_more_from_the_shared_tier(tmp_path, videos, counted):
    attempts, moved = counted
    a = VideoCache(tmp_path / "a", shared=str(tmp_path / "tier"), shared_layout="raw")
    key = a.ensure(videos["mjpeg_24"], VideoOptions()).key
    want = a.frames(key)
    a.sync()
    blob_key = K.cas(a.manifest(key).frames.blob)
    _flip(a.local, blob_key)
    b = VideoCache(tmp_path / "a", shared=str(tmp_path / "tier"))      # nothing verified in this process yet
    attempts.clear()
    assert torch.equal(b.frames(key), want)                             # the sound shared copy serves
    assert attempts == [key, key] and moved == [blob_key]               # one retry, after one quarantine
    assert b.local.get(K.quarantined(blob_key)) is not None            # the bad copy kept aside


def test_a_second_bad_read_is_final_not_a_third_try(tmp_path, videos, monkeypatch):
    c = VideoCache(tmp_path / "c")
    key = c.ensure(videos["mjpeg_24"], VideoOptions()).key
    _flip(c.local, K.cas(c.manifest(key).frames.blob))
    c = VideoCache(tmp_path / "c")
    attempts, moved = [], []
    real_open = ReadPath._open
    monkeypatch.setattr(ReadPath, "_open", lambda self, m, *a: attempts.append(m.key) or real_open(self, m, *a))
    monkeypatch.setattr(ReadPath, "quarantine", lambda self, k: moved.append(k))     # a move that leaves it there
    with pytest.raises(DigestMismatchError, match=key):
        c.frames(key)
    assert len(attempts) == 2 and len(moved) == 2


def test_a_retry_that_finds_nothing_raises_the_corruption_and_a_later_miss_names_it(tmp_path, videos, counted):
    attempts, moved = counted
    c = VideoCache(tmp_path / "c")
    key = c.ensure(videos["mjpeg_24"], VideoOptions()).key
    _flip(c.local, K.cas(c.manifest(key).frames.blob))
    c = VideoCache(tmp_path / "c")
    attempts.clear()
    with pytest.raises(DigestMismatchError, match=key):       # not "not cached": every copy there was is bad
        c.frames(key)
    assert len(attempts) == 2 and len(moved) == 1
    with pytest.raises(NotCachedError, match="quarantined a corrupt copy"):
        c.frames(key)


def test_a_bad_local_manifest_is_moved_aside_and_the_shared_one_serves(tmp_path, videos, counted):
    _, moved = counted
    a = VideoCache(tmp_path / "a", shared=str(tmp_path / "tier"))
    key = a.ensure(videos["mjpeg_24"], VideoOptions()).key
    want = a.manifest(key)
    a.local.set_many({K.ac(key): b"{not json"})
    b = VideoCache(tmp_path / "a", shared=str(tmp_path / "tier"))
    assert b.reads.manifest(key) == want
    assert moved == [K.ac(key)] and b.local.get(K.quarantined(K.ac(key))) == b"{not json"


def test_a_read_queues_a_damaged_objects_replacement_for_the_writer_and_never_encodes(tmp_path, videos, monkeypatch):
    a = VideoCache(tmp_path / "a", shared=str(tmp_path / "tier"))
    key = a.ensure(videos["mjpeg_24"], VideoOptions()).key
    want = a.frames(key)
    obj = a.compact.key(key)
    before = a.shared.get(obj)
    # A record of other bytes: what a read sees of damage its decoder concealed.
    a.shared.set_many({K.frozen_digest(key, a.compact.suffix()): str(Digest.of(b"other bytes")).encode()})
    encoded_on, queued = [], []
    real_encode, real_submit = CompactLayout._encode, Republish.submit

    def encode(self, k, frames):
        encoded_on.append(threading.current_thread().name)
        time.sleep(0.5)                     # long enough that only a drain of the queue sees its end
        return real_encode(self, k, frames)
    monkeypatch.setattr(CompactLayout, "_encode", encode)
    monkeypatch.setattr(Republish, "submit", lambda self, k, job: queued.append(k) or real_submit(self, k, job))
    b = VideoCache(tmp_path / "b", shared=str(tmp_path / "tier"))
    assert torch.equal(b.frames(key), want)                      # served: the frames are exact
    assert queued == [key]
    b.reads.settle()
    assert encoded_on and all(n.startswith("vidcache-republish") for n in encoded_on), encoded_on
    assert b.shared.get(K.quarantined(obj)) == before            # the writer moved it aside and replaced it
    assert b.verify(key) == []


def test_a_read_asks_once_whether_this_node_is_pulling_the_entry(tmp_path, videos, monkeypatch):
    a = VideoCache(tmp_path / "a", shared=str(tmp_path / "tier"))
    key = a.ensure(videos["mjpeg_24"], VideoOptions()).key
    want = a.frames(key)
    asked = []
    # As if another process of this node had been pulling it: the read waited, and must not wait again.
    monkeypatch.setattr(SingleFlight, "wait", lambda self, k, timeout_s: asked.append(k) or True)
    b = VideoCache(tmp_path / "b", shared=str(tmp_path / "tier"))
    assert torch.equal(b.frames(key), want)
    assert asked == [key]


def test_a_memo_holds_at_most_its_bound():
    memo = Memo()
    for i in range(MEMO_BOUND + 10):
        memo.put(str(i), i)
        assert len(memo) <= MEMO_BOUND
    assert memo.get(str(MEMO_BOUND + 9)) == MEMO_BOUND + 9      # the newest fact is always kept
    memo.drop(str(MEMO_BOUND + 9))
    assert memo.get(str(MEMO_BOUND + 9)) is None


def test_the_read_paths_memos_are_bounded(tmp_path, videos, monkeypatch):
    c = VideoCache(tmp_path / "c")
    ks = [c.ensure(videos[n], VideoOptions()).key for n in ("mjpeg_24", "h264_30")]
    monkeypatch.setattr(reads_mod, "MEMO_BOUND", 1)
    c = VideoCache(tmp_path / "c")
    for k in ks:
        assert c.manifest(k) is not None
    assert len(c.reads._manifests) == 1
    for k in ks:
        _flip(c.local, K.cas(c.manifest(k).frames.blob))
        with pytest.raises(DigestMismatchError):
            c.frames(k)
    assert len(c.reads._moved_aside) == 1
