"""The layout, id and parity tests (stock and plugin mode, every family) again under the other verified transformers
releases (``token_layout.VERIFIED_TRANSFORMERS``) and SGLang 0.5.16 (``sglang_facts.VERIFIED_SGLANG_VERSIONS``), each in
a pytest of its own with that overlay first on ``PYTHONPATH`` (``scripts/setup_transformers.sh``,
``scripts/setup_sglang_overlay.sh``; ``install.sh --test`` makes them).  The main venv's releases run them in this
suite itself.

transformers 5.25 declares ``kernels>=0.19.1,<0.20``, which this machine's package index does not have: its
overlay is installed ``--no-deps`` (5.25 imports and runs the processors without ``kernels``).
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from vidcache.token_layout import VERIFIED_TRANSFORMERS

ROOT = Path(__file__).resolve().parent.parent
SELECTION = ["tests/test_token_layout.py", "tests/test_qwen3_defaults.py", "tests/test_train_inputs.py",
             "tests/sglang/test_plugin_refs.py", "tests/sglang/test_sglang_parity.py"]
# overlay -> (transformers, SGLang) it holds; SGLang None: the venv's (0.5.23).  sglang-0.5.16 is Miles'
# production image (scripts/setup_sglang_overlay.sh): its own SGLang with the transformers it pins.
OVERLAYS = {f"transformers-{v}": (v, None) for v in VERIFIED_TRANSFORMERS if v not in (transformers.__version__, "5.12.1")}
OVERLAYS["sglang-0.5.16"] = ("5.12.1", "0.5.16")
SETUP = {"sglang-0.5.16": "scripts/setup_sglang_overlay.sh"}


@pytest.mark.parametrize("name", sorted(OVERLAYS))
def test_layout_id_and_parity_suites_under(name):
    version, sglang = OVERLAYS[name]
    overlay = ROOT / ".overlays" / name
    setup = SETUP.get(name, f"scripts/setup_transformers.sh {version}")
    if not (ROOT / ".overlays").is_dir():
        pytest.skip(f"no overlays (.overlays/): run scripts/install.sh --test, or {setup}")
    assert (overlay / "transformers" / "__init__.py").is_file(), f"run {setup}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(overlay)] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])), PYTHONDONTWRITEBYTECODE="1")
    probe = subprocess.run([sys.executable, "-c", "import importlib.metadata as m, transformers; "
                            "print(transformers.__version__, m.version('sglang'))"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert probe.stdout.split()[:1] == [version], probe.stdout + probe.stderr
    if sglang:
        assert probe.stdout.split()[1] == sglang, probe.stdout
    extra = ["tests/sglang/test_check_server.py"] if sglang else []       # the server side on that release
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SELECTION, *extra],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    tail = "\n".join(r.stdout.splitlines()[-25:])
    assert r.returncode == 0, f"under {name}:\n{tail}\n{r.stderr[-2000:]}"
    assert " passed" in tail and "skipped" not in tail, tail
