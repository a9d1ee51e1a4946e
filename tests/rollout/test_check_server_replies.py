"""D60: `check-server` against hostile stand-ins on loopback (a real socket server writing raw HTTP): a server that
drips its reply a byte at a time is given up on at the check's one deadline (`--timeout`), and a reply nested 2M
deep, with more than 100 headers, or not a JSON object is a `[server]` failure, never a traceback.

No engine is needed: every case fails at the first request (SGLang's /server_info, vLLM's /version), before any
processor or canary.  Nothing here asserts on time: a check that never gives up hangs until run_cli's own limit,
which fails the test; the stand-in counts what it got to send."""
from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager

import pytest

from support.cli import SHELL, run_cli

from vidcache.rollout.check import ServerReplyError, ServerTimeoutError, check_deadline, http_json

PROMISED = 100_000                     # the drip's Content-Length: a day's reply at the stand-in's pace


def _head(status: str = "200 OK", extra: bytes = b"", length: int | None = None) -> bytes:
    cl = b"" if length is None else b"Content-Length: %d\r\n" % length
    return f"HTTP/1.1 {status}\r\n".encode() + b"Content-Type: application/json\r\n" + cl + extra + b"\r\n"


def _deep() -> bytes:
    return b"[" * 2_000_000 + b"]" * 2_000_000


REPLIES = {                            # mode -> the whole reply, sent at once
    "deep": lambda: _head(length=4_000_000) + _deep(),
    "headers": lambda: _head(extra=b"".join(b"X-Flood-%d: x\r\n" % i for i in range(150)), length=2) + b"{}",
    "list": lambda: _head(length=3) + b"[1]",
    "deep_error": lambda: _head("500 Internal Server Error", length=4_000_000) + _deep(),
}


def _request_length(buf: bytes) -> int:
    head, _, _ = buf.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(head) + 4


class Sent(list):
    connections = 0


@contextmanager
def hostile(mode: str):
    """A loopback server answering every request per ``mode``: one of REPLIES, or ``drip_body`` / ``drip_head``
    (a byte every 0.1 s of a 200 reply promising PROMISED bytes, after or before its head).  Yields
    (url, sent): sent gets, per connection, the bytes written before the client hung up (or the stand-in
    stopped); ``sent.connections`` counts the connections made."""
    lsock = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    sent = Sent()

    def serve(conn: socket.socket) -> None:
        n = 0
        try:
            conn.settimeout(30)
            buf = b""
            while b"\r\n\r\n" not in buf or len(buf) < _request_length(buf):   # the whole request: closing
                chunk = conn.recv(65536)                                     # on unread bytes resets
                if not chunk:
                    return
                buf += chunk
            if mode in REPLIES:
                conn.sendall(REPLIES[mode]())
                return
            head = _head(length=PROMISED)
            if mode == "drip_body":
                conn.sendall(head)
            data = (head if mode == "drip_head" else b"") + b" " * PROMISED
            for i in range(len(data)):             # a bound of its own, so an unfixed check ends too
                if stop.wait(0.1):
                    break
                conn.sendall(data[i:i + 1])
                n += 1
        except OSError:                            # the client hung up: what it was sent is counted below
            pass
        finally:
            sent.append(n)
            conn.close()

    def accept() -> None:
        lsock.settimeout(0.2)                      # a close from another thread does not wake accept()
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            sent.connections += 1
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{lsock.getsockname()[1]}", sent
    finally:
        stop.set()
        t.join()
        lsock.close()


def _check(url, tmp_path, *args):
    return run_cli(["check-server", url, *args], tmp_path / "node", inherit=SHELL, env={"HF_HUB_OFFLINE": "1"},
                   timeout=120)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
@pytest.mark.parametrize("mode", ["drip_body", "drip_head"])
def test_cli_check_server_gives_up_on_a_dripping_server_at_its_deadline(tmp_path, engine, mode):
    """Before: no deadline but urlopen's per-read 60 s, which a byte every 0.1 s never trips (the review's check
    was still running at 80 s of an estimated 28 h).  Now `--timeout 2` is the whole check's bound."""
    with hostile(mode) as (url, sent):
        r = _check(url, tmp_path, "--engine", engine, "--family", "qwen2_5_vl", "--timeout", "2",
                   *(["--mode", "stock"] if engine == "sglang" else []))
        deadline = time.monotonic() + 10
        while not sent and time.monotonic() < deadline:     # the stand-in notices the hang-up on its next byte
            time.sleep(0.1)
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    assert r.returncode == 1 and fails and fails[0].startswith("FAIL [server]"), r.stdout + r.stderr
    assert "had not replied in full" in fails[0] and "--timeout" in fails[0], fails
    assert "Traceback" not in r.stderr, r.stderr
    assert sent and sent[0] < PROMISED, sent                # given up on, not read to the end


@pytest.mark.parametrize("mode, says", [("deep", "nested too deeply"), ("headers", "malformed HTTP response"),
                                        ("list", "a JSON list, not an object")])
def test_cli_check_server_names_a_malformed_reply_as_a_server_failure(tmp_path, mode, says):
    """Before: a 2M-deep JSON array raised RecursionError and 150 headers http.client.HTTPException ("got more
    than 100 headers"), each a traceback with rc 1; a JSON list an AttributeError."""
    with hostile(mode) as (url, _):
        r = _check(url, tmp_path, "--family", "qwen2_5_vl", "--mode", "stock", "--timeout", "60")
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    assert r.returncode == 1 and fails and fails[0].startswith("FAIL [server]"), r.stdout + r.stderr
    assert says in fails[0], fails
    assert "Traceback" not in r.stderr, r.stderr


def test_one_deadline_bounds_every_request_of_a_check():
    """The canary's /generate is asked outside the first requests' try: its errors are ServerReplyError, whose
    kind the CLI prints as `[server]`.  Inside check_deadline, a call's own longer timeout does not extend it,
    and once the deadline has passed a further request is not even sent."""
    with hostile("drip_body") as (url, sent):
        with check_deadline(1.0):
            with pytest.raises(ServerTimeoutError) as e:
                http_json(url + "/generate", {"input_ids": [1]}, timeout=600)
            assert e.value.kind == "server"
            with pytest.raises(ServerTimeoutError, match="no time left"):
                http_json(url + "/generate", {"input_ids": [1]}, timeout=600)
        assert sent.connections == 1                             # the second was never sent
    with hostile("deep_error") as (url, _):
        status, body = http_json(url + "/generate", {"input_ids": [1]})
    assert status == 500 and set(body) == {"error"}          # an error's unreadable body is its message, cut
    assert len(body["error"]["message"]) == 2000
    with hostile("deep") as (url, _):
        with pytest.raises(ServerReplyError, match="nested too deeply"):
            http_json(url + "/generate", {"input_ids": [1]})
