"""Sources through fsspec: local, file://, http(s) on loopback, S3 on a moto server, data: URIs."""
import base64
import functools
import http.server
import shutil
import threading

import pytest
import torch

import vidcache.cache as cache_mod
from conftest import free_port
from vidcache import VideoCache, VideoOptions
from vidcache.errors import (SchemeNotAllowedError, SourceNotFoundError, SourceTooLargeError,
                             SourceUnavailableError)
from vidcache.loader.fetch import FetchLimits


@pytest.fixture(scope="module")
def http_root(tmp_path_factory, videos):
    root = tmp_path_factory.mktemp("www")
    shutil.copy(videos["h264_30"], root / "clip.mp4")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", root
    srv.shutdown()


def test_same_bytes_same_key_across_schemes(cache, videos, http_root):
    url, _ = http_root
    local = cache.ensure(videos["h264_30"], VideoOptions())
    via_uri = cache.ensure("file://" + videos["h264_30"], VideoOptions())
    via_http = cache.ensure(url + "/clip.mp4", VideoOptions())
    data = "data:video/mp4;base64," + base64.b64encode(open(videos["h264_30"], "rb").read()).decode()
    via_data = cache.ensure(data, VideoOptions())
    assert local.status == "new"
    assert {via_uri.key, via_http.key, via_data.key} == {local.key}
    assert (via_uri.status, via_http.status, via_data.status) == ("hit", "hit", "hit")


def test_http_errors_are_specific(cache, http_root):
    url, _ = http_root
    with pytest.raises(SourceNotFoundError, match="not found"):
        cache.ensure(url + "/nope.mp4", VideoOptions())
    with pytest.raises(SourceUnavailableError, match="cannot read"):
        cache.ensure(f"http://127.0.0.1:{free_port()}/x.mp4", VideoOptions())


def test_caps_and_allowlist(tmp_path, videos, http_root):
    url, _ = http_root
    small = VideoCache(tmp_path / "c", limits=FetchLimits(max_bytes=1000))
    with pytest.raises(SourceTooLargeError, match="cap"):
        small.ensure(videos["h264_30"], VideoOptions())
    with pytest.raises(SourceTooLargeError):
        small.ensure(url + "/clip.mp4", VideoOptions())
    local_only = VideoCache(tmp_path / "d", limits=FetchLimits(schemes=("file",)))
    with pytest.raises(SchemeNotAllowedError, match="not allowed"):
        local_only.ensure(url + "/clip.mp4", VideoOptions())
    with pytest.raises(SchemeNotAllowedError):
        local_only.ensure("ftp://example.invalid/x.mp4", VideoOptions())
    assert small.stats()["entries"] == 0 and local_only.stats()["entries"] == 0


@pytest.fixture(scope="module")
def s3(videos):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    srv.start()
    endpoint = f"http://127.0.0.1:{srv._server.server_port}"
    client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test",
                          region_name="us-east-1")
    client.create_bucket(Bucket="videos")
    client.upload_file(videos["mjpeg_24"], "videos", "a/clip.avi")
    opts = {"s3": {"endpoint_url": endpoint, "key": "test", "secret": "test",
                   "client_kwargs": {"region_name": "us-east-1"}}}
    yield client, opts
    srv.stop()


def test_s3_source_on_a_real_s3_server(tmp_path, videos, s3, monkeypatch):
    client, opts = s3
    c = VideoCache(tmp_path / "c", limits=FetchLimits(storage_options=opts))
    calls = []
    real = cache_mod.fetch
    monkeypatch.setattr(cache_mod, "fetch", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    r1 = c.ensure("s3://videos/a/clip.avi", VideoOptions())
    r2 = c.ensure("s3://videos/a/clip.avi", VideoOptions())
    assert (r1.status, r2.status, len(calls)) == ("new", "hit", 1)     # ETag/size validators matched
    assert r1.key == c.ensure(videos["mjpeg_24"], VideoOptions()).key   # content-addressed
    client.upload_file(videos["ffv1_10_small"], "videos", "a/clip.avi")  # the object changes
    r3 = c.ensure("s3://videos/a/clip.avi", VideoOptions())
    assert r3.status == "new" and r3.key != r1.key and len(calls) == 3   # + the local file above
    with pytest.raises(SourceNotFoundError):
        c.ensure("s3://videos/missing.mp4", VideoOptions())
    assert torch.equal(c.frames(r3.key), c.frames(c.ensure(videos["ffv1_10_small"], VideoOptions()).key))
