"""``vidcache.cache``: ``VideoCache`` builds, reads, checks and repairs entries.  Handles: ``test_handle.py``;
key checks: ``test_keys.py``; frozen files: ``tests/sglang/``; the shared tier: ``test_shared_tier.py``."""
import json
import shutil

import pytest
import torch

import vidcache
import vidcache.cache as cache_mod
from vidcache import NotCachedError, VideoCache, VideoOptions, keys
from vidcache.digest import Digest
from vidcache.errors import (
    CorruptManifestError,
    DigestMismatchError,
)
from vidcache.loader.build import decode_sample_resize
from vidcache.manifest import SCHEMA, Manifest

from support.damage import corrupt_blob


def test_miss_builds_then_hits(cache, videos):
    o = VideoOptions(family="qwen2_5_vl")
    first = cache.ensure(videos["h264_30"], o)
    again = cache.ensure(videos["h264_30"], o)
    assert (first.status, again.status) == ("new", "hit") and first.key == again.key
    ref, _ = decode_sample_resize(videos["h264_30"], o)
    h = vidcache.get(videos["h264_30"], o, cache)
    assert h.frames().dtype == torch.uint8 and torch.equal(h.frames(), ref)
    m = h.manifest
    assert isinstance(m, Manifest) and m.key == h.key == first.key
    assert m.source_digest == str(Digest.of(open(videos["h264_30"], "rb").read()))
    assert m.source_digest.startswith("xxh3_128:") and m.frames.encoding == "raw"
    assert m.frames.blob == str(Digest.of(ref.numpy().tobytes())) and m.frames.nbytes == ref.numel()
    assert m.frames.shape == tuple(ref.shape) and (m.frames.dtype, m.frames.layout) == ("uint8", "TCHW")
    assert (m.num_frames, m.height, m.width) == tuple(ref.shape[i] for i in (0, 2, 3))
    assert m.provenance["decoder"] == "decord" and "torch" in m.provenance
    assert m.options == o.resolved().to_dict() and m.video_options() == o and m.family == "qwen2_5_vl"
    assert Manifest.from_json(m.to_json(), m.key) == m                   # the JSON round trip is lossless


def test_unchanged_source_is_not_hashed_again(cache, videos, monkeypatch, tmp_path):
    calls = []
    real = cache_mod.fetch
    monkeypatch.setattr(cache_mod, "fetch", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    src = str(tmp_path / "v.mp4")
    shutil.copy(videos["h264_30"], src)
    cache.ensure(src, VideoOptions())
    cache.ensure(src, VideoOptions())
    assert len(calls) == 1                          # second time: fingerprint matched the record
    # A new options record for the same source needs no fetch to find its digest... but must decode:
    cache.ensure(src, VideoOptions(fps=1.0))
    assert len(calls) == 2
    # Same bytes at another path: fetched (new source) but served from the same entry.
    other = str(tmp_path / "copy.mp4")
    shutil.copy(src, other)
    assert cache.ensure(other, VideoOptions()).status == "hit"
    # Changed bytes at the same path: the fingerprint no longer matches, so it is fetched again.
    shutil.copy(videos["mjpeg_24"], src)
    res = cache.ensure(src, VideoOptions())
    assert res.status == "new" and len(calls) == 4


def test_corrupted_blob_is_detected_quarantined_and_rebuilt(cache, videos):
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(), cache)
    good = h.frames().clone()
    assert cache.verify(h.key) == []
    blob_key = corrupt_blob(cache, h.key)
    problems = cache.verify(h.key)                  # a report, not an exception
    assert len(problems) == 1 and "local" in problems[0] and "does not hash" in problems[0]
    # A fresh process (here: a fresh cache object) checks each blob on its first read ("first").
    other = VideoCache(cache.path)
    with pytest.raises(DigestMismatchError, match=h.key):
        other.frames(h.key)
    # The bad copy was moved aside, never served again: the entry is a miss now.
    assert cache.store.get(blob_key) is None
    assert cache.store.get(keys.quarantined(blob_key)) is not None
    assert other.stats()["quarantined"] == 1
    with pytest.raises(NotCachedError):
        other.frames(h.key)
    # A handle rebuilds from the source, bit-identical to what was cached before.
    h2 = vidcache.get(h.source, h.options, other)
    assert h2.key == h.key and torch.equal(h2.frames(), good)
    assert other.verify(h.key) == [] and cache.verify(h.key) == []


