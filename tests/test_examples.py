"""examples/ and docs/miles.md's launch settings come from `vidcache sglang-config` (issue 40).

* The generated blocks of docs/miles.md equal the command's output, for SGLang 0.5.16 and 0.5.23, stock and plugin.
* The launch script (DRY_RUN=1) submits a job whose env and train.py flags are that command's, for each release
  and mode, and whose other flags are Miles' own (its arguments.py) -- run through the shell as a user runs it.
* The CPU dry run (Miles' rollout loop, vidcache's data source and generate function, the stand-in SGLang server
  running SGLang's processor) exits 0 with every check holding, and ends without a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import EVERYTHING, run_cli
from support.miles_compat import miles_src

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import gen_launch_docs  # noqa: E402

from vidcache.sglang.config import mm_process_config  # noqa: E402

CASES = [(v, m) for v in ("0.5.16", "0.5.23") for m in ("stock", "plugin")]


def _env(**kw):
    return {**os.environ, "PYTHONPATH": str(REPO), **kw}


def _cli(*argv: str) -> str:
    return run_cli(argv, "/nonexistent/vidcache-test", inherit=EVERYTHING, pythonpath=[], check=True).stdout


def test_docs_blocks_are_the_commands_output():
    text = (REPO / "docs" / "miles.md").read_text()
    blocks = gen_launch_docs.blocks(text)
    named = {(a[a.index("--sglang-version") + 1], a[a.index("--mode") + 1]) for a, _ in blocks}
    assert set(CASES) <= named, f"docs/miles.md lacks generated blocks for {set(CASES) - named}"
    for argv, body in blocks:
        assert body == _cli(*argv), f"docs/miles.md's block for `vidcache {shlex.join(argv)}` is stale: run " \
                                    "python scripts/gen_launch_docs.py"
    assert "total_pixels" not in "".join(b for a, b in blocks if "0.5.16" in a)


@pytest.mark.parametrize("version,mode", CASES)
def test_the_launch_script_takes_its_settings_from_sglang_config(tmp_path, version, mode):
    wrapper = tmp_path / "vidcache"          # the command the script calls, as installed
    wrapper.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m vidcache.cli \"$@\"\n")
    wrapper.chmod(0o755)
    out = subprocess.run(["bash", str(REPO / "examples" / "miles" / "qwen2_5_vl_video_grpo.sh")], check=True,
                         capture_output=True, text=True,
                         env=_env(DRY_RUN="1", MODE=mode, SGLANG_VERSION=version, VIDCACHE=str(wrapper),
                                  VIDCACHE_DIR="/local/nvme/vidcache", PYTHON=sys.executable)).stdout
    argv = shlex.split(out)
    assert argv[:3] == ["ray", "job", "submit"]
    env = json.loads(argv[argv.index("--runtime-env-json") + 1])["env_vars"]
    train = argv[argv.index("train.py") + 1:]
    # the SGLang servers' env and config for that release
    assert env["SGLANG_RUST_SERVER"] == "0"
    assert (env.get("VIDEO_MAX_PIXELS") is not None) == (version == "0.5.16")
    assert (env.get("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE") == "vidcache.sglang.plugin") == (mode == "plugin")
    assert env["VIDCACHE_DIR"] == "/local/nvme/vidcache" and env["VIDCACHE_SHARED"]
    cfg = json.loads(train[train.index("--sglang-mm-process-config") + 1])
    assert cfg == mm_process_config(version, "qwen2_5_vl")
    # the vidcache flags parse as Miles registers them; stock mode states the GPU servers' torchcodec
    from miles_integration.args import add_vidcache_arguments
    flags, _ = add_vidcache_arguments(argparse.ArgumentParser()).parse_known_args(train)
    assert flags.vidcache_mode == mode and flags.vidcache_family == "qwen2_5_vl"
    assert flags.vidcache_server_torchcodec == ("0.16.0" if mode == "stock" else None)
    # issue 47: the train hook (SGLang's positions in the trainer) in both modes; the model's vision tower on the
    # servers: --model-impl transformers in stock mode, vidcache's model package in plugin mode
    assert train[train.index("--custom-megatron-init-path") + 1] == "miles_integration.train_hooks.install_train_hooks"
    assert (train[train.index("--sglang-model-impl") + 1] == "transformers") if mode == "stock" else \
        "--sglang-model-impl" not in train
    assert (env.get("SGLANG_EXTERNAL_MODEL_PACKAGE") == "vidcache.sglang.models") == (mode == "plugin")
    # every other flag is Miles' own (--sglang-* are SGLang's ServerArgs fields, which Miles forwards)
    src = miles_src(REPO)
    if src is not None:
        miles_args = (src / "miles" / "utils" / "arguments.py").read_text()
        for f in (a for a in train if a.startswith("--") and not a.startswith(("--vidcache-", "--sglang-"))):
            assert f'"{f}"' in miles_args, f"{f} is not a Miles flag"


@pytest.mark.miles
def test_the_cpu_dry_run_runs_miles_with_vidcache_against_sglangs_processor(tmp_path):
    if miles_src(REPO) is None:
        pytest.skip("MILES_SRC not set; run scripts/setup_miles.sh")
    r = subprocess.run([sys.executable, str(REPO / "examples" / "miles_cpu_dry_run.py"), "--keep", str(tmp_path)],
                       capture_output=True, text=True, env=_env(), timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert re.search(r"dry run: ok: 6 samples", out), out[-4000:]
    assert out.count("train tensors torch.equal to SGLang's processor output") == 4, out[-4000:]
    # the flags from sglang-config carry the train hook: the trainer computes SGLang's positions (issue 47)
    assert "positions: OK   [positions] the train hook (miles_integration.train_hooks.install_train_hooks)" in out, \
        out[-4000:]
    # a script using the Miles data source ends quietly: no read-ahead thread traceback at interpreter exit
    assert "Traceback" not in out and "cannot schedule new futures" not in out, out[-4000:]


READ_AHEAD_SCRIPT = r'''
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/tests", sys.argv[1] + "/examples"]
from pathlib import Path
from support.miles_compat import add_miles_to_path, install_test_shims, miles_src
add_miles_to_path(miles_src(sys.argv[1])); install_test_shims()
import miles_cpu_dry_run as dry
from support.miles_smoke_example import make_miles_args
from miles_integration.data_source import VidcacheDataSource
root = Path(sys.argv[2])
data = dry.write_inputs(root)
dry.vidcache_cli("prewarm", str(data), "--cache", str(root / "a"), "--shared", str(root / "shared"),
                 "--family", dry.FAMILY, *dry.OPTIONS, "--no-progress", "--workers", "1")
args = make_miles_args(hf_checkpoint=str(root / "ckpt"), router_port=1, prompt_data=str(data), input_key="prompt",
                       multimodal_keys={"video": "videos"}, rollout_shuffle=True, vidcache_cache=str(root / "b"),
                       vidcache_shared=str(root / "shared"), vidcache_family=dry.FAMILY, vidcache_fps=1.0,
                       vidcache_min_pixels=3136, vidcache_max_pixels=50176, vidcache_read_ahead=512)
ds = VidcacheDataSource(args)
print(len(ds.get_samples(1)), "group")       # and exit, read-ahead running: no close(), as a script ends
'''


@pytest.mark.miles
def test_a_script_using_the_data_source_exits_without_a_read_ahead_traceback(tmp_path):
    """Issue 40: the read-ahead the data source starts is stopped before the interpreter shuts its thread pools
    down, so a script ends quietly (no `cannot schedule new futures after shutdown`), rc 0."""
    if miles_src(REPO) is None:
        pytest.skip("MILES_SRC not set; run scripts/setup_miles.sh")
    for attempt in range(3):        # the race the fix closes shows on most runs, not all: three runs, all quiet
        r = subprocess.run([sys.executable, "-c", READ_AHEAD_SCRIPT, str(REPO), str(tmp_path / str(attempt))],
                           capture_output=True, text=True, env=_env(), timeout=600)
        assert r.returncode == 0 and "1 group" in r.stdout, r.stderr[-3000:]
        assert "Traceback" not in r.stderr and "cannot schedule" not in r.stderr, r.stderr[-3000:]


def test_miles_size_flags_take_units():
    """Issue 40: --vidcache-read-ahead-bytes takes 4GB / 500MiB like every other vidcache size, as train.py parses it."""
    from miles_integration.args import VidcacheConfig, add_vidcache_arguments
    p = add_vidcache_arguments(argparse.ArgumentParser())
    assert VidcacheConfig.from_args(p.parse_args(["--vidcache-read-ahead-bytes", "4GB"])).read_ahead_bytes == 4 * 10**9
    assert p.parse_args(["--vidcache-read-ahead-bytes", "500MiB"]).vidcache_read_ahead_bytes == 500 * 2**20
    assert p.parse_args(["--vidcache-read-ahead-bytes", "1073741824"]).vidcache_read_ahead_bytes == 2**30
    assert VidcacheConfig.from_args(p.parse_args([])).read_ahead_bytes == 2 << 30
    with pytest.raises(SystemExit):
        p.parse_args(["--vidcache-read-ahead-bytes", "lots"])


def test_vllm_config_prints_shell_quoted_flags():
    """Issue 40: the vLLM flags come out shell-quoted: pasted into a shell, vLLM gets the JSON with its quotes."""
    from vidcache.vllm.config import ENGINE_KWARGS, serve_flags
    argv = shlex.split(_cli("vllm-config").splitlines()[-1])       # the command, after the node's environment
    assert argv[:3] == ["vllm", "serve", "MODEL"] and argv[3:] == serve_flags()
    assert json.loads(argv[argv.index("--media-io-kwargs") + 1]) == ENGINE_KWARGS["media_io_kwargs"]
    assert json.loads(_cli("vllm-config", "--format", "json"))["serve_flags"] == serve_flags()
    # with the family: the model's own loader for plain files (the real engine's finding, docs/vllm.md)
    argv = shlex.split(_cli("vllm-config", "--family", "qwen3_vl").splitlines()[-1])
    assert argv[3:] == serve_flags("qwen3_vl") and "--trust-request-mm-kwargs" in argv
    assert json.loads(argv[argv.index("--media-io-kwargs") + 1])["video"]["vidcache_fallback"] == "qwen3_vl"
