"""Issue 51 item 3: `check-server` names the common mistakes, through the CLI on a fresh node, against loopback
stand-ins speaking each engine's discovery endpoints (no engine needed: each case ends before any canary).

* a vLLM (OpenAI) server checked as SGLang: "looks like a vLLM server: --engine vllm" (it was "SGLang None ...
  --allow-unverified-sglang None");
* a server that answers 404 everywhere, checked with --engine vllm: a [server] failure naming the endpoints (it was
  `KeyError('id')`);
* a URL without http://: a [config] error showing the fix (it was urllib's "unknown url type");
* a served model named by its hub id: found in this machine's Hugging Face cache, as from_pretrained finds it (it
  was "not a directory here").
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from http.server import ThreadingHTTPServer

import pytest

from support.cli import run_cli
from support.json_http import JSONHandler


@contextmanager
def standin(routes: dict):
    """A loopback HTTP server: GET or POST path -> (status, JSON body); anything else 404."""
    class H(JSONHandler):
        def do_GET(self):       # noqa: N802
            self.reply(*routes.get(self.path, (404, {"detail": "Not Found"})))

        do_POST = do_GET        # noqa: N815
    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


VLLM = {"/version": (200, {"version": "0.34.0"}),
        "/v1/models": (200, {"object": "list", "data": [{"id": "Qwen/Qwen2.5-VL-7B-Instruct",
                                                        "root": "Qwen/Qwen2.5-VL-7B-Instruct"}]})}


def test_a_vllm_server_checked_as_sglang_is_named(tmp_path):
    with standin(VLLM) as url:
        r = run_cli(["check-server", url, "--timeout", "60"], tmp_path / "node")
    assert r.returncode == 1, r.stdout + r.stderr
    fail = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL [server]")]
    assert fail and "looks like a vLLM" in fail[0] and "--engine vllm" in fail[0], r.stdout
    assert "SGLang None" not in r.stdout and "Traceback" not in r.stderr


def test_a_404_server_checked_as_vllm_is_a_server_failure(tmp_path):
    with standin({}) as url:
        r = run_cli(["check-server", url, "--engine", "vllm", "--timeout", "60"], tmp_path / "node")
    assert r.returncode == 1, r.stdout + r.stderr
    fail = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL [server]")]
    assert fail and "HTTP 404" in fail[0] and "does not answer as a vLLM OpenAI server" in fail[0], r.stdout
    assert "KeyError" not in r.stdout + r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("url", ["127.0.0.1:30000", "localhost:30000/", "ftp://host:1"])
def test_a_url_without_http_is_a_config_error(tmp_path, url):
    for cmd in (["check-server", url], ["check-computation", url, "--model", str(tmp_path)]):
        r = run_cli(cmd, tmp_path / "node")
        assert r.returncode == 1, r.stdout + r.stderr          # the CLI's exit code for a user's error
        assert "vidcache: error: [config] the server URL must start with http:// or https://" in r.stderr, r.stderr
        assert "unknown url type" not in r.stderr and "Traceback" not in r.stderr
    r = run_cli(["check-server", "127.0.0.1:30000"], tmp_path / "node")
    assert "e.g. http://127.0.0.1:30000" in r.stderr


def test_a_hub_id_is_found_in_the_local_hugging_face_cache(tmp_path):
    """A vLLM server serving `Qwen/...` by its hub id: the processor is looked up in HF_HUB_CACHE (a snapshot laid
    out as huggingface_hub lays it out), so the check gets past the processor instead of "not a directory"."""
    from vidcache.testing.processors import save_checkpoint
    hub = tmp_path / "hub"
    snap = hub / "models--Qwen--Qwen2.5-VL-7B-Instruct" / "snapshots" / ("a" * 40)
    save_checkpoint("qwen2_5_vl", snap)
    (hub / "models--Qwen--Qwen2.5-VL-7B-Instruct" / "refs").mkdir(parents=True)
    (hub / "models--Qwen--Qwen2.5-VL-7B-Instruct" / "refs" / "main").write_text("a" * 40)
    env = {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    with standin(VLLM) as url:
        missing = run_cli(["check-server", url, "--engine", "vllm", "--timeout", "60"], tmp_path / "n1",
                          env={"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"})
        found = run_cli(["check-server", url, "--engine", "vllm", "--timeout", "60"], tmp_path / "n2", env=env)
    assert "FAIL [processor]" in missing.stdout and "Hugging Face cache" in missing.stdout, missing.stdout
    # found: the processor resolved from the cache, so the check went on to what this stand-in cannot answer
    assert "neither a directory here" not in found.stdout, found.stdout
    assert "vLLM 0.34.0, qwen2_5_vl" in found.stdout.splitlines()[0], found.stdout     # its family, from the cache
    assert "Traceback" not in found.stderr, found.stderr
