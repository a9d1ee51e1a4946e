"""`vidcache serve`: exact bytes, per-file freeze locks, a bounded pool with timeouts, regular files only,
slow clients (slowloris) bounded by deadlines and a per-address connection cap."""
import contextlib
import http.client
import os
import select
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache.cli import build_parser, main
from vidcache.sglang import frozen, server
from vidcache.sglang.frozen import decode_all, local_frozen_path

UNCACHED = "0" * 32 + ".1." + "f" * 32          # well-formed, never cached
SECRET = b"SECRET BYTES outside the cache " * 8


@pytest.fixture
def cache(tmp_path, videos):
    c = VideoCache(tmp_path / "c")
    c.key1 = c.ensure(videos["ffv1_10_small"], VideoOptions()).key
    c.key2 = c.ensure(videos["ffv1_10_small"], VideoOptions(nframes=4)).key   # same source, another entry
    assert c.key1 != c.key2
    yield c
    c.close()


@contextlib.contextmanager
def serving(cache, **limits):
    srv = server.make_server(cache, **limits)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


def request(srv, method, path, timeout=30):
    """(status, headers, body) of one raw request: http.client sends the path as given (no normalisation)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=timeout)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def read_until_closed(s, limit):
    """What the server sent on ``s`` before closing it (a reset counts as closed); TimeoutError if still open
    after ``limit`` s without a byte."""
    s.settimeout(limit)
    got = b""
    try:
        while chunk := s.recv(65536):
            got += chunk
    except ConnectionResetError:
        pass
    return got


@contextlib.contextmanager
def dripping(srv, n, every=0.2):
    """``n`` connections that each send a request line one byte every ``every`` s and never end it (slowloris).
    The first bytes go out at once: the old server gave a connection a worker on its first byte."""
    socks = [socket.create_connection(srv.server_address[:2]) for _ in range(n)]
    for s in socks:
        s.sendall(b"GET /frozen/")
    stop = threading.Event()

    def drip():
        live = list(socks)
        for _ in range(int(60 / every)):           # bounded: a minute at most
            if stop.wait(every):
                return
            for s in list(live):
                try:
                    s.send(b"a")
                except OSError:                    # closed by the server
                    live.remove(s)
    t = threading.Thread(target=drip, daemon=True)
    t.start()
    try:
        yield socks
    finally:
        stop.set()
        t.join(10)
        for s in socks:
            s.close()


def frozen_dir(cache):
    return os.path.join(cache.path, "frozen")


def fetch_from(srv, address: str, path: str, timeout: float) -> bytes:
    """GET ``path`` from another client address (another loopback IP): its body, once the status is 200."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=timeout,
                                      source_address=(address, 0))
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        assert r.status == 200, r.status
        return r.read()
    finally:
        conn.close()


def file_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def test_get_and_head_serve_the_exact_frozen_file(cache, tmp_path):
    key = cache.key1
    with serving(cache) as (srv, _):
        for suffix, fmt, media_type in ((".mkv", "ffv1", "video/x-matroska"), (".nut", "magicyuv", "video/x-nut")):
            status, headers, body = request(srv, "GET", f"/frozen/{key}{suffix}")
            assert status == 200
            # The server froze it on this first request; the body is that file, byte for byte...
            assert body == file_bytes(local_frozen_path(cache, key, fmt))
            # ...and re-decodes to exactly the cached frames.
            p = tmp_path / f"got{suffix}"
            p.write_bytes(body)
            got, _ = decode_all(str(p), "pyav")
            assert torch.equal(got, cache.frames(key))
            assert headers["Content-Type"] == media_type
            assert headers["Content-Length"] == str(len(body))
            assert headers["ETag"] == f'"{key}"'                      # strong: the content address
            assert "immutable" in headers["Cache-Control"]
            # HEAD: the same headers, no body.
            h_status, h_headers, h_body = request(srv, "HEAD", f"/frozen/{key}{suffix}")
            assert (h_status, h_body) == (200, b"")
            assert {k: h_headers[k] for k in ("Content-Type", "Content-Length", "ETag", "Cache-Control")} == \
                {k: headers[k] for k in ("Content-Type", "Content-Length", "ETag", "Cache-Control")}


