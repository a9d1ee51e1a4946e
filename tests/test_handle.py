"""``vidcache.handle``: handles are small, picklable, JSON-safe, find their cache by identity (in another process
too), refuse a foreign one, build lazily or not at all, and rebuild a corrupt entry from the source."""
import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

import vidcache
from vidcache import NotCachedError, VideoCache, VideoHandle, VideoOptions
from vidcache.errors import DigestMismatchError, InvalidKeyError, TierMismatchError

from support.damage import corrupt_blob


def test_handle_is_small_picklable_and_json_safe(cache, videos):
    h = vidcache.get(videos["h264_ntsc"], VideoOptions(family="qwen3_vl", fps=1.0), cache)
    assert h.identity == cache.identity and h.identity.startswith("local-")     # no shared tier: a node-local identity
    blob = pickle.dumps(h)
    assert len(blob) < 1024
    assert cache.path.encode() not in blob                              # a handle never carries a node path
    h2 = pickle.loads(blob)
    assert h2 == h and h2.key == h.key and h2.identity == h.identity
    d = json.loads(json.dumps(h.to_dict()))
    assert cache.path not in json.dumps(d) and d["identity"] == cache.identity and "tier" not in d
    h3 = VideoHandle.from_dict(d)
    assert h3 == h and torch.equal(h3.frames(), h.frames())
    assert len(json.dumps(d)) < 1024
    assert h != VideoHandle(h.source, VideoOptions(family="qwen3_vl"), h.identity)
    with pytest.raises(InvalidKeyError):
        VideoHandle.from_dict({**d, "key": "../../etc/passwd"})


def test_a_handle_stored_by_vidcache_0_1_is_still_read(cache, videos):
    """0.1 wrote the identity under "tier": datasets that hold such dicts still resolve (stored data, not API)."""
    h = vidcache.get(videos["h264_ntsc"], VideoOptions(family="qwen3_vl", fps=1.0), cache)
    d = h.to_dict()
    old = {"source": d["source"], "options": d["options"], "tier": d["identity"], "key": d["key"]}
    back = VideoHandle.from_dict(json.loads(json.dumps(old)))
    assert back == h and back.identity == cache.identity and back.key == h.key
    assert torch.equal(back.frames(), h.frames())
    assert back.to_dict() == d                        # written back in 0.2's form
    with pytest.raises(KeyError):                     # neither name: not a handle
        VideoHandle.from_dict({"source": d["source"], "options": d["options"]})


_OTHER_NODE = """
import os, pickle, sys
import torch
from vidcache.errors import TierMismatchError
blob, here, elsewhere = open(sys.argv[1], "rb").read(), sys.argv[2], sys.argv[3]
os.environ.pop("VIDCACHE_SHARED", None)
os.environ["VIDCACHE_DIR"] = elsewhere          # a node configured for another cache
try:
    pickle.loads(blob).frames()
    sys.exit("resolved against a foreign cache")
except TierMismatchError as e:
    print("MISMATCH", e)
os.environ["VIDCACHE_DIR"] = here               # a node configured for this cache
torch.save(pickle.loads(blob).frames(), sys.argv[4])
"""


def test_a_handle_resolves_by_identity_in_another_process(cache, videos, tmp_path):
    """Unpickled in a process that never saw the cache object, a handle finds it through the node's
    configuration (VIDCACHE_DIR), and a node configured for another cache refuses it."""
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), cache)
    (tmp_path / "h.pkl").write_bytes(pickle.dumps(h))
    cache.sync()
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDCACHE_")}
    out = subprocess.run([sys.executable, "-c", _OTHER_NODE, str(tmp_path / "h.pkl"), cache.path,
                          str(tmp_path / "elsewhere"), str(tmp_path / "frames.pt")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "MISMATCH" in out.stdout and h.identity in out.stdout
    assert torch.equal(torch.load(tmp_path / "frames.pt"), h.frames())


def test_a_foreign_identity_is_refused_in_process(cache, videos, tmp_path, monkeypatch):
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), cache)
    stranger = VideoHandle(h.source, h.options, "local-" + "0" * 32, key=h.key)
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    with pytest.raises(TierMismatchError, match="local-0000"):    # never a silent rebuild somewhere else
        stranger.frames()
    with pytest.raises(TierMismatchError):
        stranger.metadata  # noqa: B018 -- the property access is the test


