"""Reachability: the shared tier's URLs, file URIs, HTTP from `vidcache serve`, data: URIs; plugin references."""
import base64
import json
import os
import threading
import urllib.error
import urllib.request
from urllib.parse import unquote, urlparse

import pytest
import torch

import vidcache
from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.errors import ConfigError, InvalidKeyError
from vidcache.sglang.frozen import decode_all, local_frozen_path
from vidcache.sglang.server import make_server
from vidcache.rollout.ref import REF_PREFIX, REF_VERSION, parse_ref
from vidcache.sglang.transport import ENV_SERVER_PATH, TRANSPORTS, video_uri


@pytest.fixture
def handle(cache, videos):
    return vidcache.get(videos["mjpeg_24"], VideoOptions(family="qwen2_5_vl"), cache)


@pytest.fixture
def server(cache):
    srv = make_server(cache)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def _decodes_to(data: bytes, frames, tmp_path):
    p = tmp_path / "got.video"
    p.write_bytes(data)
    got, fps = decode_all(str(p), "decord")
    return torch.equal(got, frames) and fps == 2.0


def test_transports_are_the_documented_four():
    assert TRANSPORTS == ("shared", "file", "http", "data")


def test_http_transport_serves_exact_immutable_frozen_files(handle, server, tmp_path):
    url = video_uri(handle, "stock", "http", base_url=server)
    assert url == f"{server}/frozen/{handle.resolve()}.nut"
    with urllib.request.urlopen(url) as r:
        body = r.read()
        assert r.headers["ETag"] == f'"{handle.resolve()}"' and "immutable" in r.headers["Cache-Control"]
        assert r.headers["Content-Type"] == "video/x-nut"
    assert _decodes_to(body, handle.frames(), tmp_path)
    ffv1 = video_uri(handle, "stock", "http", base_url=server, frozen_format="ffv1")
    assert ffv1.endswith(".mkv")
    with urllib.request.urlopen(ffv1) as r:
        assert _decodes_to(r.read(), handle.frames(), tmp_path)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server}/frozen/{'0' * 32}.1.{'0' * 32}.mkv")
    assert e.value.code == 404
    for bad in ("/../../etc/passwd", "/frozen/../../etc/passwd", f"/frozen/{handle.resolve()}.txt"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(server + bad)
        assert e.value.code == 404
    with pytest.raises(ValueError, match="base_url"):
        video_uri(handle, "stock", "http")


def test_file_transport(handle, tmp_path):
    uri = video_uri(handle, "stock", "file")
    path = unquote(urlparse(uri).path)
    assert uri.startswith("file:///") and path == local_frozen_path(handle.cache, handle.key, "magicyuv")
    assert _decodes_to(open(path, "rb").read(), handle.frames(), tmp_path)


def test_data_transport_and_its_cap(handle, tmp_path, monkeypatch):
    uri = video_uri(handle, "stock", "data")
    assert uri.startswith("data:video/x-nut;base64,")
    assert _decodes_to(base64.b64decode(uri.split(",", 1)[1]), handle.frames(), tmp_path)
    import vidcache.sglang.transport as tr
    monkeypatch.setattr(tr, "SGLANG_URL_CAP", 1000)      # raising=True: a renamed cap fails here
    with pytest.raises(ValueError, match="cap"):
        video_uri(handle, "stock", "data")


def test_unknown_transport_is_refused(handle):
    with pytest.raises(ValueError, match="transport must be one of"):
        video_uri(handle, "stock", "ftp")


def test_shared_transport_is_the_default_with_a_shared_tier(tmp_path, videos):
    shared = tmp_path / "shared #1"
    c = VideoCache(tmp_path / "node", shared=str(shared))
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), c)
    uri = video_uri(h, "stock")                           # default: the shared tier's own URL
    assert uri == video_uri(h, "stock", "shared") and uri.startswith("file:///") and "#" not in uri
    path = unquote(urlparse(uri).path)
    assert path.startswith(str(shared) + "/")             # under the shared root, readable by every node
    assert not path.startswith(c.path)
    assert _decodes_to(open(path, "rb").read(), h.frames(), tmp_path)
    assert c.shared.exists_many([K.frozen(h.key, ".nut")]) == [True]           # published once
    # A second node on the same shared tier hands out the same URL without writing it again.
    other = VideoCache(tmp_path / "node2", shared=str(shared))
    h2 = vidcache.from_key(h.key, other)
    assert h2.identity == h.identity and video_uri(h2, "stock") == uri
    c.close()
    other.close()


