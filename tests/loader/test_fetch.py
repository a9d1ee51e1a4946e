"""Sources through fsspec: local, file://, http(s) on loopback, S3 on a moto server, data: URIs."""
import base64
import functools
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
import xxhash

import vidcache.cache as cache_mod
from support.net import free_port
from vidcache import VideoCache, VideoOptions
from vidcache.digest import Digest
from vidcache.errors import (FetchTimeoutError, InvalidSourceError, SchemeNotAllowedError, SourceNotFoundError,
                             SourceTooLargeError, SourceUnavailableError)
from vidcache.loader.fetch import FetchLimits, fetch, fingerprint, scheme_of
from vidcache.loader.tmpdirs import run_tmp_dir, sweep_stale, tmp_bytes


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


# --- HTTP servers that ignore Range, hang, or stall ----------------------------------------------------------
BODY = os.urandom(5_000_000)            # clip-sized: several of fsspec's blocks; random bytes, so no guessing


class _RawHandler(http.server.BaseHTTPRequestHandler):
    """Serves BODY whole whatever Range says: /len/ with Content-Length, /nolen/ without (ends at close),
    /stall/ sends headers and 64 KiB, then never finishes; /status/N answers HTTP N."""
    release = threading.Event()

    def log_message(self, *a):
        pass

    def _headers(self):
        if self.path.startswith("/nolen/") or self.path.startswith("/len/") or self.path.startswith("/stall/"):
            self.send_response(200)
            if not self.path.startswith("/nolen/"):
                self.send_header("Content-Length", str(len(BODY)))
            self.end_headers()
            return True
        self.send_error(int(self.path.split("/")[2]) if self.path.startswith("/status/") else 404)
        return False

    def do_HEAD(self):
        self._headers()

    def do_GET(self):
        if self._headers():
            if self.path.startswith("/stall/"):
                self.wfile.write(BODY[:65536])
                self.wfile.flush()
                self.release.wait(60)
                return
            self.wfile.write(BODY)


@pytest.fixture(scope="module")
def raw_http():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RawHandler)   # HTTP/1.0: a body may end at close
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    _RawHandler.release.set()
    srv.shutdown()


