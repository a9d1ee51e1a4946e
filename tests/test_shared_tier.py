"""The shared tier at the cache level: a second node reads through, corrupt shared copies, the local budget, S3
(moto), resume and lazy handles on a fresh node.  The stores themselves: ``tests/store/test_fsspec.py`` and
``tests/store/test_tiered.py``."""
import json
import os

import pytest
import torch

import vidcache

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.errors import DigestMismatchError

from support.damage import flip_file, flip_seen_by_decoder


# --- nodes ---------------------------------------------------------------------------------------------
def test_second_node_reads_through_without_decoding(node_a, tmp_path, videos, count_decodes):
    shared, a = node_a.shared, node_a.cache
    (key,) = node_a.build("h264_ntsc")
    decoded_before = len(count_decodes)
    node_b = node_a.node("node_b")
    assert node_b.identity == a.identity            # one cluster-wide identity: the shared tier's
    assert node_b.ensure(videos["h264_ntsc"], VideoOptions()).status == "hit"
    h = vidcache.lazy(videos["h264_ntsc"], VideoOptions(), node_b)
    assert h.resolve(build=False) == key
    assert torch.equal(h.frames(), a.frames(key)) and len(count_decodes) == decoded_before
    # the node directory remembers its shared tier, for later commands on this node
    assert json.load(open(tmp_path / "node_b" / "config.json"))["shared"] == shared
    assert not os.path.exists(os.path.join(shared, "lmdb"))   # never LMDB on the shared tier


@pytest.mark.parametrize("layout", ["compact", "raw"])
def test_corrupt_shared_object_is_never_served_and_is_repaired(tmp_path, videos, layout):
    """A flipped byte in the shared tier's copy, its compact object or (older layout) its raw frames."""
    shared = str(tmp_path / "nfs")
    a = VideoCache(tmp_path / "a", shared=shared, shared_layout=layout)
    key = a.ensure(videos["mjpeg_24"], VideoOptions()).key
    good = a.frames(key)
    m = a.manifest(key)
    store_key = a.compact.key(key) if layout == "compact" else "cas/" + m.frames.blob
    assert (a.shared.get("cas/" + m.frames.blob) is None) == (layout == "compact")   # no raw copy, compact
    blob_path = a.shared._path(store_key)
    if layout == "compact":
        raw = flip_seen_by_decoder(open(blob_path, "rb").read(), m, bit=0x01)
        open(blob_path, "wb").write(raw)
    else:
        flip_file(blob_path, 0.5, bit=0x01)
        raw = open(blob_path, "rb").read()
    b = VideoCache(tmp_path / "b", shared=shared)
    with pytest.raises(DigestMismatchError, match=key):
        b.frames(key)                                # node B pulls, checks, refuses
    assert b.local.get("cas/" + m.frames.blob) is None      # nothing bad was backfilled
    assert b.shared.get(K.quarantined(store_key)) == bytes(raw)   # moved aside, not deleted
    # node A still holds a sound copy: verify --repair publishes it back under its own digest
    assert a.verify(key, repair=True) != [] and a.verify(key) == []
    assert torch.equal(VideoCache(tmp_path / "c", shared=shared).frames(key), good)


def test_local_budget_keeps_the_shared_tier_whole(tmp_path, videos):
    shared = str(tmp_path / "nfs")
    budget = 2 << 20
    c = VideoCache(tmp_path / "node", shared=shared, max_local_bytes=budget)
    opts = VideoOptions(min_pixels=3136)
    names = ["h264_30", "h264_ntsc", "mpeg4_25_odd", "mjpeg_24", "hevc_25", "ffv1_10_small"]
    keys = [c.ensure(videos[n], opts).key for n in names]
    total = sum(c.manifest(k).frames.nbytes for k in keys)
    assert total > 2 * budget                        # more than fits locally
    assert c.local.used_bytes() <= budget
    for n, k in zip(names, keys):                    # every entry still readable, through the shared tier
        assert c.verify(k) == []
        assert c.frames(k).shape[0] == c.manifest(k).num_frames
    assert c.local.used_bytes() <= budget


def test_shared_tier_on_s3(tmp_path, videos, s3):
    opts = {"endpoint_url": s3.endpoint, "client_kwargs": {"region_name": "us-east-1"}}
    a = VideoCache(tmp_path / "a", shared="s3://cache/vc", shared_storage_options=opts)
    key = a.ensure(videos["mjpeg_24"], VideoOptions()).key
    names = [o["Key"] for o in s3.client.list_objects_v2(Bucket="cache")["Contents"]]
    assert any(n.startswith("vc/ac/") for n in names) and any(n.startswith("vc/frozen/") for n in names)
    assert not any(n.startswith("vc/cas/") for n in names)          # one compact object: no raw frames sent
    b = VideoCache(tmp_path / "b", shared="s3://cache/vc", shared_storage_options=opts)
    assert b.identity == a.identity and torch.equal(b.frames(key), a.frames(key))
    assert "secret" not in open(tmp_path / "b" / "config.json").read()