def test_reader_of_an_existing_file_does_not_wait_for_another_keys_freeze(cache, monkeypatch):
    local_frozen_path(cache, cache.key1, "ffv1")   # key1.mkv exists; key1.nut and key2.mkv are frozen on request
    started, release = threading.Event(), threading.Event()
    real = frozen.write_frozen

    def slow_write(frames, path, *a, **k):
        if os.path.basename(path).startswith(cache.key2):
            started.set()
            release.wait(60)          # the freeze of key2 stays in progress until the test says so
        return real(frames, path, *a, **k)
    monkeypatch.setattr(frozen, "write_frozen", slow_write)   # local_frozen_path looks it up at call time

    with serving(cache) as (srv, _):
        second = {}
        t = threading.Thread(target=lambda: second.update(r=request(srv, "GET", f"/frozen/{cache.key2}.mkv", 90)))
        t.start()
        try:
            assert started.wait(30), "the freeze of key2 never started"
            # One global lock (the old server) would hold this GET until key2's freeze ends: it would time out.
            status, _, body = request(srv, "GET", f"/frozen/{cache.key1}.mkv", timeout=20)
            assert status == 200 and body == file_bytes(local_frozen_path(cache, cache.key1, "ffv1"))
            # Another file's first freeze proceeds too: the lock is per file, not one for all freezes.
            status, _, body = request(srv, "GET", f"/frozen/{cache.key1}.nut", timeout=60)
            assert status == 200 and body == file_bytes(os.path.join(frozen_dir(cache), cache.key1 + ".nut"))
            assert t.is_alive() and not release.is_set()    # key2's request was still blocked meanwhile
        finally:
            release.set()
            t.join(90)
        assert second["r"][0] == 200
        assert second["r"][2] == file_bytes(os.path.join(frozen_dir(cache), cache.key2 + ".mkv"))


def test_concurrent_first_requests_of_one_file_freeze_it_once(cache, monkeypatch):
    started, release, both_in = threading.Event(), threading.Event(), threading.Event()
    writes, arrivals = [], []
    real = frozen.write_frozen

    def slow_write(frames, path, *a, **k):
        writes.append(path)
        started.set()
        release.wait(60)
        return real(frames, path, *a, **k)
    monkeypatch.setattr(frozen, "write_frozen", slow_write)

    class SpyLocks(server._FileLocks):
        # Records each request that reaches the per-file lock, so the test knows the second one is
        # waiting there (and not, say, still on its way) before it lets the first freeze finish.
        def __call__(self, name):
            arrivals.append(name)
            if len(arrivals) == 2:
                both_in.set()
            return super().__call__(name)
    monkeypatch.setattr(server, "_FileLocks", SpyLocks)

    with serving(cache) as (srv, _):
        results = []
        ts = [threading.Thread(target=lambda: results.append(request(srv, "GET", f"/frozen/{cache.key1}.nut", 90)))
              for _ in range(2)]
        for t in ts:
            t.start()
        try:
            assert started.wait(30) and both_in.wait(30)
        finally:
            release.set()
            for t in ts:
                t.join(90)
    assert [r[0] for r in results] == [200, 200] and results[0][2] == results[1][2]
    assert len(writes) == 1           # the second request found the file its lock-holder wrote


