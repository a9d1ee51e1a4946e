"""The trainer and the server on different transformers releases, each in its own process, as a cluster runs them:
an SGLang stand-in (SGLang's own processor behind its HTTP endpoints, ``support/peer_server.py``) on one release
and the trainer (the CLI, ``support/layout_client.py``) on another, through the overlays of
``scripts/setup_transformers.sh`` (``install.sh --test`` makes them).

* stock mode, trainer 5.25 / server 5.19: ``vidcache check-server`` exits 1 and names the token layout and both
  releases; told the server's layout (``--token-layout wrapped``), the trainer follows it and the check passes;
* plugin mode, both ways round: check-server passes, and every request's server ids equal the trainer's
  expanded ids (the plugin expands in the layout the reference names).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import sglang_peer as sp

if not sp.peer_installed():
    pytest.skip("SGLang peer not installed: run scripts/setup_peer_env.sh", allow_module_level=True)
sp.require_peer()

from support.toy_processors import build_processor, save_checkpoint  # noqa: E402

pytestmark = pytest.mark.peer
ROOT = Path(__file__).resolve().parents[2]
SUPPORT = ROOT / "tests" / "support"
OVERLAYS = ROOT / ".overlays"


def overlay(version: str) -> str:
    """The overlay of transformers ``version``.  No ``.overlays`` at all: this checkout never ran
    ``install.sh --test`` (a skip, saying so); ``.overlays`` without this release: a failure."""
    if not OVERLAYS.is_dir():
        pytest.skip("no transformers overlays (.overlays/): run scripts/install.sh --test, or "
                    f"scripts/setup_transformers.sh {version}")
    d = OVERLAYS / f"transformers-{version}"
    if not (d / "transformers" / "__init__.py").is_file():
        pytest.fail(f"{d} is missing: run scripts/setup_transformers.sh {version}")
    return str(d)


def _env(tmp_path, node: str, transformers: str) -> dict:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join([overlay(transformers), str(ROOT)] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    env.update(VIDCACHE_DIR=str(tmp_path / node), VIDCACHE_SHARED=str(tmp_path / "shared"), HF_HUB_OFFLINE="1",
               PYTHONDONTWRITEBYTECODE="1")
    return env


class Server:
    def __init__(self, tmp_path, family, mode, ckpt, transformers):
        self.url_file = tmp_path / f"url-{mode}-{transformers}"
        self.log = open(tmp_path / f"server-{mode}-{transformers}.log", "w")
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "peer_server.py"), "--family", family, "--mode", mode, "--ckpt", str(ckpt),
             "--url-file", str(self.url_file)], env=_env(tmp_path, "server-node", transformers),
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while not self.url_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError("the stand-in did not start:\n" + Path(self.log.name).read_text()[-3000:])
            time.sleep(0.2)
        self.url = self.url_file.read_text()

    def close(self):
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


def _ckpt(tmp_path, model_type="qwen3_vl"):
    """qwen3_vl: the processor alone (check-server is told --family); Qwen3.5 (its real ids): a checkpoint with its
    config.json, from which check-server derives the family itself (no --family)."""
    d = tmp_path / "ckpt"
    if model_type == "qwen3_vl":
        build_processor("qwen3_vl").save_pretrained(d)
    else:
        save_checkpoint(model_type, d)
    return d


def _check(url, tmp_path, transformers, *args, model_type="qwen3_vl"):
    family = ["--family", "qwen3_vl"] if model_type == "qwen3_vl" else []
    return subprocess.run([sys.executable, "-m", "vidcache.cli", "check-server", url, *family, *args],
                          capture_output=True, text=True, timeout=600, env=_env(tmp_path, "trainer-node", transformers))


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen3_5"])
def test_stock_mode_names_the_layout_and_both_releases(tmp_path, model_type):
    ckpt = _ckpt(tmp_path, model_type)
    srv = Server(tmp_path, model_type, "stock", ckpt, "5.19.0")
    try:
        r = _check(srv.url, tmp_path, "5.25.0", "--mode", "stock", "--processor", str(ckpt), model_type=model_type)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
        fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
        assert len(fails) == 1 and fails[0].startswith("FAIL [layout] token layout differs"), r.stdout
        line = fails[0]
        for part in ("'collapsed'", "'wrapped'", "transformers 5.25.0", "5.19.0 (implied by SGLang 0.5.23's pin)",
                     "the server's ids carry the extra", "--token-layout wrapped"):
            assert part in line, (part, line)
        r = _check(srv.url, tmp_path, "5.25.0", "--mode", "stock", "--processor", str(ckpt), "--token-layout", "wrapped",
                   model_type=model_type)
        assert r.returncode == 0 and "parity established" in r.stdout, r.stdout + r.stderr
        assert "token layout 'wrapped'" in r.stdout
    finally:
        srv.close()


@pytest.mark.parametrize("model_type,trainer,server", [("qwen3_vl", "5.25.0", "5.19.0"), ("qwen3_vl", "5.19.0", "5.25.0"),
                                                        ("qwen3_5", "5.25.0", "5.19.0")])
def test_plugin_mode_expands_in_the_requests_layout(tmp_path, videos, model_type, trainer, server):
    ckpt = _ckpt(tmp_path, model_type)
    srv = Server(tmp_path, model_type, "plugin", ckpt, server)
    try:
        r = _check(srv.url, tmp_path, trainer, "--mode", "plugin", "--processor", str(ckpt), model_type=model_type)
        assert r.returncode == 0 and "parity established" in r.stdout, r.stdout + r.stderr
        assert "token layout 'collapsed'" in r.stdout
        clips = [str(videos[n]) for n in ("h264_ntsc", "mjpeg_24", "ffv1_10_small")]
        out = subprocess.run([sys.executable, str(SUPPORT / "layout_client.py"), srv.url, str(ckpt), "plugin",
                              "qwen3_vl", *clips], capture_output=True, text=True, timeout=600,
                             env=_env(tmp_path, "trainer-node", trainer))
        assert out.returncode == 0, out.stdout + out.stderr
        rows = [json.loads(ln) for ln in out.stdout.splitlines()]
        assert len(rows) == 3
        for row in rows:
            assert row["transformers"] == trainer and row["layout"] == "collapsed"
            assert row["status"] == 200 and row["guard"] == "pass", row["guard"]
            assert row["server_ids"] == row["trainer_ids"]
    finally:
        srv.close()
