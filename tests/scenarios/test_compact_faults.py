"""The compact tier under faults (issue 27): never a wrong byte, never a hang, never a lost entry.

Each fault is made on a directory tier (the NFS stand-in) and met by a *fresh* node's first read, which streams
the object (``store/prefetch``).  Counted over every fault: reads served corrupt, reads that outlived the tier's
timeout, entries lost (not readable exactly after the repair the fault calls for).  All three must be 0; an S3
stream cut off part-way is tests/test_shared_layout.py's, the full local disk tests/test_shared_layout.py's and
an upgrade killed mid-way tests/test_shared_layout.py's too.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import time

import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.digest import Digest
from vidcache.errors import DigestMismatchError, NotCachedError, SharedUnavailableError
from vidcache.store.fsspec import FsspecStore

from support.damage import flip_file

TIMEOUT_S = 60.0         # the tier's default bound on one transfer (store/fsspec.DEFAULT_TIMEOUT_S)


@pytest.fixture
def tier(node_a, tmp_path, videos):
    a = node_a.cache
    (k,) = node_a.build("h264_30")
    other = a.ensure(videos["mjpeg_24"], VideoOptions()).key
    return a, k, other, a.frames(k)


def _object(a, key) -> str:
    return a.shared._path(a.compact.key(key))          # where the directory tier keeps frozen/<key>.nut


def _truncate(a, k, other):
    p = _object(a, k)
    data = open(p, "rb").read()
    open(p, "wb").write(data[:len(data) // 2])


def _other_entrys_object(a, k, other):
    open(_object(a, k), "wb").write(open(_object(a, other), "rb").read())


def _flip(a, k, other):
    p = _object(a, k)
    flip_file(p, os.path.getsize(p) * 2 // 3, bit=0x40)


FAULTS = {"truncated": _truncate, "another entry's valid object": _other_entrys_object, "a flipped byte": _flip}


def test_faults_of_the_object_are_never_served_and_a_repair_restores_every_entry(tmp_path, tier):
    a, k, other, want = tier
    served_corrupt = hangs = lost = 0
    for i, (name, fault) in enumerate(FAULTS.items()):
        fault(a, k, other)
        b = VideoCache(tmp_path / f"fresh{i}", shared=str(tmp_path / "tier"))
        t = time.monotonic()
        try:
            got = b.frames(k)
            served_corrupt += not torch.equal(got, want)
        except (DigestMismatchError, NotCachedError) as e:     # refused by name: the object was moved aside
            assert k in str(e), (name, e)
        hangs += time.monotonic() - t > TIMEOUT_S
        assert not b.shared.exists_many([b.compact.key(k)])[0] or b.verify(k) == [], name
        a.verify(k, repair=True)                               # node A still holds the frames: republished
        fresh = VideoCache(tmp_path / f"after{i}", shared=str(tmp_path / "tier"))
        lost += not torch.equal(fresh.frames(k), want)
    assert (served_corrupt, hangs, lost) == (0, 0, 0)


def test_an_object_that_decodes_exactly_but_is_not_its_recorded_bytes_is_served_and_replaced(tmp_path, tier,
                                                                                              caplog):
    """A flipped byte can fall where PyAV conceals it: a CI run once read exact frames from such an object,
    and the damaged object stayed in the tier.  It is damaged all the same (SGLang's decoder, reading it by
    URL, may conceal it otherwise), so the read serves the exact frames, moves the object aside (never
    deleted) and puts a sound one in its place.  Made here by a record of other bytes: what the read sees of
    such damage, wherever the flip falls."""
    a, k, other, want = tier
    obj = a.compact.key(k)
    before = a.shared.get(obj)
    a.shared.set_many({K.frozen_digest(k, a.compact.suffix()): str(Digest.of(b"other bytes")).encode()})
    b = VideoCache(tmp_path / "b", shared=str(tmp_path / "tier"))
    assert b.verify(k) != []                                        # the tier is damaged before the read
    with caplog.at_level(logging.WARNING, logger="vidcache"):
        assert torch.equal(b.frames(k), want)
    assert f"decodes to entry {k}'s frames but hashes to" in caplog.text and "moved aside, replaced" in caplog.text
    b.sync()                                                        # the replacement runs on the writer thread
    assert b.shared.get(K.quarantined(obj)) == before               # moved aside, not lost
    assert b.verify(k) == []                                        # the object now in place is its record's
    assert torch.equal(VideoCache(tmp_path / "c", shared=str(tmp_path / "tier")).frames(k), want)


_REPUBLISH_CHILD = r"""
import os, sys, time
from vidcache import VideoCache
from vidcache import frozen_file
node, tier, key, flag = sys.argv[1:]
real = frozen_file.write_frozen
def slow(*args, **kwargs):
    out = real(*args, **kwargs)             # the re-encode done and verified: the swap is next
    open(flag, "w").close()
    time.sleep(600)                         # killed here (and anywhere before)
    return out