def test_idle_connections_hold_no_thread_and_are_closed(cache):
    local_frozen_path(cache, cache.key1, "ffv1")
    workers, timeout = 4, 1.0
    baseline = threading.active_count()
    # All 51 connections come from 127.0.0.1: the per-client cap is lifted, this test is about threads.
    with serving(cache, workers=workers, timeout_s=timeout, max_per_client=100) as (srv, _):
        idle = [socket.create_connection(srv.server_address[:2]) for _ in range(50)]
        # A client that sends half a request line and stalls: closed after `timeout` of silence, no worker taken.
        stalled = socket.create_connection(srv.server_address[:2])
        stalled.sendall(b"GET /frozen/")
        try:
            # A normal request is served while 50 idle connections are open (they do not occupy the workers).
            status, _, body = request(srv, "GET", f"/frozen/{cache.key1}.mkv", timeout=20)
            assert status == 200 and len(body) > 0
            # Bounded: the serve_forever thread plus at most `workers` pool threads (+1 slack). A thread per
            # connection (the old ThreadingHTTPServer) would add ~51 here.
            assert threading.active_count() <= baseline + 1 + workers + 1
            # The server closes idle and stalled connections after its timeout (generous margin: no timing claim):
            # idle ones with nothing sent, the stalled one with a 408 (it had started a request).
            for s in idle:
                assert read_until_closed(s, timeout * 3 + 2) == b""
            assert read_until_closed(stalled, timeout * 3 + 2).startswith(b"HTTP/1.0 408 ")
            # The pool is free again afterwards.
            assert request(srv, "GET", f"/frozen/{cache.key1}.mkv", timeout=20)[2] == body
        finally:
            for s in idle + [stalled]:
                s.close()


def test_slow_drip_flood_does_not_starve_a_normal_request(cache):
    """D22: 40 connections dripping a byte every 2 s kept the old server's workers (and a normal request timed out
    after 70 s).  Now a connection gets a worker only with its whole request head, so drippers hold none."""
    local_frozen_path(cache, cache.key1, "ffv1")
    workers = 2
    # Deadlines longer than the test: the drippers stay connected throughout, so the 200 below is not
    # owed to their being dropped.  Cap lifted: every connection comes from 127.0.0.1.
    with serving(cache, workers=workers, timeout_s=30, header_timeout_s=30, max_per_client=100) as (srv, _):
        with dripping(srv, 5 * workers) as drippers:
            time.sleep(0.5)                   # the drippers are in (on the old server: holding every worker)
            t0 = time.monotonic()
            status, _, body = request(srv, "GET", f"/frozen/{cache.key1}.mkv", timeout=10)
            elapsed = time.monotonic() - t0
            assert status == 200 and body == file_bytes(local_frozen_path(cache, cache.key1, "ffv1"))
            assert elapsed < 10               # did not hang (the old server: a timeout here)
            assert select.select(drippers, [], [], 0)[0] == []     # all still open: nothing sent, not closed


def test_head_that_never_completes_is_closed_at_the_header_deadline(cache):
    """A per-read timeout never fires on a client that keeps dripping; the head's total deadline does."""
    local_frozen_path(cache, cache.key1, "ffv1")
    header_timeout = 1.0
    with serving(cache, workers=2, timeout_s=30, header_timeout_s=header_timeout) as (srv, _):
        with dripping(srv, 1) as (dripper,):
            t0 = time.monotonic()
            # Closed with a 408 although it never went silent for long (generous bound: "did not hang").
            assert read_until_closed(dripper, 10).startswith(b"HTTP/1.0 408 ")
            assert time.monotonic() - t0 < header_timeout + 8
        assert request(srv, "GET", f"/frozen/{cache.key1}.mkv", timeout=10)[0] == 200


