"""Reachability: file URIs, HTTP from `vidcache serve`, data: URIs; plugin references."""
import base64
import threading
import urllib.error
import urllib.request

import pytest
import torch

from vidcache import VideoOptions
from vidcache.loader.frozen import decode_all
from vidcache.server import make_server
from vidcache.transport import parse_ref, video_uri


@pytest.fixture
def handle(cache, videos):
    return cache.get(videos["mjpeg_24"], VideoOptions(family="qwen2_5_vl"))


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


def test_http_transport_serves_exact_immutable_frozen_files(handle, server, tmp_path):
    url = video_uri(handle, "stock", "http", base_url=server)
    assert url == f"{server}/frozen/{handle.resolve()}.nut"
    with urllib.request.urlopen(url) as r:
        body = r.read()
        assert r.headers["ETag"] == f'"{handle.resolve()}"' and "immutable" in r.headers["Cache-Control"]
    assert _decodes_to(body, handle.frames(), tmp_path)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{server}/frozen/{'0' * 32}.1.{'0' * 32}.mkv")
    assert e.value.code == 404
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{server}/../../etc/passwd")


def test_data_transport_and_its_cap(handle, tmp_path, monkeypatch):
    uri = video_uri(handle, "stock", "data")
    assert uri.startswith("data:video/x-nut;base64,")
    assert _decodes_to(base64.b64decode(uri.split(",", 1)[1]), handle.frames(), tmp_path)
    import vidcache.transport as tr
    monkeypatch.setattr(tr, "SGLANG_DATA_CAP", 1000)
    with pytest.raises(ValueError, match="cap"):
        video_uri(handle, "stock", "data")


def test_plugin_references(handle):
    for transport in ("file", "data"):
        uri = video_uri(handle, "plugin", transport)
        rec = parse_ref(uri)
        assert rec == {"vidcache_ref": 1, "cache": handle.cache, "key": handle.resolve()}
    assert parse_ref(video_uri(handle, "stock", "file")) is None
    with pytest.raises(ValueError, match="plugin mode"):
        video_uri(handle, "plugin", "http", base_url="http://x")
    with pytest.raises(ValueError, match="not a vidcache reference"):
        parse_ref("data:application/vnd.vidcache.ref+json;base64," + base64.b64encode(b'{"a": 1}').decode())
