"""The layout, id and parity tests (stock and plugin mode, every family) again under the other verified transformers releases
(``token_layout.VERIFIED_TRANSFORMERS``), each in a pytest of its own with that release's overlay first on
``PYTHONPATH`` (``scripts/setup_transformers.sh``; ``install.sh --test`` makes them).  The main venv's release
runs them in this suite itself.

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
OTHERS = [v for v in VERIFIED_TRANSFORMERS if v != transformers.__version__]


@pytest.mark.parametrize("version", OTHERS)
def test_layout_id_and_plugin_parity_suites_under(version):
    overlay = ROOT / ".overlays" / f"transformers-{version}"
    if not (ROOT / ".overlays").is_dir():
        pytest.skip(f"no transformers overlays (.overlays/): run scripts/install.sh --test, or "
                    f"scripts/setup_transformers.sh {version}")
    assert (overlay / "transformers" / "__init__.py").is_file(), f"run scripts/setup_transformers.sh {version}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(overlay)] + (
        [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])), PYTHONDONTWRITEBYTECODE="1")
    probe = subprocess.run([sys.executable, "-c", "import transformers; print(transformers.__version__)"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert probe.stdout.strip() == version, probe.stdout + probe.stderr
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SELECTION],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    tail = "\n".join(r.stdout.splitlines()[-25:])
    assert r.returncode == 0, f"under transformers {version}:\n{tail}\n{r.stderr[-2000:]}"
    assert " passed" in tail and "skipped" not in tail, tail
