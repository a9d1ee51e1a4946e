"""Installing into an existing Miles / SGLang environment changes none of its big packages (issue 13 item 1),
and the LMDB on-disk format of new caches does not depend on the environment."""
import json
import os
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP = ("torch", "torchvision", "transformers", "sglang", "numpy")


# Miles' production image at the audited commit (../shared/miles/COMMIT): SGLang 0.5.16 with transformers==5.12.1
# pinned (scripts/setup_sglang_overlay.sh builds that stack beside the venv).
MILES_IMAGE = os.path.join(ROOT, ".overlays", "sglang-0.5.16")


def _image_env(tmp_path_factory, first: str | None = None):
    """A throwaway venv that already holds this environment's torch, torchvision, transformers, sglang
    and numpy (a .pth puts the current site-packages behind it), as a Miles / SGLang image would; ``first``:
    a directory of packages in front of those (another image's pins)."""
    from importlib.metadata import version
    for dist in KEEP:
        version(dist)        # the peers are installed here (a missing one is a broken test environment)
    d = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(d)], check=True, timeout=300)
    py = d / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "image.pth"), "w") as f:
        f.write((first + "\n" if first else "") + sysconfig.get_paths()["purelib"] + "\n")
    # The venv's own bundled setuptools would shadow the image's (an old one without bdist_wheel).
    subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "setuptools"], check=True, timeout=300)
    return py


@pytest.fixture(scope="module")
def existing_env(tmp_path_factory):
    return _image_env(tmp_path_factory)


@pytest.fixture(scope="module")
def miles_image_env(tmp_path_factory):
    if not os.path.isdir(os.path.join(ROOT, ".overlays")):
        pytest.skip("no overlays (.overlays/): run scripts/install.sh --test, or scripts/setup_sglang_overlay.sh")
    assert os.path.isdir(MILES_IMAGE), "run scripts/setup_sglang_overlay.sh"
    return _image_env(tmp_path_factory, MILES_IMAGE)


def _planned(py, spec) -> dict:
    # --no-index: resolve against what the image holds; a bound the image does not meet fails the
    # resolution here (a real install would then fetch a replacement from PyPI).
    r = subprocess.run([str(py), "-m", "pip", "install", "--dry-run", "--report", "-", "--quiet",
                        "--no-index", "--no-build-isolation", spec], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    return {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in json.loads(r.stdout)["install"]}


@pytest.mark.parametrize("spec", [ROOT, ROOT + "[ray]", ROOT + "[data]", ROOT + "[test]"])
def test_pip_install_plans_no_change_to_the_images_packages(existing_env, spec):
    from importlib.metadata import version
    planned = _planned(existing_env, spec)
    assert set(planned) == {"vidcache"}, planned       # nothing else: every dependency is already satisfied
    assert planned["vidcache"] == __import__("vidcache").__version__
    for dist in KEEP:
        assert dist not in planned, (dist, version(dist))


def test_pip_install_into_miles_image_replaces_nothing(miles_image_env):
    """Miles' image pins transformers 5.12.1 on SGLang 0.5.16: vidcache installs beside them, replacing nothing
    (its floor was transformers>=5.17, which would have upgraded it)."""
    seen = subprocess.run([str(miles_image_env), "-c", "import importlib.metadata as m; "
                           "print(m.version('transformers'), m.version('sglang'))"],
                          capture_output=True, text=True, check=True).stdout.split()
    assert seen == ["5.12.1", "0.5.16"]
    assert set(_planned(miles_image_env, ROOT)) == {"vidcache"}


def test_new_lmdb_files_have_one_format_whatever_the_environment_says(tmp_path):
    """py-lmdb 3.x: LMDB_DEFAULT_LIB_VERSION=1 would make new files LMDB 1.0 (format 3); ours stay 0.9."""
    code = ("import sys, lmdb\nfrom vidcache.store.lmdb import LMDBStore\n"
            "s = LMDBStore(sys.argv[1])\ns.set_many({'ac/x': b'1'})\n"
            "print(s.env.lib_version()[0], lmdb.__version__)")
    env = {**os.environ, "LMDB_DEFAULT_LIB_VERSION": "1", "PYTHONPATH": ROOT}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "a")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    major, pylmdb = r.stdout.split()
    assert major == "0" and pylmdb.startswith("3.")
    import lmdb
    e = lmdb.open(str(tmp_path / "b"), lib_version=1)                   # a cache made in 1.0 format...
    e.close()
    from vidcache.store.lmdb import LMDBStore
    assert LMDBStore(str(tmp_path / "b")).env.lib_version()[0] == 1     # ...still opens, in its own format