def test_one_address_past_its_cap_is_refused(cache):
    local_frozen_path(cache, cache.key1, "ffv1")
    cap = 3
    with serving(cache, workers=2, timeout_s=30, header_timeout_s=30, max_per_client=cap) as (srv, _):
        held = [socket.create_connection(srv.server_address[:2]) for _ in range(cap)]
        try:
            # One more from the same address: a 503 and a close straight away (no worker, no waiting).
            extra = socket.create_connection(srv.server_address[:2])
            with extra:
                assert read_until_closed(extra, 10).startswith(b"HTTP/1.0 503 ")
            assert select.select(held, [], [], 0)[0] == []          # the held ones are untouched
            held.pop().close()
            # A freed slot is free again once the server has read the hang-up (its next turn: up to 10 s) ...
            deadline = time.monotonic() + 10
            while request(srv, "GET", f"/frozen/{cache.key1}.mkv", timeout=10)[0] != 200:
                assert time.monotonic() < deadline, "the closed connection's slot was never given back"
                time.sleep(0.05)
            # ... and a finished request gives its slot back before its client sees the end: more than `cap`
            # in a row.
            for _ in range(cap + 2):
                assert request(srv, "GET", f"/frozen/{cache.key1}.mkv", timeout=10)[0] == 200
        finally:
            for s in held:
                s.close()


@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_sequential_client_at_its_cap_is_not_refused_while_a_worker_closes(cache, monkeypatch, method):
    """A client one connection under its cap that fetches files one after another must never get a 503, however
    late the worker that served the last one gets round to closing it: the slot is given back before the client
    can see the end of the response (its last byte, or its headers for HEAD).  The close is delayed on purpose
    here; with the slot given back only at the close, every request after the first got a 503."""
    local_frozen_path(cache, cache.key1, "ffv1")
    real_close = server.FrozenFileServer._close

    def late_close(self, conn, addr):
        if threading.current_thread().name.startswith("vidcache-serve"):
            time.sleep(0.3)                   # a worker descheduled between its last write and its close
        real_close(self, conn, addr)
    monkeypatch.setattr(server.FrozenFileServer, "_close", late_close)
    cap = 2
    with serving(cache, workers=2, timeout_s=30, header_timeout_s=30, max_per_client=cap) as (srv, _):
        held = socket.create_connection(srv.server_address[:2])        # one of the two slots, held throughout
        try:
            statuses = [request(srv, method, f"/frozen/{cache.key1}.mkv", timeout=10)[0] for _ in range(4)]
        finally:
            held.close()
    assert statuses == [200] * 4


def test_slow_reader_is_cut_off_at_the_response_deadline(cache, monkeypatch):
    """A client that reads a trickle makes progress within every per-write timeout; the response's total
    deadline (timeout_s + size / min_rate) still frees the worker."""
    path = local_frozen_path(cache, cache.key1, "ffv1")
    size = os.path.getsize(path)
    real_get_request = server.FrozenFileServer.get_request

    def small_send_buffer(self):
        # Loopback would take the whole file into kernel buffers at once; a fixed small one makes the
        # server wait on the reader, as a real network does.
        conn, addr = real_get_request(self)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        return conn, addr
    monkeypatch.setattr(server.FrozenFileServer, "get_request", small_send_buffer)
    # Deadline: timeout_s (3 s) + size / min_rate (nothing).  timeout_s is long enough for the trickle below
    # to free send-buffer space within every per-write wait: the old server never timed it out.
    with serving(cache, workers=1, timeout_s=3, min_rate=1e9) as (srv, _):
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)   # a small window: the server waits on it
        slow.connect(srv.server_address[:2])
        stop, got = threading.Event(), []

        def trickle():
            for _ in range(300):             # bounded: 1 KiB every 0.1 s, 30 s at most
                if stop.wait(0.1) or not (chunk := slow.recv(1024)):
                    return
                got.append(len(chunk))
        slow.sendall(f"GET /frozen/{cache.key1}.mkv HTTP/1.0\r\n\r\n".encode())
        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            # The only worker is free again well before the trickle could have taken the whole file.
            status, _, body = request(srv, "GET", f"/frozen/{cache.key1}.mkv", timeout=15)
            assert status == 200 and len(body) == size
            assert t.is_alive()              # the slow reader was still reading meanwhile
        finally:
            stop.set()
            t.join(10)
        # It was cut off: what it read plus what was still on its way is less than headers + file.
        rest = read_until_closed(slow, 10)
        slow.close()
        assert sum(got) + len(rest) < size