@pytest.mark.parametrize("mode", ["first", "always", "never"])
def test_verify_reads_setting(cache, videos, mode):
    key = cache.ensure(videos["ffv1_10_small"], VideoOptions()).key
    good = cache.frames(key).clone()
    c = VideoCache(cache.path, verify_reads=mode)
    assert torch.equal(c.frames(key), good)          # first read (verified unless "never")
    corrupt_blob(cache, key)
    if mode == "always":                             # every read is checked: refused at once
        with pytest.raises(DigestMismatchError):
            c.frames(key)
        with pytest.raises(NotCachedError):          # ...and quarantined, never served afterwards
            c.frames(key)
        return
    served = c.frames(key)                           # "first": already checked in this process; "never"
    assert not torch.equal(served, good)             # the documented trade-off: the corruption goes unseen
    assert cache.verify(key) != []                   # ...until verify reads it
    if mode == "never":
        assert torch.equal(VideoCache(cache.path, verify_reads="never").frames(key), served)
    else:                                            # a process that has not read it yet checks it
        with pytest.raises(DigestMismatchError):
            VideoCache(cache.path, verify_reads="first").frames(key)


def test_corrupt_or_old_manifest_is_a_miss_and_is_rebuilt(cache, videos):
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(), cache)
    good = h.frames().clone()
    raw = json.loads(cache.store.get(keys.ac(h.key)))
    with pytest.raises(CorruptManifestError, match="schema"):
        Manifest.from_json(json.dumps({**raw, "schema": 1}).encode(), h.key)
    with pytest.raises(CorruptManifestError, match="token counts"):
        Manifest.from_json(json.dumps({**raw, "tokens": {**raw["tokens"], "video_pad_tokens": 1}}).encode(), h.key)
    cache.store.set_many({keys.ac(h.key): b"{not json"})
    fresh = VideoCache(cache.path)
    assert any("not JSON" in p for p in fresh.verify(h.key))
    assert fresh.manifest(h.key) is None                       # quarantined, never parsed into an entry
    assert fresh.store.get(keys.quarantined(keys.ac(h.key))) == b"{not json"
    assert fresh.find(h.source, h.options) is None
    assert torch.equal(vidcache.lazy(h.source, h.options, fresh).frames(), good)
    assert fresh.verify(h.key) == []


def test_zlib_encoding_round_trips(tmp_path, videos):
    c = VideoCache(tmp_path / "z", encoding="zlib")
    h = vidcache.get(videos["h264_30"], VideoOptions(), c)
    ref, _ = decode_sample_resize(videos["h264_30"], VideoOptions())
    assert h.manifest.frames.encoding == "zlib" and torch.equal(h.frames(), ref)
    assert len(c.store.get(keys.cas(h.manifest.frames.blob))) < ref.numel()     # stored compressed
    assert c.verify(h.key) == []
    c.close()


def test_the_names_removed_in_0_2_are_gone_and_the_changelog_says_where_they_went(tmp_path):
    """0.2.0 dropped issue 30's deprecation shims (no deprecation cycle while early, as torchcodec): each old name is
    an AttributeError, and CHANGELOG.md names it with its new home."""
    import importlib
    import os

    c = VideoCache(tmp_path / "c")
    changelog = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "CHANGELOG.md")).read()
    for name in ("frozen_bytes", "record_frozen", "quarantine_frozen", "frozen_problems", "frozen_copies",
                 "compact_key", "publish_missing", "sources_by_digest", "frozen_dir", "decoder", "limits"):
        assert not hasattr(c, name), name
        assert f"`VideoCache.{name}`" in changelog, name
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("vidcache.store.fsspec_cas")
    assert "`vidcache.store.fsspec_cas`" in changelog


def test_close_forgets_the_cache_by_identity(tmp_path):
    """A closed cache is not found by identity (``vidcache.node`` would hand out a closed LMDB environment) and is
    not kept alive by the registry."""
    from vidcache import VideoCache
    from vidcache.cache import registered
    c = VideoCache(tmp_path / "c")
    ident = c.identity
    assert registered(ident) is c
    c.close()
    assert registered(ident) is None
