"""Issue 51 item 6: vidcache is not on PyPI, so it is installed from a checkout or a wheel: ``python -m build``
makes a wheel and an sdist that ``twine check --strict`` accepts, and the wheel carries the package."""
import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from support.cli import ROOT


@pytest.mark.skipif(importlib.util.find_spec("build") is None or importlib.util.find_spec("twine") is None,
                    reason="needs build and twine (the [test] extra: pip install '.[test]')")
def test_build_makes_a_wheel_and_sdist_twine_accepts(tmp_path):
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    src = tmp_path / "src"                       # a clean copy: the build writes egg-info beside the sources
    for name in filter(None, files.decode().split("\0")):
        if (Path(ROOT) / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(ROOT) / name, src / name)
    # --no-isolation: this venv's setuptools (pyproject's build requirement), no index needed
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(src)],
                   capture_output=True, text=True, check=True, timeout=600)
    dist = sorted(p.name for p in (tmp_path / "dist").iterdir())
    from vidcache import __version__
    assert dist == [f"vidcache-{__version__}-py3-none-any.whl", f"vidcache-{__version__}.tar.gz"], dist
    r = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, (tmp_path / "dist").iterdir())],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.count("PASSED") == 2, r.stdout + r.stderr
    names = zipfile.ZipFile(tmp_path / "dist" / dist[0]).namelist()
    assert {"vidcache/cli/__init__.py", "vidcache/py.typed", "miles_integration/__init__.py"} <= set(names)
