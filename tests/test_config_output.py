"""Issue 51 item 4: config output that can be pasted.  ``sglang-config --format shell`` never exports placeholder
text (a placeholder becomes ``${VAR:?...}``: the node's own value, or a stop that says what to set), and
``vllm-config`` prints the node environment its loader needs, as ``sglang-config`` does.  CLI only, through bash."""
import json
import os
import subprocess
import sys

from support.cli import ROOT, run_cli


def _bash(script: str, **env) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "PYTHONPATH": ROOT}
    return subprocess.run(["bash", "-c", script], env={**base, **env}, capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


def _shell_exports(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith("export ")]


def test_sglang_plugin_shell_fragment_exports_no_placeholder(tmp_path):
    cmd = f"{sys.executable} -m vidcache.cli sglang-config --family qwen2_5_vl --mode plugin --format shell"
    text = _bash(cmd, VIDCACHE_DIR=str(tmp_path / "none")).stdout
    assert _shell_exports(text) and not any("'<" in ln for ln in _shell_exports(text)), text
    # No VIDCACHE_DIR on this node: the fragment stops, naming what to set; nothing runs after it.
    r = _bash(f'eval "$({cmd})"; echo reached')
    assert r.returncode != 0 and "reached" not in r.stdout and "set VIDCACHE_DIR to a node-local" in r.stderr
    # With the node's own settings, the fragment keeps them, and the next command works.
    node = tmp_path / "node"
    run_cli(["tier-id", "--init"], node, tmp_path / "tier", check=True)
    r = _bash(f'eval "$({cmd})" && echo "$VIDCACHE_DIR|$VIDCACHE_SHARED" && {sys.executable} -m vidcache.cli ls',
              VIDCACHE_DIR=str(node), VIDCACHE_SHARED=str(tmp_path / "tier"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == f"{node}|{tmp_path / 'tier'}" and "0 entries" in r.stdout


def test_vllm_config_prints_the_node_environment(tmp_path):
    cmd = f"{sys.executable} -m vidcache.cli vllm-config --family qwen2_5_vl"
    r = _bash(f'eval "$({cmd})"; echo reached')                     # nothing set: stops at VIDCACHE_DIR
    assert r.returncode != 0 and "reached" not in r.stdout and "VIDCACHE_DIR" in r.stderr
    text = _bash(cmd, VIDCACHE_DIR=str(tmp_path / "n"), VIDCACHE_SHARED=str(tmp_path / "tier")).stdout
    assert "VLLM_PLUGINS" in text and text.splitlines()[-1].startswith("vllm serve MODEL ")
    assert f"export VIDCACHE_SHARED={tmp_path / 'tier'}" in _shell_exports(text)      # this node's own tier
    assert 'export VIDCACHE_DIR="${VIDCACHE_DIR:?' in text
    cfg = json.loads(run_cli(["vllm-config", "--format", "json"], tmp_path / "n", check=True).stdout)
    assert set(cfg["env"]) == {"VIDCACHE_DIR", "VIDCACHE_SHARED"} and "VLLM_PLUGINS" in cfg["notes"][0]