def test_shared_transport_needs_a_tier_that_hands_out_urls(cache, tmp_path, videos):
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), cache)
    with pytest.raises(ValueError, match="no shared tier"):
        video_uri(h, "stock", "shared")
    c = VideoCache(tmp_path / "m", shared="memory://vidcache-transport-test")
    hm = vidcache.get(videos["mjpeg_24"], VideoOptions(), c)
    for transport in (None, "shared"):                 # "shared" is the default with any shared tier...
        with pytest.raises(ValueError, match="hands out URLs"):
            video_uri(hm, "stock", transport)
    assert video_uri(hm, "stock", "file").startswith("file:///")     # ...and memory:// cannot: say so
    c.close()


def test_plugin_references(handle, cache):
    for transport in (None, "data"):
        uri = video_uri(handle, "plugin", transport)
        assert uri.startswith(REF_PREFIX)
        rec = parse_ref(uri)
        assert rec == {"vidcache_ref": REF_VERSION, "tier": handle.identity, "key": handle.resolve()}
        assert rec["tier"] == cache.identity
        assert cache.path not in base64.b64decode(uri[len(REF_PREFIX):]).decode()   # never a node path
    assert parse_ref(video_uri(handle, "stock", "file")) is None
    assert parse_ref("file:///x/y.vidcache") is None                      # reference files are gone
    for transport in ("file", "http", "shared"):
        with pytest.raises(ValueError, match="plugin mode"):
            video_uri(handle, "plugin", transport, base_url="http://x")


def _ref(obj) -> str:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return REF_PREFIX + base64.b64encode(raw).decode()


@pytest.mark.parametrize("uri,why", [
    (REF_PREFIX + "!!not base64!!", "malformed"),
    (_ref(b"\xff\xfe"), "malformed"),
    (_ref(b"{not json"), "malformed"),
    (_ref({"a": 1}), "not a version-4"),
    (_ref([1, 2]), "not a version-4"),
    (_ref({"vidcache_ref": 1, "cache": "/some/path", "key": "0" * 32 + ".1." + "0" * 32}), "not a version-4"),
    (_ref({"vidcache_ref": 2, "key": "0" * 32 + ".1." + "0" * 32}), "malformed tier"),
    (_ref({"vidcache_ref": 2, "tier": "tier-x", "key": "../../etc/passwd"}), "not a vidcache key"),
    (_ref({"vidcache_ref": 2, "tier": "tier-x", "key": "0" * 32 + ".1.nope"}), "not a vidcache key"),
    (_ref({"vidcache_ref": 2, "tier": "tier-x", "key": 7}), "not a vidcache key"),
    (_ref({"vidcache_ref": 2, "tier": "tier-x"}), "not a vidcache key"),
    # issue 18: depth and size caps, and nothing long echoed back
    (_ref(b"[" * 50_000 + b"]" * 50_000), "malformed"),                  # RecursionError before the cap
    (_ref({"vidcache_ref": 3, "tier": "t" * 10_000_000, "key": "0" * 32 + ".1." + "0" * 32}), "at most"),
    (_ref({"vidcache_ref": 3, "tier": "t" * 100_000, "key": "0" * 32 + ".1." + "0" * 32}), "malformed tier"),
    (_ref({"vidcache_ref": 3, "tier": "tier-x", "key": "0" * 32 + ".1." + "0" * 32, "path": "/x"}), "unknown field"),
    (_ref({"vidcache_ref": 4, "tier": "tier-x", "key": "0" * 32 + ".1." + "0" * 32, "layout": "../x"}),
     "unknown token layout"),
    (_ref({"vidcache_ref": 4, "tier": "tier-x", "key": "0" * 32 + ".1." + "0" * 32, "layout": ["wrapped"]}),
     "unknown token layout"),
    (_ref({"vidcache_ref": 3, "tier": "tier-x", "key": "0" * 32 + ".1." + "0" * 32,
           "attest": {"video_grid_thw": [1, 2, 2], "pixel_values_videos": "zz"}}), "malformed attestation"),
    (_ref({"vidcache_ref": 3, "tier": "tier-x", "key": "0" * 32 + ".1." + "0" * 32,
           "attest": {"video_grid_thw": [[[[[1]]]]], "pixel_values_videos": "0" * 32}}), "malformed"),
])
def test_malformed_references_are_invalid_key_errors(uri, why):
    with pytest.raises(InvalidKeyError, match=why) as e:
        parse_ref(uri)
    assert len(str(e.value)) < 400                     # never echoes what the request sent at length


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
    assert os.path.exists(path) and path == local_frozen_path(c, h.key, "magicyuv")
    got, _ = decode_all(path, "decord")
    assert torch.equal(got, h.frames())
    c.close()


