import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

import vidcache
import vidcache.cache as cache_mod
from vidcache import NotCachedError, VideoCache, VideoHandle, VideoOptions, keys
from vidcache.digest import Digest
from vidcache.errors import (
    CorruptManifestError,
    DigestMismatchError,
    InvalidKeyError,
    TierMismatchError,
)
from vidcache.loader.build import decode_sample_resize
from vidcache.manifest import SCHEMA, Manifest
from vidcache.sglang.frozen import available_decoders, decode_all, local_frozen_path
from vidcache.sglang.transport import video_uri


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


def test_handle_is_small_picklable_and_json_safe(cache, videos):
    h = vidcache.get(videos["h264_ntsc"], VideoOptions(family="qwen3_vl", fps=1.0), cache)
    assert h.tier == cache.identity and h.tier.startswith("local-")     # no shared tier: a node-local identity
    blob = pickle.dumps(h)
    assert len(blob) < 1024
    assert cache.path.encode() not in blob                              # a handle never carries a node path
    h2 = pickle.loads(blob)
    assert h2 == h and h2.key == h.key and h2.tier == h.tier
    d = json.loads(json.dumps(h.to_dict()))
    assert cache.path not in json.dumps(d) and d["tier"] == cache.identity
    h3 = VideoHandle.from_dict(d)
    assert h3 == h and torch.equal(h3.frames(), h.frames())
    assert len(json.dumps(d)) < 1024
    assert h != VideoHandle(h.source, VideoOptions(family="qwen3_vl"), h.tier)
    with pytest.raises(InvalidKeyError):
        VideoHandle.from_dict({**d, "key": "../../etc/passwd"})


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
    assert "MISMATCH" in out.stdout and h.tier in out.stdout
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


@pytest.mark.parametrize("fmt,suffix", [(None, ".nut"), ("ffv1", ".mkv"), ("utvideo", ".nut")])
@pytest.mark.parametrize("name", ["h264_ntsc", "ffv1_10_small", "mpeg4_25_odd"])
def test_frozen_file_redecodes_bit_exactly(cache, videos, name, fmt, suffix):
    h = vidcache.get(videos[name], VideoOptions(family="qwen2_5_vl"), cache)
    path = local_frozen_path(cache, h.key, fmt)          # the serving format (UT Video in NUT) by default
    assert path.endswith(suffix) and os.path.dirname(path) == os.path.join(cache.path, "frozen")
    uri = video_uri(h, "stock", transport="file", frozen_format=fmt)
    from urllib.parse import unquote, urlparse
    assert uri.startswith("file:///") and unquote(urlparse(uri).path) == path
    frames = h.frames()
    decoders = available_decoders()
    assert "decord" in decoders and "pyav" in decoders
    for dec in decoders:
        got, fps = decode_all(path, dec)
        assert torch.equal(got, frames), dec
        assert fps == 2.0


def test_stock_file_uri_defaults_to_the_serving_format(cache, videos):
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(), cache)
    assert video_uri(h, "stock", transport="file").endswith(".nut")          # UT Video: fastest to decode
    assert video_uri(h, "stock").endswith(".nut")                            # "file" without a shared tier


def test_frozen_uri_is_percent_encoded(tmp_path, videos):
    c = VideoCache(tmp_path / "we#ird?dir %")
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(), c)
    uri = video_uri(h, "stock", transport="file")
    assert "#" not in uri and "?" not in uri and "%25" in uri and "%23" in uri and "%3F" in uri
    from urllib.parse import unquote, urlparse
    path = unquote(urlparse(uri).path)
    assert os.path.exists(path) and path == local_frozen_path(c, h.key, "utvideo")
    got, _ = decode_all(path, "decord")
    assert torch.equal(got, h.frames())
    c.close()


def _corrupt_blob(cache, key, at=100):
    blob_key = keys.cas(cache.manifest(key).frames.blob)
    raw = bytearray(cache.store.get(blob_key))
    raw[at] ^= 0xFF
    cache.store.set_many({blob_key: bytes(raw)})
    return blob_key


def test_corrupted_blob_is_detected_quarantined_and_rebuilt(cache, videos):
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(), cache)
    good = h.frames().clone()
    assert cache.verify(h.key) == []
    blob_key = _corrupt_blob(cache, h.key)
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


def test_handle_frames_rebuilds_a_corrupt_entry(cache, videos):
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), cache)
    good = h.frames().clone()
    _corrupt_blob(cache, h.key, at=7)
    fresh = VideoCache(cache.path)
    hf = vidcache.lazy(h.source, h.options, fresh)
    assert torch.equal(hf.frames(), good)            # the corrupt copy was never served
    assert fresh.verify(h.key) == []


def test_a_handle_without_source_names_the_key(cache, videos):
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), cache)
    _corrupt_blob(cache, h.key)
    fresh = VideoCache(cache.path)
    byk = vidcache.from_key(h.key, fresh)
    assert byk.source is None
    with pytest.raises(DigestMismatchError, match=h.key):
        byk.frames()


@pytest.mark.parametrize("mode", ["first", "always", "never"])
def test_verify_reads_setting(cache, videos, mode):
    key = cache.ensure(videos["ffv1_10_small"], VideoOptions()).key
    good = cache.frames(key).clone()
    c = VideoCache(cache.path, verify_reads=mode)
    assert torch.equal(c.frames(key), good)          # first read (verified unless "never")
    _corrupt_blob(cache, key)
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


def test_keys_from_outside_are_checked_before_any_store_call(cache):
    for bad in ("../../etc/passwd", "0" * 32 + ".1.nope", "", None):
        with pytest.raises(InvalidKeyError):
            cache.manifest(bad)
        with pytest.raises(InvalidKeyError):
            cache.verify(bad)


def test_zlib_encoding_round_trips(tmp_path, videos):
    c = VideoCache(tmp_path / "z", encoding="zlib")
    h = vidcache.get(videos["h264_30"], VideoOptions(), c)
    ref, _ = decode_sample_resize(videos["h264_30"], VideoOptions())
    assert h.manifest.frames.encoding == "zlib" and torch.equal(h.frames(), ref)
    assert len(c.store.get(keys.cas(h.manifest.frames.blob))) < ref.numel()     # stored compressed
    assert c.verify(h.key) == []
    c.close()
