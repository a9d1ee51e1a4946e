"""``vidcache check-server --engine vllm`` (the CLI only, on a fresh node) against a vLLM-shaped OpenAI server in
the overlay's process (``support/vllm_peer.py serve``: vLLM 0.34.0's own chat parsing, media path, chat template and
processor behind stdlib HTTP), started with the flags ``vidcache.vllm.config.serve_flags()`` gives (docs/vllm.md):
it passes; against servers with other settings it fails, naming the cause."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import vllm_peer as vp
from support.server_process import ServerProcess

vp.overlay_or_skip()

from vidcache.vllm.config import serve_flags  # noqa: E402

pytestmark = pytest.mark.vllm
VIDCACHE = Path(sys.executable).parent / "vidcache"      # the console script install.sh puts in the venv


class Server(ServerProcess):
    def __init__(self, tmp_path, ckpt, flags, dev_mode=True):
        name = f"{len(list(tmp_path.glob('url-*')))}"
        self.url_file = tmp_path / f"url-{name}"
        self.log = open(tmp_path / f"server-{name}.log", "w")
        env = vp.peer_env(tmp_path / "server-node", tmp_path / "shared",
                          **({"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {}))
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(vp.__file__), "serve", "--model", str(ckpt),
                                      "--url-file", str(self.url_file), *flags], env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not self.url_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise AssertionError("the vLLM stand-in did not start:\n" + Path(self.log.name).read_text()[-3000:])
            time.sleep(0.3)
        self.url = self.url_file.read_text()


def cli(tmp_path, *args):
    """``vidcache check-server --engine vllm ...`` as a user runs it on a fresh node: its two settings only."""
    assert VIDCACHE.is_file(), f"no vidcache console script at {VIDCACHE} (run scripts/install.sh)"
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH") if k in os.environ}
    env.update(VIDCACHE_DIR=str(tmp_path / "cli-node"), VIDCACHE_SHARED=str(tmp_path / "shared"), HF_HUB_OFFLINE="1")
    return subprocess.run([str(VIDCACHE), "check-server", "--engine", "vllm", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def fails(r) -> list[str]:
    return [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]


@pytest.fixture
def ckpt(tmp_path):
    return lambda family: vp.write_checkpoint(family, tmp_path / f"ckpt-{family}")


def test_passes_against_a_server_started_as_documented(tmp_path, ckpt):
    assert not (tmp_path / "cli-node").exists()
    with Server(tmp_path, ckpt("qwen2_5_vl"), serve_flags("qwen2_5_vl")) as srv:
        r = cli(tmp_path, srv.url)
        assert r.returncode == 0, r.stdout + r.stderr
        assert any(ln.startswith("OK ") and "parity established" in ln for ln in r.stdout.splitlines()), r.stdout
        assert any(ln.startswith("WARN [positions]") and "than vllm" in ln for ln in r.stdout.splitlines()), r.stdout
        assert "engine settings match" in r.stdout and "canary ids match" in r.stdout
        r = cli(tmp_path, srv.url, "--family", "qwen2_5_vl")              # the same, told the family
        assert r.returncode == 0, r.stdout + r.stderr


def test_vllms_default_normalisation_is_named(tmp_path, ckpt):
    flags = [f for f in serve_flags("qwen2_5_vl") if f != "--no-mm-device-do-normalize"]
    assert len(flags) == len(serve_flags("qwen2_5_vl")) - 1
    with Server(tmp_path, ckpt("qwen2_5_vl"), flags) as srv:
        r = cli(tmp_path, srv.url)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
        assert [f.split("]")[0] for f in fails(r)] == ["FAIL [config"], r.stdout
        assert "mm_device_do_normalize is True" in fails(r)[0]


def test_a_server_without_the_loader_is_named(tmp_path, ckpt):
    with Server(tmp_path, ckpt("qwen2_5_vl"), ["--trust-request-mm-kwargs", "--no-mm-device-do-normalize"],
                dev_mode=False) as srv:
        r = cli(tmp_path, srv.url)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
        assert [f.split("]")[0] for f in fails(r)] == ["FAIL [loader"], r.stdout
        assert "loader is not selected" in fails(r)[0] and "video_backend" in fails(r)[0]
        assert "mm_device_do_normalize is NOT checked" in r.stdout          # no dev mode: said, not assumed


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen3_5"])
def test_qwen3_chat_ids_are_vllms_wrapped_layout(tmp_path, ckpt, model_type):
    """vLLM 0.34.0 (transformers 5.22.2) keeps the chat template's pair around a Qwen3-VL video: a trainer in the
    model's own layout ('collapsed') is told so by name, and passes when it follows vLLM ('wrapped').  Qwen3.5 (its
    own config, architecture and special ids) the same way, its family derived from the served checkpoint."""
    with Server(tmp_path, ckpt(model_type), serve_flags("qwen3_vl")) as srv:     # Qwen3.5: the qwen3_vl family
        r = cli(tmp_path, srv.url)
        assert r.returncode == 1, r.stdout + r.stderr
        assert ", qwen3_vl, " in r.stdout.splitlines()[0], r.stdout
        assert [f.split("]")[0] for f in fails(r)] == ["FAIL [layout"], r.stdout
        assert "'wrapped'" in fails(r)[0] and "5.22.2" in fails(r)[0]
        r = cli(tmp_path, srv.url, "--token-layout", "wrapped")
        assert r.returncode == 0, r.stdout + r.stderr