@pytest.fixture(scope="module")
def hung_url():
    """A port whose connections the kernel completes (listen backlog) but nobody ever answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    yield f"http://127.0.0.1:{s.getsockname()[1]}/clip.mp4"
    s.close()


@pytest.mark.parametrize("route", ["len", "nolen"])
def test_http_without_range_support_streams_the_whole_body(raw_http, tmp_path, route):
    f = fetch(f"{raw_http}/{route}/clip.bin", FetchLimits(), tmp_dir=str(tmp_path))
    try:
        assert f.temporary and f.digest == Digest(xxhash.xxh3_128_hexdigest(BODY), len(BODY))
        assert open(f.path, "rb").read() == BODY
    finally:
        f.cleanup()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("route", ["len", "nolen"])
def test_http_size_cap_applies_while_streaming(raw_http, tmp_path, route):
    with pytest.raises(SourceTooLargeError, match="cap"):
        fetch(f"{raw_http}/{route}/clip.bin", FetchLimits(max_bytes=len(BODY) - 1), tmp_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []        # the partial download is removed


@pytest.mark.parametrize("call", [fingerprint, fetch])
def test_hung_http_server_is_a_fetch_timeout(hung_url, tmp_path, call):
    limits = FetchLimits(timeout_s=1.2)
    t0 = time.monotonic()
    with pytest.raises(FetchTimeoutError) as e:
        call(hung_url, limits)
    # A correctness bound, not a benchmark: fsspec's HEAD-then-GET (then open()'s GET) would each take a
    # whole timeout, and a swallowed cancellation runs to the next whole second (fsspec's sync() polls
    # once a second); under 1.5 timeouts proves the one deadline covers them all.
    assert e.value.kind == "fetch_timeout" and time.monotonic() - t0 < 1.5 * limits.timeout_s


def test_stalled_http_body_is_a_fetch_timeout(raw_http, tmp_path):
    limits = FetchLimits(timeout_s=1.2)
    t0 = time.monotonic()
    with pytest.raises(FetchTimeoutError):
        fetch(f"{raw_http}/stall/clip.bin", limits, tmp_dir=str(tmp_path))
    assert time.monotonic() - t0 < 1.5 * limits.timeout_s and os.listdir(tmp_path) == []


@pytest.mark.parametrize("call", [fingerprint, fetch])
@pytest.mark.parametrize("status,error", [(404, SourceNotFoundError), (410, SourceNotFoundError),
                                          (403, SourceUnavailableError), (500, SourceUnavailableError)])
def test_http_status_is_judged_under_fsspecs_file_not_found(raw_http, status, error, call):
    # fsspec's info() wraps every failure in FileNotFoundError; a 500 is not "not found".
    with pytest.raises(error, match=str(status)) as e:
        call(f"{raw_http}/status/{status}/clip.mp4", FetchLimits(timeout_s=5.0))
    assert e.value.kind == error.kind


def test_cache_reports_a_hung_server_as_fetch_timeout(tmp_path, hung_url):
    c = VideoCache(tmp_path / "c", limits=FetchLimits(timeout_s=1.0))
    with pytest.raises(FetchTimeoutError):
        c.ensure(hung_url, VideoOptions())
    assert c.stats()["entries"] == 0


# --- what a source may be ------------------------------------------------------------------------------------
def _special_files(tmp_path):
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    os.mkdir(tmp_path / "dir")
    os.mkfifo(tmp_path / "fifo")
    return str(tmp_path)


# name -> (source made from a directory holding a symlink loop, a directory and a FIFO; the expected error)
BAD_SOURCES = {
    "not a str": (lambda d: b"/a.mp4", InvalidSourceError),
    "None": (lambda d: None, InvalidSourceError),
    "empty": (lambda d: "", InvalidSourceError),
    "blank": (lambda d: "  ", InvalidSourceError),
    "tab in path": (lambda d: d + "/a\tb.mp4", InvalidSourceError),
    "NUL in path": (lambda d: d + "/a\0b.mp4", InvalidSourceError),
    "NUL in file URI": (lambda d: f"file://{d}/a%00b.mp4", InvalidSourceError),
    "tab in URL": (lambda d: "http://127.0.0.1:1/a\tb.mp4", InvalidSourceError),
    "lone surrogate": (lambda d: json.loads(f'"{d}/\\udcff.mp4"'), InvalidSourceError),
    "symlink loop": (lambda d: d + "/loop", InvalidSourceError),
    "name too long": (lambda d: d + "/" + "x" * 300 + ".mp4", InvalidSourceError),
    "directory": (lambda d: d + "/dir", InvalidSourceError),
    "directory URI": (lambda d: f"file://{d}/dir", InvalidSourceError),
    "fifo": (lambda d: d + "/fifo", InvalidSourceError),          # a plain open() would wait for a writer
    "file URI of another host": (lambda d: f"file://otherhost{d}/a.mp4", InvalidSourceError),
    "missing": (lambda d: d + "/missing.mp4", SourceNotFoundError),
    "bad IPv6 host": (lambda d: "http://[bad/x.mp4", InvalidSourceError),
    "port out of range": (lambda d: "http://127.0.0.1:99999/x.mp4", InvalidSourceError),
    "chained URL": (lambda d: "simplecache::http://127.0.0.1:1/x.mp4", SchemeNotAllowedError),
    "unknown scheme": (lambda d: "ftp://example.invalid/x.mp4", SchemeNotAllowedError),
}


@pytest.mark.parametrize("call", [fingerprint, fetch])
@pytest.mark.parametrize("name", BAD_SOURCES)
def test_bad_sources_raise_specific_errors(tmp_path, name, call):
    make, error = BAD_SOURCES[name]
    with pytest.raises(error) as e:
        call(make(_special_files(tmp_path)), FetchLimits(timeout_s=5.0))
    assert e.value.kind == error.kind          # not a subclass with another kind


def test_bad_source_is_a_row_error_in_the_cache(cache, tmp_path):
    for source in (json.loads('"\\udcff.mp4"'), str(tmp_path), 7):
        with pytest.raises(InvalidSourceError):
            cache.ensure(source, VideoOptions())


def test_allowlist_checks_what_fsspec_opens(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "http:clip.mp4").write_bytes(b"local bytes")     # fsspec reads "http:x" (no //) as a local path
    web_only = FetchLimits(schemes=("http", "https"))
    for call in (fingerprint, fetch):
        with pytest.raises(SchemeNotAllowedError, match="'file'"):
            call("http:clip.mp4", web_only)
    assert [scheme_of(s) for s in ("http:clip.mp4", "HTTP://h/x", "DATA:,x", "file:///x", "/x", 7)] == \
        ["file", "http", "data", "file", "file", ""]
    assert fetch("http:clip.mp4").digest == Digest.of(b"local bytes")   # with file allowed, it is that file


def test_scheme_is_case_insensitive(raw_http, tmp_path, cache, http_root):
    upper = raw_http.replace("http://", "HTTP://") + "/len/clip.bin"
    f = fetch(upper, FetchLimits(), tmp_dir=str(tmp_path))
    f.cleanup()
    assert f.digest == Digest.of(BODY)
    assert fingerprint(upper) is None          # reached the server: no ETag there, so no validators
    with pytest.raises(SchemeNotAllowedError):
        fetch(upper, FetchLimits(schemes=("file",)))
    url, _ = http_root
    lower = cache.ensure(url + "/clip.mp4", VideoOptions())
    assert cache.ensure(url.replace("http", "HTTP", 1) + "/clip.mp4", VideoOptions()).key == lower.key
    data = base64.b64encode(b"some bytes").decode()
    assert fetch("DATA:application/octet-stream;base64," + data).digest == Digest.of(b"some bytes")


def test_ipv6_host_is_not_split_as_a_chain(tmp_path):
    if not socket.has_ipv6:
        pytest.skip("no IPv6 in this Python build")
    class V6Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6
    try:
        srv = V6Server(("::1", 0), _RawHandler)
    except OSError as e:
        pytest.skip(f"cannot listen on ::1 here: {e}")
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        f = fetch(f"http://[::1]:{srv.server_address[1]}/len/clip.bin", FetchLimits(), tmp_dir=str(tmp_path))
        f.cleanup()
        assert f.digest == Digest.of(BODY)
    finally:
        srv.shutdown()


# --- per-process temp areas ----------------------------------------------------------------------------------
_CHILD = """
import sys, time
from vidcache.loader.tmpdirs import run_tmp_dir
d = run_tmp_dir(sys.argv[1])
open(d + "/fetch-partial.video", "wb").write(b"x" * 12345)
print(d, flush=True)
time.sleep(600)
"""


def _child(base):
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(base)], stdout=subprocess.PIPE, text=True)
    return p, p.stdout.readline().strip()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="liveness is judged from /proc (Linux)")
def test_sweep_removes_only_dead_processes_run_dirs(tmp_path):
    base = tmp_path / "tmp"
    killed, killed_dir = _child(base)
    alive, alive_dir = _child(base)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        mine = run_tmp_dir(str(base))
        open(os.path.join(mine, "x"), "wb").write(b"y" * 100)
        pid, start, ns = os.path.basename(mine).split("-")
        reused = base / f"{pid}-{int(start) + 1}-{ns}"           # this pid, but another process's start time
        reused.mkdir()
        (reused / "old").write_bytes(b"z" * 7)
        foreign = base / f"{killed.pid}-1-{int(ns) + 1}"          # another pid namespace: cannot be judged
        foreign.mkdir()
        (base / "notes").mkdir()                                  # not a run directory: left alone
        assert tmp_bytes(str(base)) == 2 * 12345 + 100 + 7
        assert sweep_stale(str(base)) == 12345 + 7
        assert sorted(os.listdir(base)) == sorted([os.path.basename(alive_dir), os.path.basename(mine),
                                                   foreign.name, "notes"])
        assert not os.path.exists(killed_dir) and os.path.exists(alive_dir)
        assert sweep_stale(str(base)) == 0
    finally:
        alive.kill()
        alive.wait()
    assert sweep_stale(str(base)) == 12345 and not os.path.exists(alive_dir)


def test_legacy_loose_temp_files_are_swept_when_old(tmp_path):
    old, new = tmp_path / "fetch-abc.video", tmp_path / "fetch-def.video"
    old.write_bytes(b"o" * 10)
    new.write_bytes(b"n" * 3)
    os.utime(old, (time.time() - 2 * 86400,) * 2)
    if os.path.exists("/proc/self/stat"):
        assert sweep_stale(str(tmp_path)) == 10 and os.listdir(tmp_path) == [new.name]
    assert sweep_stale(str(tmp_path / "absent")) == 0 and tmp_bytes(str(tmp_path / "absent")) == 0


def test_a_local_source_that_changes_while_it_is_decoded_caches_nothing(tmp_path, videos, monkeypatch):
    """D35: the decoder reopens a local source by name after it was hashed; if the file changed meanwhile
    (a file still being written), frames of other bytes would be cached under the digest.  The entry is refused
    (SourceChangedError, a row failure of its own kind) and nothing is cached; once the file holds still it
    builds, under the digest of what it now is."""
    import shutil

    import vidcache.loader.build as build
    from vidcache import VideoCache, VideoOptions
    from vidcache.errors import SourceChangedError
    src = tmp_path / "growing.mp4"
    shutil.copy(videos["h264_30"], src)
    real = build.decode_sample_resize

    def decode_then_grow(path, *a, **k):
        out = real(path, *a, **k)
        with open(path, "ab") as f:          # the writer appends while the row is being built
            f.write(b"\0" * 4096)
        return out

    c = VideoCache(tmp_path / "node")
    monkeypatch.setattr(build, "decode_sample_resize", decode_then_grow)
    with pytest.raises(SourceChangedError, match="changed while it was hashed and decoded"):
        c.ensure(str(src), VideoOptions())
    assert c.entries() == []
    monkeypatch.setattr(build, "decode_sample_resize", real)
    key = c.ensure(str(src), VideoOptions()).key
    assert c.entries() == [key] and key.split(".")[1] == str(src.stat().st_size)
