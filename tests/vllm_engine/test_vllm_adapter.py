"""vidcache.vllm without vLLM: it imports without vLLM, its settings are one fact read everywhere, and the plugin
entry point names the loader's registration (the tests against vLLM's own code are in tests/vllm_engine/)."""
import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vidcache.vllm.config import (ENGINE_KWARGS, LOADER_NAME, PLUGIN_ENTRY_POINT, engine_kwargs, serve_flags,
                                  settings_problems)

ROOT = Path(__file__).resolve().parents[2]


def test_vidcache_vllm_imports_without_vllm():
    code = ("import sys, vidcache, vidcache.vllm, vidcache.vllm.request, vidcache.vllm.check; "
            "vidcache.vllm.prepare_vllm; sys.exit('vllm' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


def test_the_entry_point_registers_the_loader():
    group, name, target = PLUGIN_ENTRY_POINT
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][group][name] == target
    module, func = target.split(":")
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    assert func in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    registered = [d for n in tree.body if isinstance(n, ast.ClassDef) for d in n.decorator_list
                  if isinstance(d, ast.Call) and getattr(d.func, "attr", "") == "register"]
    assert [ast.unparse(d.args[0]) for d in registered] == ["LOADER_NAME"]


def test_serve_flags_and_the_settings_check_read_the_one_fact():
    assert serve_flags() == ["--trust-request-mm-kwargs", "--no-mm-device-do-normalize", "--media-io-kwargs",
                             '{"video":{"video_backend":"%s"}}' % LOADER_NAME]
    assert settings_problems({"multimodal_config": ENGINE_KWARGS}) == []
    # with the family: plain files go to vLLM's own loader for it (the real engine's finding), and a server
    # without that is named
    assert serve_flags("qwen2_5_vl")[-1] == '{"video":{"video_backend":"%s","vidcache_fallback":"qwen2_vl"}}' % LOADER_NAME
    assert engine_kwargs("qwen3_vl")["media_io_kwargs"]["video"]["vidcache_fallback"] == "qwen3_vl"
    assert settings_problems({"multimodal_config": engine_kwargs("qwen2_5_vl")}, "qwen2_5_vl") == []
    missing = settings_problems({"multimodal_config": ENGINE_KWARGS}, "qwen2_5_vl")
    assert len(missing) == 1 and "vidcache_fallback is None, must be 'qwen2_vl'" in missing[0]
    with pytest.raises(ValueError, match="unknown family"):
        engine_kwargs("llava")
    bad = settings_problems({"multimodal_config": {"mm_device_do_normalize": True, "media_io_kwargs": {}}})
    assert len(bad) == 2 and "mm_device_do_normalize is True" in bad[0] and "video_backend is None" in bad[1]