def test_resume_on_a_fresh_node_counts_hits_without_downloading_frames(node_a, tmp_path, videos, count_decodes):
    from vidcache.prewarming import prewarm
    shared = node_a.shared
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n"
                          for n in ("h264_30", "mjpeg_24")))
    assert prewarm(str(ds), node_a.cache, VideoOptions(), progress=False).new == 2
    decoded = len(count_decodes)
    b = VideoCache(tmp_path / "b", shared=shared)
    s = prewarm(str(ds), b, VideoOptions(), progress=False)
    assert (s.new, s.hit, s.failed) == (0, 2, 0) and len(count_decodes) == decoded
    assert list(b.local.keys("cas/")) == []          # hits were counted, no frames were pulled


def test_a_lazy_handle_on_another_node_is_found_without_fetching_the_source(node_a, tmp_path, videos, monkeypatch,
                                                                           count_decodes):
    import vidcache.cache as cache_mod
    shared, a = node_a.shared, node_a.cache
    (key,) = node_a.build("hevc_25")
    decoded = len(count_decodes)

    def no_fetch(*args, **kw):
        raise AssertionError("node B fetched the source: the shared source record should have matched")
    monkeypatch.setattr(cache_mod, "fetch", no_fetch)
    b = VideoCache(tmp_path / "b", shared=shared)
    h = vidcache.lazy(videos["hevc_25"], VideoOptions(), b)     # e.g. a dataset row on a rollout node
    assert h.resolve(build=False) == key                        # one stat of the source, no read of it
    assert torch.equal(h.frames(), a.frames(key)) and len(count_decodes) == decoded


def test_a_node_that_builds_an_entry_another_node_just_built_says_how_to_avoid_it(node_a, tmp_path, videos,
                                                                                   monkeypatch, caplog):
    """D31, refused with a clear message: two nodes prewarming the same rows at once may both decode a video
    (5-11 of 30 in the reliability run).  Never wrong (one key, one set of frames, the first object wins and the
    second is checked against it), but the second node says its decode was wasted and how to build once."""
    import logging

    from vidcache import errors
    tier, a = node_a.shared, node_a.cache
    want = a.frames(a.ensure(videos["mjpeg_24"], VideoOptions()).key)
    b = VideoCache(tmp_path / "b", shared=tier)
    monkeypatch.setattr(type(b), "sound_manifest", lambda self, key: None)   # B looked before A's manifest landed
    monkeypatch.setattr(errors, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="vidcache"):
        r = b.ensure(videos["mjpeg_24"], VideoOptions())
    assert r.status == "new"
    said = [m.getMessage() for m in caplog.records if "built by another node" in m.getMessage()]
    assert len(said) == 1 and "vidcache prewarm --ray" in said[0]
    assert torch.equal(VideoCache(tmp_path / "c", shared=tier).frames(r.key), want)
    assert b.verify(r.key) == []


# --- D33: an object larger than any entry writes is refused unread ------------------------------------------
def _plant_oversized(tmp_path, videos, size):
    """An entry in a directory tier whose compact object is replaced by a sparse file of ``size`` bytes (no disk)."""
    shared = str(tmp_path / "nfs")
    a = VideoCache(tmp_path / "a", shared=shared)
    key = a.ensure(videos["mjpeg_24"], VideoOptions()).key
    path = a.shared._path(a.compact.key(key))
    os.truncate(path, size)
    a.close()
    return shared, key


def test_oversized_shared_object_is_refused_before_it_is_read(tmp_path, videos, monkeypatch):
    from vidcache.errors import CorruptEntryError, OversizedObjectError
    bound = 1 << 20
    monkeypatch.setenv("VIDCACHE_SHARED_MAX_OBJECT_BYTES", str(bound))
    shared, key = _plant_oversized(tmp_path, videos, 8 * bound)
    b = VideoCache(tmp_path / "b", shared=shared)
    store_key = b.compact.key(key)
    with pytest.raises(OversizedObjectError, match=f"{8 * bound} bytes") as e:
        b.frames(key)                                  # a fresh node's read through
    assert isinstance(e.value, CorruptEntryError)      # never served: callers treat it as a corrupt copy
    with pytest.raises(OversizedObjectError):
        b.shared.get(store_key)
    with pytest.raises(OversizedObjectError):
        b.shared.stream(store_key, lambda piece: pytest.fail("a byte of it was read"))
    m = b.manifest(key)
    assert b.local.get("cas/" + m.frames.blob) is None           # nothing backfilled
    assert not os.path.exists(os.path.join(shared, "quarantine"))   # and nothing of it copied into the tier