def test_symlinks_are_never_followed(cache, tmp_path):
    secret = tmp_path / "secret.mkv"
    secret.write_bytes(SECRET)
    d = frozen_dir(cache)
    os.makedirs(d, exist_ok=True)
    # A link at a key-shaped name whose key is not cached: 404 (the old server served the secret).
    os.symlink(secret, os.path.join(d, UNCACHED + ".mkv"))
    with serving(cache) as (srv, _):
        for method in ("GET", "HEAD"):
            status, _, body = request(srv, method, f"/frozen/{UNCACHED}.mkv")
            assert status == 404 and SECRET not in body
        # The key is cached, but its frozen file was replaced by a link to the secret: refused, not followed.
        real = local_frozen_path(cache, cache.key1, "ffv1")
        os.symlink(secret, real + ".link")
        os.replace(real + ".link", real)
        status, _, body = request(srv, "GET", f"/frozen/{cache.key1}.mkv")
        assert status == 500 and SECRET not in body
        # Nor a FIFO (O_NONBLOCK: the open does not hang waiting for a writer) or a directory.
        os.mkfifo(os.path.join(d, cache.key1 + ".nut"))
        os.mkdir(os.path.join(d, cache.key2 + ".mkv"))
        for name in (cache.key1 + ".nut", cache.key2 + ".mkv"):
            assert request(srv, "GET", f"/frozen/{name}", timeout=20)[0] == 500
        # Traversal: only /frozen/<key><suffix> matches, so encoded or plain dot-dots are unknown paths.
        for path in ("/frozen/../../secret.mkv", "/frozen/%2e%2e/%2e%2e/secret.mkv", "/frozen/..%2f..%2fsecret.mkv",
                     f"/frozen/{cache.key1}.mkv/../../../secret.mkv", f"/frozen/{UNCACHED}.mkv/..",
                     "/../secret.mkv", f"/frozen/{cache.key1.upper()}.mkv", f"/frozen/{cache.key1}.MKV"):
            status, _, body = request(srv, "GET", path)
            assert status == 404 and SECRET not in body, path


def test_unknown_key_is_404_and_creates_nothing(cache, monkeypatch):
    writes = []
    monkeypatch.setattr(frozen, "write_frozen", lambda *a, **k: writes.append(a[1]))
    with serving(cache) as (srv, base):
        for method in ("GET", "HEAD"):
            for suffix in (".mkv", ".nut"):
                assert request(srv, method, f"/frozen/{UNCACHED}{suffix}")[0] == 404
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"{base}/nothing")
        assert e.value.code == 404
    assert writes == []
    assert not os.path.exists(frozen_dir(cache)) or os.listdir(frozen_dir(cache)) == []


def test_limits_are_checked():
    with pytest.raises(ValueError):
        server.FrozenFileServer(("127.0.0.1", 0), None, workers=0, timeout_s=1)
    with pytest.raises(ValueError):
        server.FrozenFileServer(("127.0.0.1", 0), None, workers=1, timeout_s=0)
    for bad in ({"header_timeout_s": 0}, {"min_rate": 0}, {"max_per_client": 0}, {"max_workers_per_client": 0}):
        with pytest.raises(ValueError):
            server.FrozenFileServer(("127.0.0.1", 0), None, workers=1, timeout_s=1, **bad)


def test_cli_serve_passes_workers_and_timeout(tmp_path, monkeypatch, capsys):
    calls = []

    class Fake:
        server_address, workers, timeout_s = ("127.0.0.1", 1), 3, 2.5

        def serve_forever(self):
            raise KeyboardInterrupt      # what Ctrl-C does

        def server_close(self):
            calls.append("closed")

    def fake_make_server(cache, host, port, **limits):
        calls.append(limits)
        return Fake()
    monkeypatch.setattr(server, "make_server", fake_make_server)   # cmd_serve imports it at call time
    base = ["serve", "--cache", str(tmp_path / "c"), "--port", "0"]
    assert main(base + ["--workers", "3", "--timeout", "2.5"]) == 0
    assert calls == [{"workers": 3, "timeout_s": 2.5}, "closed"]
    calls.clear()
    assert main(base) == 0
    assert calls == [{}, "closed"]       # make_server's defaults apply
    # The help text states the defaults that make_server applies.
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"default {server.DEFAULT_WORKERS})" in help_text
    assert f"default {server.DEFAULT_TIMEOUT_S:g})" in help_text


