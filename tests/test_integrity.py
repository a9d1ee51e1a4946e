"""``vidcache.integrity`` itself: its answers on bytes and stores, with no cache around them (the cache's
behaviour on corrupt copies is tests/test_corruption.py)."""
from __future__ import annotations

import logging
import zlib

import pytest
import torch

from vidcache import VideoOptions, errors, integrity
from vidcache import keys as K
from vidcache.digest import Digest
from vidcache.errors import DigestMismatchError
from vidcache.frozen_file import write_frozen
from vidcache.loader.record import Built, Sampling, Source
from vidcache.manifest import build_manifest
from vidcache.store.memory import MemoryStore

FRAMES = torch.arange(2 * 3 * 32 * 48, dtype=torch.int64).remainder(251).to(torch.uint8).reshape(2, 3, 32, 48)


def _manifest(frames: torch.Tensor, encoding: str = "raw"):
    raw = frames.numpy().tobytes()
    src = Digest.of(b"a source")
    key = K.cache_key(src, VideoOptions())
    t, _, h, w = frames.shape
    built = Built(Source("h264", w, h, t, 2.0, "2/1", t), Sampling(tuple(range(t)), t, 2.0), 1.0)
    return build_manifest(key, src, VideoOptions(), Digest.of(raw), tuple(frames.shape), encoding, built, {}), raw


def test_blob_matches_raw_and_zlib_values_and_nothing_else():
    raw = FRAMES.numpy().tobytes()
    blob = str(Digest.of(raw))
    assert integrity.blob_matches(blob, raw) and integrity.blob_matches(blob, zlib.compress(raw, 1))
    bad = bytearray(raw)
    bad[7] ^= 1
    assert not integrity.blob_matches(blob, bytes(bad)) and not integrity.blob_matches(blob, zlib.compress(bad))


def test_frozen_problem_names_each_way_a_copy_can_be_wrong():
    value = b"frozen bytes"
    assert integrity.frozen_problem(value, str(Digest.of(value)).encode()) is None
    assert integrity.frozen_problem(value, None) == "no recorded digest"
    assert integrity.frozen_problem(value, b"\xff not a digest") == "its recorded digest is damaged"
    other = str(Digest.of(b"other")).encode()
    assert integrity.frozen_problem(value, other).startswith(f"hashes to {Digest.of(value)}")


def test_check_object_refuses_a_blob_whose_bytes_are_not_its_name():
    raw = FRAMES.numpy().tobytes()
    integrity.check_object(K.cas(str(Digest.of(raw))), raw)
    with pytest.raises(DigestMismatchError, match="does not hash to its digest"):
        integrity.check_object(K.cas(str(Digest.of(raw))), raw[:-1] + b"\x00")


def test_quarantine_moves_only_unsound_copies_and_tolerates_a_refusing_tier(caplog, monkeypatch):
    raw = FRAMES.numpy().tobytes()
    key = K.cas(str(Digest.of(raw)))
    good, bad = MemoryStore(), MemoryStore()
    good.set_many({key: raw})
    bad.set_many({key: raw[:-1] + b"\x01"})
    refusing = MemoryStore()
    refusing.set_many({key: raw[:-1] + b"\x02"})
    refusing = refusing.with_read_only()
    monkeypatch.setattr(errors, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="vidcache"):
        integrity.quarantine([refusing, good, bad], key)
    assert good.get(key) == raw                                            # a sound copy stays
    assert bad.get(key) is None and bad.get(K.quarantined(key)) is not None   # a bad one is moved aside
    assert refusing.get(key) is not None                                   # the refusing tier keeps it ...
    assert sum("could not move a corrupt copy aside" in r.getMessage() for r in caplog.records) == 1   # ... said once


def test_compact_frames_accepts_exactly_the_manifests_frames(tmp_path):
    m, raw = _manifest(FRAMES)
    path = str(tmp_path / "x.nut")
    write_frozen(FRAMES, path, "magicyuv")
    value = open(path, "rb").read()
    got, why, trailing = integrity.compact_frames(value, m)
    assert why is None and trailing is None and bytes(got) == raw
    other, _ = _manifest(FRAMES.flip(0))
    got, why, _ = integrity.compact_frames(value, type(m)(**{**m.__dict__, "frames": other.frames}))
    assert got is None and "decodes to frames hashing to" in why


def test_checked_frames_refuses_a_short_or_undecompressable_blob():
    m, raw = _manifest(FRAMES)
    assert bytes(integrity.checked_frames(m, memoryview(raw), verify=True)) == raw
    with pytest.raises(DigestMismatchError, match="bytes, expected"):
        integrity.checked_frames(m, memoryview(raw[:-1]), verify=False)
    mz, _ = _manifest(FRAMES, "zlib")
    with pytest.raises(DigestMismatchError, match="does not decompress"):
        integrity.checked_frames(mz, memoryview(raw), verify=False)