frozen_file.write_frozen = slow
c = VideoCache(node, shared=tier)
c.frames(key)
c.sync()
"""


def _damage_record(a, k) -> None:
    """A record of other bytes: what a read sees of damage its decoder concealed (or junk appended)."""
    a.shared.set_many({K.frozen_digest(k, a.compact.suffix()): str(Digest.of(b"other bytes")).encode()})


def test_a_reader_killed_during_the_republish_of_an_exactly_decoding_object_loses_nothing(tmp_path, tier):
    """D42: the reader moved the object aside and deleted it, then spent seconds re-encoding; a kill -9 then left
    the tier without the entry (5/10), and readers meanwhile got ``NotCachedError`` (16/16).  Now the old object
    stays in place until a verified replacement takes it over in one step: kill -9 during the republish, and
    both a reader meanwhile and a fresh node afterwards read the exact frames."""
    import signal
    import subprocess
    import sys
    a, k, other, want = tier
    _damage_record(a, k)
    before = a.shared.get(a.compact.key(k))
    flag = tmp_path / "encoded"
    child = subprocess.Popen([sys.executable, "-c", _REPUBLISH_CHILD, str(tmp_path / "killed"),
                              str(tmp_path / "tier"), k, str(flag)], env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        deadline = time.monotonic() + 300
        while not flag.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the reader never reached the republish"
            time.sleep(0.05)
        meanwhile = VideoCache(tmp_path / "meanwhile", shared=str(tmp_path / "tier"))
        assert torch.equal(meanwhile.frames(k), want)        # a reader during the republish: served
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert a.shared.get(a.compact.key(k)) == before          # the old object, still in place
    fresh = VideoCache(tmp_path / "after", shared=str(tmp_path / "tier"))
    assert torch.equal(fresh.frames(k), want)                # and the entry readable on every node
    fresh.sync()
    assert fresh.verify(k) == []                             # this reader (compact layout) replaced it


def test_a_raw_layout_node_leaves_an_exactly_decoding_object_in_place_and_reports_it(tmp_path, tier, caplog):
    """D42 (a): a writable node with ``shared_layout="raw"`` moved the object aside and never republished (2/2):
    the entry was gone for every node.  It does not write the compact layout, so it leaves the object and says so."""
    a, k, other, want = tier
    _damage_record(a, k)
    before = a.shared.get(a.compact.key(k))
    raw = VideoCache(tmp_path / "raw", shared=str(tmp_path / "tier"), shared_layout="raw")
    with caplog.at_level(logging.WARNING, logger="vidcache"):
        assert torch.equal(raw.frames(k), want)
    raw.sync()
    assert a.shared.get(a.compact.key(k)) == before          # neither deleted nor replaced
    assert not a.shared.exists_many([K.quarantined(a.compact.key(k))])[0]
    assert "left in place" in caplog.text and k in caplog.text
    assert torch.equal(VideoCache(tmp_path / "fresh", shared=str(tmp_path / "tier")).frames(k), want)


def test_a_fetch_cut_off_after_the_frames_decoded_exactly_is_served_and_the_object_kept(tmp_path, tier,
                                                                                        monkeypatch):
    """Every byte came and the frames decoded exactly, then the transfer failed (a connection reset at the end):
    the frames are proven, so the read is served; the bytes cannot be judged against the record, so the object,
    sound, is left where it is (neither moved aside nor taken for damaged)."""
    a, k, other, want = tier
    real = FsspecStore.stream

    def reset_at_the_end(self, key, sink):
        found = real(self, key, sink)
        if found and key.endswith(".nut"):
            raise SharedUnavailableError("shared tier: connection reset after the last byte")
        return found
    monkeypatch.setattr(FsspecStore, "stream", reset_at_the_end)
    b = VideoCache(tmp_path / "b", shared=str(tmp_path / "tier"))
    assert torch.equal(b.frames(k), want)
    monkeypatch.undo()
    assert b.shared.exists_many([b.compact.key(k), K.quarantined(b.compact.key(k))]) == [True, False]
    assert b.verify(k) == []


def test_an_object_deleted_mid_read_is_read_whole_or_refused(tmp_path, tier, monkeypatch):
    """The object unlinked after the first half was handed over: the open file still reads whole (POSIX), so the
    read is exact; nothing half-read is kept."""
    a, k, other, want = tier
    real = FsspecStore.stream

    def deleting(self, key, sink):
        pieces = []
        found = real(self, key, pieces.append)
        if found and key.endswith(".nut"):
            os.unlink(_object(a, k))                          # gone from the tier between two pieces
        for p in pieces:
            sink(p)
        return found
    monkeypatch.setattr(FsspecStore, "stream", deleting)
    b = VideoCache(tmp_path / "b", shared=str(tmp_path / "tier"))
    try:
        assert torch.equal(b.frames(k), want)
    except (SharedUnavailableError, NotCachedError):
        assert not b.local.exists_many([K.cas(b.manifest(k).frames.blob)])[0]


def _read(node: str, tier: str, key: str, out) -> None:
    c = VideoCache(node, shared=tier)
    f = c.frames(key)
    c.close()
    out.put(bytes(f.numpy().tobytes()))


def test_three_processes_of_a_fresh_node_read_one_compact_entry_at_once(tmp_path, tier):
    a, k, other, want = tier
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_read, args=(str(tmp_path / "fresh"), str(tmp_path / "tier"), k, q)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [q.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert all(g == want.numpy().tobytes() for g in got)
    fresh = VideoCache(tmp_path / "fresh", shared=str(tmp_path / "tier"))
    assert fresh.verify(k) == [] and torch.equal(fresh.frames(k), want)      # the node's local tier is sound
