"""Issue 51 item 2: the Qwen3.5 line is discoverable.  Every ``--family`` takes a family or a model type (mapped,
and said so); ``--model DIR`` works on ``vllm-config`` too and names the model type it derived; ``sglang-config
--model`` prints the model's path, not MODEL; the README, ``--help`` and examples/README.md name Qwen3.5."""
import json
import shlex
from pathlib import Path

import pytest

from support.cli import ROOT, run_cli
from vidcache import VideoOptions
from vidcache.errors import OptionsError


@pytest.fixture
def qwen3_5(tmp_path):
    """A checkpoint laid out as the model type alone says it (its classes and geometry are transformers')."""
    d = tmp_path / "Qwen3.5 ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_5"}))
    return d


@pytest.mark.parametrize("cmd", [["sglang-config"], ["vllm-config", "--format", "json"],
                                 ["inspect", "0" * 32 + ".1." + "0" * 32]])
def test_a_model_type_is_taken_as_its_family_and_said_so(tmp_path, cmd):
    r = run_cli([*cmd, "--family", "qwen3_5"], tmp_path / "node")
    assert "model type qwen3_5 is served as family qwen3_vl" in r.stderr, r.stderr
    if cmd[0] == "sglang-config":
        assert json.loads(r.stdout)["family"] == "qwen3_vl"
    if cmd[0] == "vllm-config":
        assert json.loads(r.stdout)["engine_kwargs"]["media_io_kwargs"]["video"]["vidcache_fallback"] == "qwen3_vl"
    r = run_cli([*cmd, "--family", "qwen9_vl"], tmp_path / "node")
    assert r.returncode == 2 and "qwen3_5, qwen3_5_moe" in r.stderr and "qwen3_vl" in r.stderr


def test_vllm_config_and_sglang_config_take_a_checkpoint_and_print_its_path(tmp_path, qwen3_5):
    r = run_cli(["vllm-config", "--model", str(qwen3_5)], tmp_path / "node", check=True)
    assert "model_type qwen3_5 -> qwen3_vl" in r.stderr
    argv = shlex.split(r.stdout.splitlines()[-1])
    assert argv[:3] == ["vllm", "serve", str(qwen3_5)]
    assert json.loads(argv[argv.index("--media-io-kwargs") + 1])["video"]["vidcache_fallback"] == "qwen3_vl"
    r = run_cli(["sglang-config", "--model", str(qwen3_5), "--format", "shell"], tmp_path / "node", check=True)
    assert "model_type qwen3_5 -> qwen3_vl" in r.stderr
    assert f"--model-path {shlex.quote(str(qwen3_5))} " in r.stdout and "MODEL " not in r.stdout


def test_the_python_api_names_the_family_for_a_model_type():
    with pytest.raises(OptionsError, match="qwen3_5 is a model type: its family is qwen3_vl"):
        VideoOptions(family="qwen3_5")


def test_readme_help_and_examples_name_qwen3_5(tmp_path):
    readme = (Path(ROOT) / "README.md").read_text()
    assert "Qwen3.5" in readme and "`qwen3_5`" in readme and "`qwen3_5_moe`" in readme
    assert "to come" not in (Path(ROOT) / "examples" / "README.md").read_text()
    for cmd in (["--help"], ["prewarm", "--help"], ["sglang-config", "--help"], ["vllm-config", "--help"],
                ["inspect", "--help"], ["check-server", "--help"]):
        out = " ".join(run_cli(cmd, tmp_path / "node", check=True).stdout.split())
        assert "qwen3_5" in out, cmd