def test_cli_serve_passes_the_slow_client_limits(tmp_path, monkeypatch, capsys):
    calls = []

    class Fake:
        server_address, workers, timeout_s = ("127.0.0.1", 1), 3, 2.5

        def serve_forever(self):
            raise KeyboardInterrupt

        def server_close(self):
            pass

    monkeypatch.setattr(server, "make_server", lambda cache, host, port, **limits: calls.append(limits) or Fake())
    assert main(["serve", "--cache", str(tmp_path / "c"), "--port", "0", "--header-timeout", "4",
                 "--min-rate", "5000", "--max-per-client", "2", "--max-workers-per-client", "3"]) == 0
    assert calls == [{"header_timeout_s": 4.0, "min_rate": 5000.0, "max_per_client": 2, "max_workers_per_client": 3}]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for flag, default in (("--header-timeout", f"{server.DEFAULT_HEADER_TIMEOUT_S:g}"),
                          ("--min-rate", f"{server.DEFAULT_MIN_RATE}"),
                          ("--max-per-client", f"{server.DEFAULT_MAX_PER_CLIENT}")):
        assert flag in help_text and f"default {default})" in help_text, flag


def test_one_address_with_slow_readers_leaves_workers_for_another(cache, monkeypatch):
    """D34: the per-client connection cap (32) is above the pool (16), so one address's slow readers held every
    worker and another address waited ~37 s.  Now one address occupies at most its share of the workers (half);
    its further requests are held, not refused, and another address is served while the slow reads go on."""
    path = local_frozen_path(cache, cache.key1, "ffv1")
    size = os.path.getsize(path)
    real_get_request = server.FrozenFileServer.get_request

    def small_send_buffer(self):       # as in the test above: the server waits on a slow reader, as on a network
        conn, addr = real_get_request(self)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16384)
        return conn, addr
    monkeypatch.setattr(server.FrozenFileServer, "get_request", small_send_buffer)
    workers = 2
    # Response deadlines far beyond the test (min_rate 1 B/s): a slow reader keeps its worker until it hangs up,
    # so the other address's 200 below is not owed to a slow reader being cut off.
    with serving(cache, workers=workers, timeout_s=30, header_timeout_s=30, min_rate=1) as (srv, _):
        slow = []
        for _ in range(workers):       # as many slow GETs from 127.0.0.1 as there are workers
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(srv.server_address[:2])
            s.sendall(f"GET /frozen/{cache.key1}.mkv HTTP/1.0\r\n\r\n".encode())
            slow.append(s)
        stop, got = threading.Event(), [0] * workers

        def trickle(i):
            slow[i].settimeout(0.2)
            while not stop.wait(0.2):      # 512 B every 0.2 s: the file takes minutes
                with contextlib.suppress(TimeoutError):
                    if not (chunk := slow[i].recv(512)):
                        return
                    got[i] += len(chunk)
        threads = [threading.Thread(target=trickle, args=(i,), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 10
            while not any(got):            # a slow reader is in a worker, being sent its file
                assert time.monotonic() < deadline, "no slow reader was ever served"
                time.sleep(0.05)
            assert fetch_from(srv, "127.0.0.2", f"/frozen/{cache.key1}.mkv", timeout=15) == file_bytes(path)
            # Served while the slow reads went on: neither had its file, both still connected.
            assert all(t.is_alive() for t in threads) and max(got) < size
            # The slow address's second request was held, not refused: it starts once the first hangs up.
            first = got.index(max(got))
            stop.set()
            for t in threads:
                t.join(10)
            slow[first].close()
            assert got[1 - first] == 0     # (the default share of 2 workers: 1)
            assert read_until_closed(slow[1 - first], 20).startswith(b"HTTP/1.0 200 ")
        finally:
            stop.set()
            for s in slow:
                s.close()


def _small_send_buffers(monkeypatch) -> None:
    """The server's sends block on a slow reader, as on a network (the loopback's buffers would hold the file)."""
    real_get_request = server.FrozenFileServer.get_request

    def small_send_buffer(self):
        conn, addr = real_get_request(self)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        return conn, addr
    monkeypatch.setattr(server.FrozenFileServer, "get_request", small_send_buffer)


def _slow_readers(srv, cache, hosts, slow: list) -> None:
    """From each of ``hosts``, four GETs that are never read (each holds a worker for as long as it lives),
    appended to ``slow``; returns once the server holds every one of them (in a worker or queued)."""
    for host in hosts:
        for _ in range(4):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.bind((host, 0))
            s.connect(srv.server_address[:2])
            s.sendall(f"GET /frozen/{cache.key1}.mkv HTTP/1.0\r\n\r\n".encode())
            slow.append(s)
        deadline = time.monotonic() + 20
        while srv._in_workers.get(host, 0) == 0 or sum(len(q) for q in srv._held.values()) + sum(
                srv._in_workers.values()) < len(slow):
            assert time.monotonic() < deadline, "the slow requests never reached the server"
            time.sleep(0.05)


def test_two_addresses_with_slow_readers_leave_workers_for_a_third(cache, monkeypatch):
    """D50 (D34 residual): each address could occupy half the pool, so two addresses of slow readers held every
    worker and a third waited 35.7 s.  An address now gets at most half of what the others leave free: with 4
    workers and 4 slow GETs from each of two addresses, a third address is served while they all still read."""
    path = local_frozen_path(cache, cache.key1, "ffv1")
    _small_send_buffers(monkeypatch)
    assert os.path.getsize(path) > 64 << 10            # larger than every buffer between: the sends block
    slow = []
    with serving(cache, workers=4, timeout_s=60, header_timeout_s=60, min_rate=1) as (srv, _):
        try:
            _slow_readers(srv, cache, ("127.0.0.1", "127.0.0.3"), slow)
            assert fetch_from(srv, "127.0.0.2", f"/frozen/{cache.key1}.mkv", timeout=20) == file_bytes(path)
            assert sum(srv._in_workers.get(h, 0) for h in ("127.0.0.1", "127.0.0.3")) < 4   # a worker was left
        finally:
            for s in slow:
                s.close()


def test_a_new_address_is_served_however_many_addresses_hold_the_pool(cache, monkeypatch):
    """D50 residual: the share rule (half of what the others leave free) still let enough addresses fill the pool:
    with 16 workers, slow readers from five addresses made a sixth wait 34.3 s.  Now an address holding no
    worker gets one at once, past the pool if need be: with 4 workers filled by three addresses (2 + 1 + 1) of
    never-reading GETs, a fourth address is served while every one of them still holds its worker."""
    path = local_frozen_path(cache, cache.key1, "ffv1")
    _small_send_buffers(monkeypatch)
    assert os.path.getsize(path) > 64 << 10            # larger than every buffer between: the sends block
    hosts = ("127.0.0.1", "127.0.0.3", "127.0.0.4")
    slow = []
    with serving(cache, workers=4, timeout_s=60, header_timeout_s=60, min_rate=1) as (srv, _):
        try:
            _slow_readers(srv, cache, hosts, slow)
            assert sum(srv._in_workers.get(h, 0) for h in hosts) == 4        # the whole pool is theirs
            assert fetch_from(srv, "127.0.0.2", f"/frozen/{cache.key1}.mkv", timeout=20) == file_bytes(path)
            assert sum(srv._in_workers.get(h, 0) for h in hosts) == 4        # and still is: none was let go
        finally:
            for s in slow:
                s.close()
