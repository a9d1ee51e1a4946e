import json
import os
import pickle
import shutil

import pytest
import torch

import vidcache.cache as cache_mod
from vidcache import NotCachedError, VideoCache, VideoHandle, VideoOptions
from vidcache.digest import Digest
from vidcache.loader.build import decode_sample_resize
from vidcache.loader.frozen import available_decoders, decode_all


def test_miss_builds_then_hits(cache, videos):
    o = VideoOptions(family="qwen2_5_vl")
    first = cache.ensure(videos["h264_30"], o)
    again = cache.ensure(videos["h264_30"], o)
    assert (first.status, again.status) == ("new", "hit") and first.key == again.key
    ref, _ = decode_sample_resize(videos["h264_30"], o)
    h = cache.get(videos["h264_30"], o)
    assert h.frames().dtype == torch.uint8 and torch.equal(h.frames(), ref)
    m = h.manifest
    assert m["source_digest"] == str(Digest.of(open(videos["h264_30"], "rb").read()))
    assert m["source_digest"].startswith("xxh3_128:") and m["frames"]["encoding"] == "raw"
    assert m["provenance"]["decoder"] == "decord" and "torch" in m["provenance"]


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
    h = cache.get(videos["h264_ntsc"], VideoOptions(family="qwen3_vl", fps=1.0))
    blob = pickle.dumps(h)
    assert len(blob) < 1024
    h2 = pickle.loads(blob)
    assert h2 == h and h2.key == h.key
    d = json.loads(json.dumps(h.to_dict()))
    h3 = VideoHandle.from_dict(d)
    assert h3 == h and torch.equal(h3.frames(), h.frames())
    assert len(json.dumps(d)) < 1024
    assert h != VideoHandle(h.source, VideoOptions(family="qwen3_vl"), h.cache)


def test_lazy_handle_builds_on_first_use_or_refuses(cache, videos):
    h = cache.handle(videos["mjpeg_24"], VideoOptions())
    with pytest.raises(NotCachedError, match="prewarm"):
        h.resolve(build=False)
    assert h.frames().shape[1] == 3                 # built on first use
    assert cache.handle(videos["mjpeg_24"], VideoOptions()).resolve(build=False) == h.key


def test_metadata(cache, videos):
    h = cache.get(videos["h264_ntsc"], VideoOptions())
    md = h.metadata
    assert md["fps_rational"] == "30000/1001" and abs(md["fps"] - 29.97) < 0.01
    assert md["num_frames"] == len(md["frame_indices"]) == h.frames().shape[0]
    assert md["video_grid_thw"] == [md["num_frames"] // 2, md["height"] // 14, md["width"] // 14]
    assert h.num_video_tokens == md["num_frames"] // 2 * md["height"] // 14 * md["width"] // 14 // 4


@pytest.mark.parametrize("fmt,suffix", [(None, ".mkv"), ("ffv1", ".mkv"), ("utvideo", ".nut")])
@pytest.mark.parametrize("name", ["h264_ntsc", "ffv1_10_small", "mpeg4_25_odd"])
def test_frozen_file_redecodes_bit_exactly(cache, videos, name, fmt, suffix):
    h = cache.get(videos[name], VideoOptions(family="qwen2_5_vl"))
    uri = h.frozen_uri(fmt)
    assert uri.startswith("file:///") and uri.endswith(suffix)      # FFV1 in Matroska by default
    frames = h.frames()
    decoders = available_decoders()
    assert "decord" in decoders and "pyav" in decoders
    for dec in decoders:
        got, fps = decode_all(h.frozen_path(fmt), dec)
        assert torch.equal(got, frames), dec
        assert fps == 2.0


def test_frozen_uri_is_percent_encoded(tmp_path, videos):
    c = VideoCache(tmp_path / "we#ird?dir %")
    uri = c.get(videos["ffv1_10_small"], VideoOptions()).frozen_uri()
    assert "#" not in uri and "?" not in uri and "%25" in uri
    from urllib.parse import unquote, urlparse
    assert os.path.exists(unquote(urlparse(uri).path))


def test_corrupted_blob_is_detected(cache, videos):
    from vidcache.errors import DigestMismatchError
    h = cache.get(videos["ffv1_10_small"], VideoOptions())
    m = h.manifest
    raw = bytearray(cache.store.get("cas/" + m["frames"]["blob"]))
    raw[100] ^= 0xFF
    cache.store.set_many({"cas/" + m["frames"]["blob"]: bytes(raw)})
    with pytest.raises(DigestMismatchError):
        cache.verify(h.key)


def test_zlib_encoding_round_trips(tmp_path, videos):
    c = VideoCache(tmp_path / "z", encoding="zlib")
    h = c.get(videos["h264_30"], VideoOptions())
    ref, _ = decode_sample_resize(videos["h264_30"], VideoOptions())
    assert h.manifest["frames"]["encoding"] == "zlib" and torch.equal(h.frames(), ref)