def test_the_object_bound_follows_the_decode_budget():
    from vidcache.config import CacheConfig
    from vidcache.loader.build import DEFAULT_MAX_DECODED_BYTES
    from vidcache.store.fsspec import DEFAULT_DECODE_BUDGET, default_max_object_bytes
    assert DEFAULT_DECODE_BUDGET == DEFAULT_MAX_DECODED_BYTES
    assert default_max_object_bytes() == DEFAULT_MAX_DECODED_BYTES * 9 // 8
    big = 4 * DEFAULT_MAX_DECODED_BYTES
    assert CacheConfig("/nonexistent", shared="/tier", max_decoded_bytes=big).shared_store().max_object_bytes == big * 9 // 8
    # A smaller budget on this node does not tighten it: another node may have written the entry.
    small = CacheConfig("/nonexistent", shared="/tier", max_decoded_bytes=1 << 20).shared_store()
    assert small.max_object_bytes == default_max_object_bytes()


def test_cli_verify_names_an_oversized_shared_object(tmp_path, videos):
    from support.cli import EVERYTHING, run_cli
    bound = 1 << 20
    shared, key = _plant_oversized(tmp_path, videos, 8 * bound)
    r = run_cli(["verify", "--shared", shared], tmp_path / "b", inherit=EVERYTHING,
                env={"VIDCACHE_SHARED_MAX_OBJECT_BYTES": bound})
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    assert f"BAD {key}: [oversized]" in r.stdout and f"is {8 * bound} bytes" in r.stdout


# --- D51: the directory tier's own directories, and each entry's own bound ---------------------------------------
def test_a_symlinked_fan_out_directory_is_not_read_through(node_a, tmp_path, videos):
    """D51 (2): ``frozen/<xx>`` moved outside the tier and linked back was served through the link.  A tier's
    directories are its own: the object behind the link is no object, so the read is a clean miss."""
    from vidcache.errors import NotCachedError
    shared, a = node_a.shared, node_a.cache
    (key,) = node_a.build("mjpeg_24")
    fan = os.path.dirname(a.shared._path(a.compact.key(key)))
    os.rename(fan, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", fan)
    b = VideoCache(tmp_path / "b", shared=shared)
    with pytest.raises(NotCachedError):
        b.frames(key)
    assert b.shared.get(b.compact.key(key)) is None


def test_a_symlinked_quarantine_directory_is_not_written_through(node_a, tmp_path, videos):
    """D51 (1): ``quarantine/<fan-out>`` linked outside the tier, then a truncated object read by a fresh node:
    the read was refused, and the planter's 5,000 bytes were written outside the tier by the quarantine copy."""
    from vidcache.errors import DigestMismatchError, NotCachedError
    shared, a = node_a.shared, node_a.cache
    (key,) = node_a.build("mjpeg_24")
    obj = a.shared._path(a.compact.key(key))
    qpath = a.shared._path(K.quarantined(a.compact.key(key)))
    outside = tmp_path / "outside_q"
    outside.mkdir()
    os.makedirs(os.path.dirname(os.path.dirname(qpath)), exist_ok=True)
    os.symlink(outside, os.path.dirname(qpath))
    os.truncate(obj, 5000)
    b = VideoCache(tmp_path / "b", shared=shared)
    with pytest.raises((DigestMismatchError, NotCachedError)):
        b.frames(key)
    assert os.listdir(outside) == []                     # nothing written where the link points


def test_an_object_larger_than_its_entry_can_write_is_not_read_whole(tmp_path, videos, monkeypatch):
    """D51 (3): the store's bound is any entry's (9 GiB by default), so a 2 GiB object planted for a 1.3 MB entry
    was read whole (3.4 GB of RSS, 22.7 s) and then copied whole into ``quarantine/``.  Its manifest bounds it:
    counted in bytes handed over by the tier: the entry's bound, plus the pieces that came before its manifest did
    (the fetch starts beside the manifest's; at most ``AHEAD_BYTES`` unread and the piece held back, however slow
    the manifest is: the bound was 32 pieces, which a loaded machine's stream outran), never the object."""
    from vidcache.store.fsspec import STREAM_PIECE, FsspecStore
    from vidcache.store.prefetch import AHEAD_BYTES
    shared, key = _plant_oversized(tmp_path, videos, 512 << 20)      # sparse: no disk
    handed = []
    real = FsspecStore.stream

    def counting(self, k, sink):
        def count(piece):
            handed.append(len(piece))
            sink(piece)
        return real(self, k, count)
    monkeypatch.setattr(FsspecStore, "stream", counting)
    from vidcache import keys as K
    from vidcache.integrity import max_object_bytes
    b = VideoCache(tmp_path / "b", shared=shared)
    want = VideoCache(tmp_path / "ref").ensure(videos["mjpeg_24"], VideoOptions())
    m = b.manifest(key)
    # Issue 48 (D55): its first bytes hold every frame exactly, so it is served; the bloat is damage after the
    # last frame, for the writer to replace with a clean copy, never a reason to delete it.
    assert torch.equal(b.frames(key), VideoCache(tmp_path / "ref").frames(want.key))
    assert m.frames.nbytes < sum(handed) <= AHEAD_BYTES + STREAM_PIECE, sum(handed)
    b.sync()                                                         # the replacement, on the writer thread
    kept = b.shared._path(K.quarantined(b.compact.key(key)))
    assert os.path.getsize(kept) <= max_object_bytes(m)              # its bloat was not copied (D59)
    assert b.verify(key) == []
