"""``vidcache.store.single_flight``: one fetch per key per node, and a lock that can never fail a read.

A node directory whose lock files cannot be opened (the local disk out of inodes, ``locks`` a file, a stripe a
directory or a symlink) still serves every sound shared entry, unlocked (D43); a planted symlink creates nothing
outside the node directory; a holder outwaited once is not waited for again (D47)."""
import errno
import fcntl
import os
import shutil

import pytest
import torch
import xxhash

from vidcache import VideoCache, VideoOptions
from vidcache.store import single_flight


@pytest.fixture
def tier(node_a, tmp_path, videos):
    a = node_a.cache
    ks = node_a.build("h264_30", "mjpeg_24")
    return str(tmp_path / "tier"), ks, [a.frames(k) for k in ks]


def _stripe_path(node, key) -> str:
    stripe = xxhash.xxh3_64_intdigest(key.encode()) % single_flight.STRIPES
    return os.path.join(node, "locks", f"{stripe:04d}.lock")


def _locks_a_file(node, key):
    os.makedirs(node, exist_ok=True)
    open(os.path.join(node, "locks"), "w").close()


def _stripe_a_directory(node, key):
    os.makedirs(_stripe_path(node, key))


SABOTAGE = {"locks is a file": _locks_a_file, "a stripe is a directory": _stripe_a_directory}


@pytest.mark.parametrize("name", list(SABOTAGE))
def test_a_lock_that_cannot_be_opened_never_fails_a_read(tmp_path, tier, name):
    """D43: 4/4 reads raised ``FileExistsError`` / ``IsADirectoryError`` (raw ``OSError``s, not a VidcacheError)."""
    url, ks, want = tier
    node = str(tmp_path / "b")
    for k in ks:
        SABOTAGE[name](node, k)
    b = VideoCache(node, shared=url)
    for k, w in zip(ks, want):
        assert torch.equal(b.frames(k), w), name
    c = VideoCache(str(tmp_path / "c"), shared=url)
    for k in ks:
        SABOTAGE[name](str(tmp_path / "c"), k)
        assert c.bring_local(k) is True                          # read-ahead's pull, unlocked
    assert [torch.equal(c.frames(k), w) for k, w in zip(ks, want)] == [True, True]


def test_a_full_local_disk_still_serves(tmp_path, tier, monkeypatch):
    """D43 / D20: with the local filesystem's inodes exhausted, opening a lock file fails with ENOSPC (a tmpfs with
    ``nr_inodes=64`` in the probe; made here by refusing the lock file's creation, since mounting needs root)."""
    url, ks, want = tier
    real = os.open

    def no_inodes(path, flags, *args, **kwargs):
        if str(path).endswith(".lock") and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, "No space left on device", path)
        return real(path, flags, *args, **kwargs)
    monkeypatch.setattr(single_flight.os, "open", no_inodes)
    b = VideoCache(str(tmp_path / "b"), shared=url)
    assert [torch.equal(b.frames(k), w) for k, w in zip(ks, want)] == [True, True]


def test_a_symlinked_stripe_is_not_followed(tmp_path, tier):
    """D43: ``O_CREAT`` followed a symlink at a stripe's name and created its target outside the node directory."""
    url, ks, want = tier
    node = tmp_path / "b"
    outside = tmp_path / "outside"
    outside.mkdir()
    os.makedirs(node / "locks")
    for i, k in enumerate(ks):
        os.symlink(outside / f"planted{i}", _stripe_path(str(node), k))
    b = VideoCache(str(node), shared=url)
    assert [torch.equal(b.frames(k), w) for k, w in zip(ks, want)] == [True, True]
    assert os.listdir(outside) == []                             # nothing created where the links point


def test_locks_removed_during_reads_never_fail_one(tmp_path, tier, monkeypatch):
    """D43: ``locks/`` rmtree'd in a loop failed 1/75 reads with ``FileNotFoundError`` (between makedirs and open).
    Made deterministic here: the directory goes each time, right after it is made."""
    url, ks, want = tier
    node = str(tmp_path / "b")
    real = os.makedirs

    def made_then_removed(path, *a, **kw):
        real(path, *a, **kw)
        if str(path).endswith("locks"):
            shutil.rmtree(path)
    monkeypatch.setattr(single_flight.os, "makedirs", made_then_removed)
    b = VideoCache(node, shared=url)
    assert [torch.equal(b.frames(k), w) for k, w in zip(ks, want)] == [True, True]


def test_a_stuck_holder_is_outwaited_once_not_per_read(tmp_path, tier, monkeypatch):
    """D47: a live holder that never commits was outwaited twice per read (``_manifest_for_read``, then ``_blob``),
    and again by every later read on its stripe: 240 s for a documented 120 s.  Counted here in waits that ran out,
    not in seconds: with every key on one stripe, two reads outwait the holder once."""
    url, ks, want = tier
    monkeypatch.setenv("VIDCACHE_SHARED_TIMEOUT_S", "0.5")
    monkeypatch.setattr(single_flight, "STRIPES", 1)
    node = str(tmp_path / "b")
    os.makedirs(os.path.join(node, "locks"))
    holder = os.open(_stripe_path(node, ks[0]), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(holder, fcntl.LOCK_EX)                          # a puller of this node that is alive but stuck
    outwaited = []
    real = single_flight._lock

    def counting(fd, timeout_s):
        held = real(fd, timeout_s)
        if not held and timeout_s > 0:
            outwaited.append(timeout_s)
        return held
    monkeypatch.setattr(single_flight, "_lock", counting)
    try:
        b = VideoCache(node, shared=url)
        assert [torch.equal(b.frames(k), w) for k, w in zip(ks, want)] == [True, True]
    finally:
        os.close(holder)
    assert len(outwaited) == 1, outwaited