def test_miles_present_without_its_extras_fails_with_the_command_but_collection_goes_on(tmp_path):
    """MILES_SRC set, one of Miles' extra packages missing: the other tests still run, the run fails,
    and the output names the one command that installs the extras."""
    import shutil
    from support.miles_compat import miles_src
    src = miles_src(ROOT) or pytest.fail("MILES_SRC names no Miles checkout (the test suite runs with one)")
    broken = tmp_path / "miles"
    shutil.copytree(src / "miles", broken / "miles")
    with open(broken / "miles" / "utils" / "data.py", "a") as f:
        f.write("\nimport pylatexenc_not_installed_here  # noqa\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/scenarios/test_miles_integration.py", "tests/test_options.py"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "MILES_SRC": str(broken), "PYTHONPATH": ROOT})
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    assert "error during collection" not in out and " passed" in out and "1 failed" in out, out[-3000:]
    assert "pylatexenc_not_installed_here" in out and "scripts/setup_miles.sh" in out, out[-3000:]


def test_the_wheel_ships_py_typed(tmp_path):
    """Issue 40: the wheel built from a checkout (`pip wheel .`, the documented way to install vidcache, which has no
    PyPI release) carries py.typed (PEP 561), so type checkers read vidcache's hints."""
    import shutil
    import zipfile
    (tmp_path / "src").mkdir()
    src = tmp_path / "src"          # a copy: an in-tree build would write build/ and *.egg-info into the checkout
    for name in ("pyproject.toml", "README.md", "vidcache", "miles_integration"):
        (shutil.copytree if os.path.isdir(os.path.join(ROOT, name)) else shutil.copy)(
            os.path.join(ROOT, name), src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                                    if os.path.isdir(os.path.join(ROOT, name)) else {}))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(tmp_path), str(src)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    (wheel,) = tmp_path.glob("vidcache-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"vidcache/py.typed", "miles_integration/py.typed"} <= names


def test_setup_miles_names_the_ray_extra_when_ray_is_missing(tmp_path):
    """Issue 40: from a venv without Ray (what `scripts/install.sh` alone makes), setup_miles.sh stops at once and
    names its fix, vidcache's [ray] extra, instead of failing on `No module named 'ray'` after its installs."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    (tmp_path / "miles" / "miles").mkdir(parents=True)
    (tmp_path / "miles" / "miles" / "__init__.py").write_text("")
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup_miles.sh"), str(venv / "bin" / "python"),
                        str(tmp_path / "miles")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ray does not import" in r.stdout and "pip install -e '.[ray]'" in r.stdout, r.stdout
    assert "installing" not in r.stdout           # nothing was installed first


def _run_install(tmp_path, flag, fail_torch=False, env=None, gpu=False):
    """scripts/install.sh run in a copy of the scripts with a stub .venv/bin/python that records its pip calls (and
    fails the torch pair's when asked): what the script asks pip for, without downloading anything."""
    import shutil
    repo = tmp_path / "repo"
    shutil.copytree(os.path.join(ROOT, "scripts"), repo / "scripts")
    (repo / ".venv" / "bin").mkdir(parents=True)
    log = tmp_path / "calls"
    stub = repo / ".venv" / "bin" / "python"
    stub.write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n"
                    + ('case "$*" in *"install --extra-index-url"*) exit 1;; esac\n' if fail_torch else "")
                    + "cat >/dev/null 2>&1 <&0 || true\nexit 0\n")
    stub.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "ffmpeg").write_text("#!/bin/sh\nexit 0\n")     # present: the script never runs apt-get here
    (tmp_path / "bin" / "ffmpeg").chmod(0o755)
    if gpu:                                          # a machine with an NVIDIA GPU has nvidia-smi
        (tmp_path / "bin" / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (tmp_path / "bin" / "nvidia-smi").chmod(0o755)
    r = subprocess.run(["bash", str(repo / "scripts" / "install.sh"), *([flag] if flag else [])],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                       env={**os.environ, "PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "PYTHON": sys.executable,
                            **(env or {})})
    return r, (log.read_text().splitlines() if log.exists() else [])


def test_install_cpu_asks_for_the_cpu_pair_from_pytorchs_cpu_index_with_progress(tmp_path):
    """Issue 40: `install.sh --cpu` installs torch 2.13.0+cpu / torchvision 0.28.0+cpu from PyTorch's CPU index (PyPI's
    x86_64 wheels are CUDA builds), with pip's download progress shown, before vidcache; when the index is out of
    reach it stops and names TORCH_CPU_INDEX.  The default and --test paths ask for what they did."""
    r, calls = _run_install(tmp_path / "cpu", "--cpu")
    assert r.returncode == 0, r.stdout + r.stderr
    pair = next(c for c in calls if "torch==" in c)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu torchvision==0.28.0+cpu" in pair
    assert " -q" not in pair and calls.index(pair) < next(i for i, c in enumerate(calls) if "install -e ." in c)
    r, _ = _run_install(tmp_path / "down", "--cpu", fail_torch=True)
    assert r.returncode == 1 and "set TORCH_CPU_INDEX" in r.stdout, r.stdout
    _, calls = _run_install(tmp_path / "default", None)
    assert any(c.endswith("install torch==2.14.1 torchvision==0.29.1") and " -q" not in c for c in calls), calls


def test_a_machine_without_a_gpu_gets_the_cpu_pair_and_falls_back_when_the_index_is_away(tmp_path):
    """Issue 51 item 8: plain `install.sh` on a machine with no nvidia-smi asks for the CPU pair from PyTorch's CPU
    index (here a loopback stand-in that answers); when the index does not answer, or its install fails, it installs
    the default pair instead and says so.  With nvidia-smi, or --gpu, or --test: the default pair, no probe."""
    import http.server
    import threading
    (tmp_path / "index" / "torch").mkdir(parents=True)
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory=str(tmp_path / "index"))  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    index = f"http://127.0.0.1:{server.server_port}/"
    cpu_pair = f"--extra-index-url {index} torch==2.13.0+cpu torchvision==0.28.0+cpu"
    try:
        r, calls = _run_install(tmp_path / "up", None, env={"TORCH_CPU_INDEX": index})
        assert r.returncode == 0 and "no NVIDIA GPU here" in r.stdout, r.stdout + r.stderr
        assert any(c.endswith(cpu_pair) for c in calls) and not any("torch==2.14.1" in c for c in calls), calls
        r, calls = _run_install(tmp_path / "fails", None, fail_torch=True, env={"TORCH_CPU_INDEX": index})
        assert r.returncode == 0 and "falling back to the default pair" in r.stdout, r.stdout + r.stderr
        assert [c for c in calls if "torch==" in c][-1].endswith("install torch==2.14.1 torchvision==0.29.1")
    finally:
        server.shutdown()
    r, calls = _run_install(tmp_path / "away", None, env={"TORCH_CPU_INDEX": "http://127.0.0.1:9/"})
    assert r.returncode == 0 and "does not answer: falling back" in r.stdout, r.stdout + r.stderr
    pairs = [c for c in calls if "torch==" in c]                  # one install, and no try at the CPU index
    assert len(pairs) == 1 and pairs[0].endswith("install torch==2.14.1 torchvision==0.29.1"), calls
    for case, flag, gpu in (("gpu", None, True), ("flag", "--gpu", False)):
        r, calls = _run_install(tmp_path / case, flag, gpu=gpu, env={"TORCH_CPU_INDEX": index})
        assert r.returncode == 0 and "no NVIDIA GPU" not in r.stdout, r.stdout
        assert any(c.endswith("install torch==2.14.1 torchvision==0.29.1") for c in calls), calls