def test_lazy_handle_builds_on_first_use_or_refuses(cache, videos, count_decodes):
    h = vidcache.lazy(videos["mjpeg_24"], VideoOptions(), cache)
    with pytest.raises(NotCachedError, match="prewarm"):
        h.resolve(build=False)
    # Properties never build: a miss is NotCachedError, and nothing is decoded.
    for prop in ("manifest", "metadata", "num_video_tokens"):
        with pytest.raises(NotCachedError):
            getattr(h, prop)
    assert count_decodes == []
    assert h.frames().shape[1] == 3                 # built on first use
    assert len(count_decodes) == 1
    assert vidcache.lazy(videos["mjpeg_24"], VideoOptions(), cache).resolve(build=False) == h.key
    assert h.metadata["key"] == h.key and len(count_decodes) == 1


def test_metadata(cache, videos):
    h = vidcache.get(videos["h264_ntsc"], VideoOptions(), cache)
    md = h.metadata
    m = h.manifest
    assert md["fps_from_header"] == m.source.fps_from_header == "30000/1001" and abs(md["fps"] - 29.97) < 0.01
    assert "fps_rational" not in md
    assert md["fps"] == m.source.average_fps_from_decoder
    assert md["num_frames"] == len(md["frame_indices"]) == h.frames().shape[0]
    assert md["frame_indices"] == list(m.sampling.frame_indices) and md["total_num_frames"] == 150
    assert (md["height"], md["width"]) == tuple(h.frames().shape[2:])
    assert md["video_grid_thw"] == [md["num_frames"] // 2, md["height"] // 14, md["width"] // 14]
    assert md["video_grid_thw"] == list(m.tokens.video_grid_thw)
    assert h.num_video_tokens == md["video_pad_tokens"] == \
        md["num_frames"] // 2 * md["height"] // 14 * md["width"] // 14 // 4
    assert (m.source.width_from_decoder, m.source.height_from_decoder) == (320, 240)
    assert m.source.num_frames_from_decoder == 150 and m.source.codec == "h264"
    assert md["aspect_distortion"] == m.aspect_distortion == pytest.approx(
        (md["width"] / md["height"]) / (320 / 240))
    assert md["key"] == h.key and md["family"] == "qwen2_5_vl" and md["sample_fps"] == m.sampling.sample_fps


def test_handle_frames_rebuilds_a_corrupt_entry(cache, videos):
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), cache)
    good = h.frames().clone()
    corrupt_blob(cache, h.key, at=7)
    fresh = VideoCache(cache.path)
    hf = vidcache.lazy(h.source, h.options, fresh)
    assert torch.equal(hf.frames(), good)            # the corrupt copy was never served
    assert fresh.verify(h.key) == []


def test_a_handle_without_source_names_the_key(cache, videos):
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), cache)
    corrupt_blob(cache, h.key)
    fresh = VideoCache(cache.path)
    byk = vidcache.from_key(h.key, fresh)
    assert byk.source is None
    with pytest.raises(DigestMismatchError, match=h.key):
        byk.frames()


def test_to_dict_from_dict_and_pickle_round_trip_without_a_cache():
    o = VideoOptions(family="qwen3_vl", nframes=8)
    key = "0123456789abcdef0123456789abcdef.10.fedcba9876543210fedcba9876543210"
    pinned = VideoHandle("s3://b/a #1.mp4", o, "tier-" + "0" * 32, key=key)
    unpinned = VideoHandle("s3://b/a #1.mp4", o, "tier-" + "0" * 32)
    assert "key" not in unpinned.to_dict() and pinned.to_dict()["key"] == key
    assert pinned == unpinned                        # the key is a memo, not part of identity
    for h in (pinned, unpinned):
        for again in (VideoHandle.from_dict(json.loads(json.dumps(h.to_dict()))), pickle.loads(pickle.dumps(h))):
            assert again == h and again.key == h.key and again.options.digest == o.digest
            assert "_cache_obj" not in again.__dict__           # unbound until used
    by_key = VideoHandle(None, o, "tier-" + "0" * 32, key=key)
    assert VideoHandle.from_dict(by_key.to_dict()).source is None
    with pytest.raises(NotCachedError, match="must carry its key"):
        VideoHandle(None, o, "tier-" + "0" * 32).resolve()
    assert VideoHandle("s3://b/a #1.mp4", o, "tier-" + "1" * 32) != pinned    # another tier: another handle
