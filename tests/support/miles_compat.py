"""TEST-ONLY: finding Miles for the tests, and the import shim for running it next to PyPI sglang 0.5.23.

Production Miles runs against its ``sglang-miles`` fork, which has every module Miles imports; nothing in
``miles_integration`` needs this module.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

ENV = "MILES_SRC"
SKIP_REASON = "MILES_SRC not set; run scripts/setup_miles.sh"


def miles_src(repo_root: str | os.PathLike | None = None) -> Path | None:
    """The Miles checkout named by ``$MILES_SRC`` (relative paths are taken from ``repo_root``), or None."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    src = Path(raw)
    if not src.is_absolute():
        src = Path(repo_root or os.getcwd()) / src
    return src if (src / "miles" / "__init__.py").is_file() else None


def add_miles_to_path(src: Path) -> None:
    if str(src) not in sys.path:
        sys.path.insert(0, str(src))


def _spec_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ModuleNotFoundError, ValueError):
        return False


def install_test_shims() -> list[str]:
    """TEST-ONLY: an empty ``sglang.srt.entrypoints.openai.encoding_dsv4`` when the installed sglang lacks it.

    Miles imports it at module level (``chat_template_utils.deepseek``) and only uses it for DeepSeek-V4
    checkpoints; it exists in the ``sglang-miles`` fork, not in PyPI sglang 0.5.23.  Never shadows a real module.
    """
    name = "sglang.srt.entrypoints.openai.encoding_dsv4"
    if name in sys.modules or _spec_exists(name):
        return []
    stub = types.ModuleType(name)
    stub.__doc__ = "STUB (vidcache tests): DeepSeek-V4 encoder of the sglang-miles fork, unused here"
    sys.modules[name] = stub
    return [name]


# The Miles modules the tests import (scripts/setup_miles.sh installs what they need).
MILES_MODULES = ("miles.utils.types", "miles.utils.data", "miles.rollout.data_source", "miles.rollout.base_types",
                 "miles.utils.chat_template_utils", "miles.utils.http_utils", "miles.utils.misc",
                 "miles.rollout.inference_rollout.inference_rollout_common")
INSTALL_EXTRAS = "MILES_SRC=$MILES_SRC bash scripts/setup_miles.sh .venv/bin/python"


def missing_miles_dependency(repo_root: str | os.PathLike | None = None) -> str | None:
    """With MILES_SRC set: None if Miles' modules import, else the error and the one command that installs
    Miles' extra packages.  (Without MILES_SRC: None; the Miles tests skip themselves.)"""
    src = miles_src(repo_root)
    if src is None:
        return None
    add_miles_to_path(src)
    install_test_shims()
    for mod in MILES_MODULES:
        try:
            importlib.import_module(mod)
        except ImportError as e:
            return f"Miles ({src}) does not import: {mod}: {e}. Install Miles' extra packages: {INSTALL_EXTRAS}"
    return None


def miles_or_skip(repo_root: str | os.PathLike) -> Path:
    """For a Miles test module, at import: Miles' source on ``sys.path`` with the test shims, or the module
    skipped (MILES_SRC unset).  With Miles present a missing SGLang peer is a failure, never a skip."""
    import pytest
    src = miles_src(repo_root)
    if src is None:
        pytest.skip(SKIP_REASON, allow_module_level=True)
    add_miles_to_path(src)
    install_test_shims()
    from support import sglang_peer
    assert sglang_peer.peer_available(), ("SGLang 0.5.23's Qwen-VL processor does not import: run "
                                          "scripts/setup_peer_env.sh")
    return src