def test_shared_uri_names_the_sglang_nodes_mount_when_they_mount_it_elsewhere(tmp_path, videos, monkeypatch):
    """D26: one NFS export, mounted at ``mntA`` on the rollout node and ``mntB`` on the SGLang nodes (two links
    to one directory stand in for the two mounts).  With $VIDCACHE_SHARED_SERVER_PATH the URI names ``mntB``:
    nothing of the rollout node's path crosses, and the file it names is exact once ``mntA`` is gone."""
    export = tmp_path / "export"
    export.mkdir()
    (tmp_path / "mntA").symlink_to(export)
    (tmp_path / "mnt B#").symlink_to(export)                  # percent-encoded like every other URI
    c = VideoCache(tmp_path / "node", shared=str(tmp_path / "mntA"))
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), c)
    mine = video_uri(h, "stock")
    monkeypatch.setenv(ENV_SERVER_PATH, str(tmp_path / "mnt B#") + "/")
    theirs = video_uri(h, "stock")
    assert "mntA" in mine and "mntA" not in theirs and "#" not in theirs
    assert theirs.split("mnt%20B%23", 1)[1] == mine.split("mntA", 1)[1]      # the same object under their mount
    frames = h.frames()
    c.close()
    (tmp_path / "mntA").unlink()                              # the rollout node's path means nothing there
    assert _decodes_to(open(unquote(urlparse(theirs).path), "rb").read(), frames, tmp_path)


def test_the_server_path_is_refused_where_it_cannot_mean_anything(tmp_path, videos, monkeypatch, s3):
    c = VideoCache(tmp_path / "node", shared=str(tmp_path / "shared"))
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), c)
    monkeypatch.setenv(ENV_SERVER_PATH, "relative/mnt")
    with pytest.raises(ConfigError, match="must be an absolute path"):
        video_uri(h, "stock")
    monkeypatch.setenv(ENV_SERVER_PATH, "/mnt/vidcache")
    assert video_uri(h, "stock", "file").startswith("file://" + str(tmp_path / "node"))   # only `shared` maps
    opts = {"endpoint_url": s3.endpoint, "client_kwargs": {"region_name": "us-east-1"}}
    s = VideoCache(tmp_path / "s3node", shared="s3://cache/vc", shared_storage_options=opts)
    hs = vidcache.get(videos["mjpeg_24"], VideoOptions(), s)
    with pytest.raises(ConfigError, match="is not a directory"):                # a presigned URL is the
        video_uri(hs, "stock")                                                  # same from every node
