"""``vidcache.compact``: the shared tier's compact layout as an object of its own (the cache's behaviour through
it, CLI included, is tests/test_shared_layout.py)."""
from __future__ import annotations

import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.digest import Digest
from vidcache.errors import ConfigError, DigestMismatchError


@pytest.fixture
def raw_tier(tmp_path, videos):
    """A shared tier an older vidcache wrote raw, and the frames of its one entry."""
    old = VideoCache(tmp_path / "old", shared=str(tmp_path / "tier"), shared_layout="raw")
    key = old.ensure(videos["mjpeg_24"], VideoOptions()).key
    return tmp_path / "tier", key, old.frames(key)


def test_holds_answers_for_either_form(tmp_path, raw_tier):
    tier, key, frames = raw_tier
    c = VideoCache(tmp_path / "b", shared=str(tier))
    m = c.manifest(key)
    assert c.compact.holds(key, m.frames.blob)                         # raw frames only
    assert c.compact.publish(key, frames, m)
    c.shared.delete(K.cas(m.frames.blob))
    assert c.compact.holds(key, m.frames.blob)                         # the compact object only
    c.shared.delete(c.compact.key(key))
    assert not c.compact.holds(key, m.frames.blob)


def test_publish_then_expand_round_trips_exactly_and_backfills(tmp_path, raw_tier):
    tier, key, frames = raw_tier
    c = VideoCache(tmp_path / "b", shared=str(tier))
    m = c.manifest(key)
    assert c.compact.publish(key, frames, m)
    got = c.compact.expand(m)
    assert torch.equal(torch.from_numpy(got).reshape(frames.shape), frames)
    c.sync()                                                          # the backfill has committed
    assert c.local.get(K.cas(m.frames.blob)) is not None


def test_expand_of_an_object_decoding_to_other_frames_quarantines_and_raises(tmp_path, raw_tier, videos):
    tier, key, frames = raw_tier
    c = VideoCache(tmp_path / "b", shared=str(tier))
    m = c.manifest(key)
    other = c.ensure(videos["h264_30"], VideoOptions()).key
    c.shared.set_many({c.compact.key(key): c.shared.get(c.compact.key(other))})   # another entry's object
    with pytest.raises(DigestMismatchError, match="compact object"):
        c.compact.expand(m)
    assert c.shared.get(c.compact.key(key)) is None
    assert c.shared.get(K.quarantined(c.compact.key(key))) is not None


def test_an_object_is_sound_only_when_it_decodes_exactly_and_its_bytes_are_its_records(tmp_path, raw_tier):
    tier, key, frames = raw_tier
    c = VideoCache(tmp_path / "b", shared=str(tier))
    m = c.manifest(key)
    assert c.compact.publish(key, frames, m)
    obj, record = c.compact.key(key), K.frozen_digest(key, c.compact.suffix())
    assert c.compact.sound(key, m) == c.shared.get(obj)
    c.shared.set_many({record: str(Digest.of(b"other bytes")).encode()})
    assert c.compact.sound(key, m) is None             # decodes exactly, but is not the object recorded
    c.shared.delete(record)
    assert c.compact.sound(key, m) == c.shared.get(obj)   # no record (D39): decoding exactly is the proof


def test_a_read_only_or_raw_layout_never_publishes(tmp_path, raw_tier):
    tier, key, frames = raw_tier
    for cache in (VideoCache(tmp_path / "r", shared=str(tier), shared_layout="raw"),
                  VideoCache(tmp_path / "old", shared=str(tier), read_only=True)):
        assert not cache.compact.publish(key, frames, cache.manifest(key))
    assert cache.shared.get(cache.compact.key(key)) is None
    with pytest.raises(ConfigError, match="writable shared tier"):
        VideoCache(tmp_path / "old", shared=str(tier), read_only=True).upgrade_shared([key])


def test_upgrade_converts_and_frees_the_raw_blob_only_once_the_object_is_proven(tmp_path, raw_tier):
    tier, key, frames = raw_tier
    c = VideoCache(tmp_path / "b", shared=str(tier))
    blob = c.manifest(key).frames.blob
    out = c.upgrade_shared([key])
    assert out["converted"] == 1 and out["freed_bytes"] > 0 and c.shared.get(K.cas(blob)) is None
    assert torch.equal(VideoCache(tmp_path / "fresh", shared=str(tier)).frames(key), frames)
    assert c.upgrade_shared([key])["already"] == 1


def test_a_rerun_of_an_upgrade_that_stopped_before_freeing_counts_what_is_already_compact(tmp_path, raw_tier):
    """D41: an upgrade interrupted after publishing objects but before deleting the raw blobs; its re-run said
    "converted" for objects already there.  They are "already" now, and their raw blobs are freed."""
    tier, key, frames = raw_tier
    c = VideoCache(tmp_path / "b", shared=str(tier))
    m = c.manifest(key)
    assert c.compact.publish(key, frames, m)                           # the first run got this far
    out = c.upgrade_shared([key])
    assert (out["converted"], out["already"]) == (0, 1) and out["freed_bytes"] > 0
    assert c.shared.get(K.cas(m.frames.blob)) is None
    assert torch.equal(VideoCache(tmp_path / "fresh", shared=str(tier)).frames(key), frames)
