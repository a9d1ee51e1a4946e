"""Every row is its own fate: one JSONL full of hostile rows, with good rows between them."""
import json
import os
import threading
import time

import pytest

from vidcache import VideoCache, VideoOptions
from vidcache.loader.fetch import FetchLimits
from vidcache.prewarming import prewarm

from support.cli import EVERYTHING, run_cli


def _hostile_rows(tmp_path, good):
    d = tmp_path / "bad"
    d.mkdir()
    os.symlink(d / "loop_a", d / "loop_b")
    os.symlink(d / "loop_b", d / "loop_a")
    (d / "adir.mp4").mkdir()
    lines = [
        ("good", json.dumps({"prompt": "<video>", "videos": [good[0]]})),
        ("bad_row", "this is not json"),
        ("bad_row", json.dumps([1, 2, 3])),
        ("bad_row", json.dumps("a string")),
        ("bad_row", "null"),
        ("bad_row", json.dumps({"prompt": "<video>", "videos": [None]})),
        ("bad_row", json.dumps({"prompt": "<video>", "videos": {"a": 1}})),
        ("bad_row", json.dumps({"prompt": "<video>", "videos": [{"video": 5}]})),
        ("bad_row", json.dumps({"prompt": "<video>", "videos": [""]})),
        ("bad_row", json.dumps({"prompt": "<video> <video>", "videos": [good[1]]})),
        ("bad_row", json.dumps({"prompt": "<video>", "videos": [{"video": good[1], "fps": "fast"}]})),
        ("bad_row", b'{"prompt": "<video>", "videos": ["\xff\xfe.mp4"]}'),                 # not UTF-8
        ("bad_row", "[" * 100000),                                                          # nests too deep
        ("good", json.dumps({"prompt": "<video>", "videos": [good[1]]})),
        ("invalid_source", json.dumps({"prompt": "<video>", "videos": ["clip\twith tab.mp4"]})),
        ("invalid_source", json.dumps({"prompt": "<video>", "videos": ["clip\u0000nul.mp4"]})),
        ("invalid_source", json.dumps({"prompt": "<video>", "videos": [str(d / "loop_a")]})),
        ("invalid_source", json.dumps({"prompt": "<video>", "videos": [str(d / ("x" * 300 + ".mp4"))]})),
        ("invalid_source", json.dumps({"prompt": "<video>", "videos": ["bad\udcffsurrogate.mp4"]})),
        ("invalid_source", json.dumps({"prompt": "<video>", "videos": [str(d / "adir.mp4")]})),
        ("not_found", json.dumps({"prompt": "<video>", "videos": ["http:file.mp4"]})),
        ("scheme_not_allowed", json.dumps({"prompt": "<video>", "videos": ["ftp://example.invalid/x.mp4"]})),
        ("good", json.dumps({"prompt": [{"role": "user", "content": [{"type": "video", "video": good[2]}]}]})),
    ]
    path = tmp_path / "hostile.jsonl"
    with open(path, "wb") as f:
        for _, line in lines:
            f.write((line if isinstance(line, bytes) else line.encode()) + b"\n")
    return str(path), [kind for kind, _ in lines]


def test_every_good_row_lands_and_every_bad_row_has_its_own_record(tmp_path, videos):
    good = [videos["h264_30"], videos["mjpeg_24"], videos["ffv1_10_small"]]
    ds, kinds = _hostile_rows(tmp_path, good)
    fails = tmp_path / "failures.jsonl"
    cmd = ["prewarm", ds, "--cache", str(tmp_path / "c"), "--workers", "2", "--no-progress", "--failures", str(fails)]
    r = run_cli(cmd, inherit=EVERYTHING, timeout=600)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    got = {rec["row"]: rec for rec in map(json.loads, open(fails))}
    want = {i: k for i, k in enumerate(kinds) if k != "good"}
    assert {i: got[i]["kind"] for i in got} == want
    assert all(got[i]["error"] for i in got)
    assert "3 new" in r.stdout
    c = VideoCache(tmp_path / "c")
    assert len(c.entries()) == 3 and all(c.verify(k) == [] for k in c.entries())
    r = run_cli(cmd + ["--allow-failures"], inherit=EVERYTHING, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "3 hit" in r.stdout


def test_an_unwritable_failures_path_is_refused_before_any_work(tmp_path, videos, count_decodes):
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["ffv1_10_small"]]}) + "\n")
    r = run_cli(["prewarm", str(ds), "--cache", str(tmp_path / "c"),
                 "--failures", str(tmp_path / "no" / "such" / "dir" / "f.jsonl"), "--no-progress"], inherit=EVERYTHING)
    assert r.returncode == 1 and "[config]" in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists(tmp_path / "c" / "lmdb")        # refused at start: nothing was built


def test_hung_endpoints_cost_their_rows_within_the_timeout(tmp_path, videos, hung_endpoint):
    rows = [{"prompt": "<video>", "videos": [f"{hung_endpoint}/clip{i}.mp4"]} for i in range(4)]
    rows.append({"prompt": "<video>", "videos": [videos["ffv1_10_small"]]})
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps(r) + "\n" for r in rows))
    timeout = 2.0
    cache = VideoCache(tmp_path / "c", limits=FetchLimits(timeout_s=timeout))
    t0 = time.monotonic()
    s = prewarm(str(ds), cache, VideoOptions(), workers=2, timeout_s=timeout * 2, progress=False)
    elapsed = time.monotonic() - t0
    assert (s.new, s.failed) == (1, 4)
    assert {f["kind"] for f in s.failures} <= {"fetch_timeout", "timeout"}
    # Fingerprinting happens in the workers, in parallel, under the timeout: the driver never stalls on
    # a hung server.  A correctness bound (rows x timeout / workers, plus worker start-up), not a benchmark.
    assert elapsed < 4 * timeout / 2 + 15


@pytest.fixture
def stalling_server():
    """Sends headers and the first 256 KiB of a body it promises is 4 MiB, then stalls."""
    import http.server

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_HEAD(self):
            self.send_response(200)
            self.send_header("Content-Length", str(4 << 20))
            self.end_headers()

        def do_GET(self):
            self.do_HEAD()
            self.wfile.write(b"\0" * (256 << 10))
            self.wfile.flush()
            time.sleep(30)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_a_killed_workers_partial_download_is_swept(tmp_path, stalling_server):
    from vidcache.loader.tmpdirs import tmp_bytes
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [f"{stalling_server}/big.mp4"]}) + "\n")
    cache = VideoCache(tmp_path / "c", limits=FetchLimits(timeout_s=60))
    s = prewarm(str(ds), cache, VideoOptions(), workers=1, timeout_s=3, progress=False)
    assert [f["kind"] for f in s.failures] == ["timeout"]           # the worker was killed mid-download
    assert "(fetch, decode, write) did not finish within 3" in s.failures[0]["error"]   # not "decoding" (D14)
    assert tmp_bytes(cache.tmp_dir) == 0 and cache.stats()["tmp_bytes"] == 0
