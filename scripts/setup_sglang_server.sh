#!/usr/bin/env bash
# An environment in which SGLang 0.5.23's own server (python -m sglang.launch_server) runs on the CPU, for
# tests/sglang_server/ (tests/support/sglang_server.py starts it).  Called by install.sh --test.
#
# Usage: scripts/setup_sglang_server.sh [PYTHON] [VENV]     (defaults: .venv/bin/python, .peer/sglang-cpu)
#
# What it does (idempotent):
#   1. VENV: a new venv of PYTHON's base interpreter whose site-packages holds a .pth naming PYTHON's
#      site-packages, so it sees the test venv's packages (SGLang from setup_peer_env.sh, torch, transformers,
#      vidcache's deps) without copying them.  `--system-site-packages` would not do: PYTHON is itself a venv.
#   2. The server-only packages SGLang's launch_server imports (uvicorn, uvloop, soundfile, ...), installed into
#      VENV under a constraints file that pins the test venv's torch / torchvision / transformers / tokenizers /
#      numpy / huggingface_hub / safetensors, so pip can never replace them (it fails instead).
#   3. Checks: the server's modules import with SGLANG_USE_CPU_ENGINE=1 and the sgl_kernel shim
#      (tests/support/sgl_kernel_shim: the sgl_kernel CPU symbols SGLang reads at import, in plain torch; PyPI's
#      sglang-kernel is a CUDA build), and nothing pinned moved.
# Nothing is installed into PYTHON's own venv: every pip call is "$VENV/bin/python -m pip" (a copied venv's
# bin/pip can point at another venv).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
VENV="${2:-.peer/sglang-cpu}"
SERVER_PKGS=(
  fastapi "uvicorn>=0.51" uvloop python-multipart setproctitle "prometheus-client>=0.20.0" interegular
  zstandard watchfiles tiktoken scipy "blobfile==3.0.0" "soundfile==0.13.1" pydantic
  "xgrammar==0.2.7"           # SGLang 0.5.23's own pin; its function-call parser imports it at server start
)
log() { echo "[setup_sglang_server] $*"; }
T0=$(date +%s)
[[ -x "$PY" ]] || { echo "setup_sglang_server: python not found: $PY" >&2; exit 2; }

pinned() {
  "$1" - <<'EOF'
import importlib.metadata as md
for p in ("torch", "torchvision", "transformers", "tokenizers", "numpy", "huggingface_hub", "safetensors", "sglang"):
    try:
        print(f"{p}=={md.version(p)}")
    except md.PackageNotFoundError:
        pass
EOF
}
BEFORE="$(pinned "$PY")"
grep -q '^sglang==' <<<"$BEFORE" || { echo "setup_sglang_server: SGLang is not in $PY's venv: run scripts/setup_peer_env.sh" >&2; exit 1; }

# 1. the venv and its .pth
BASE_SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ ! -x "$VENV/bin/python" ]]; then
  BASE_PY="$("$PY" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))')"
  log "creating $VENV from $BASE_PY"
  "$BASE_PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$BASE_SITE" > "$SITE/_vidcache_test_venv.pth"
"$VPY" - "$VENV" <<'EOF'
import os, sys
assert os.path.realpath(sys.prefix) == os.path.realpath(sys.argv[1]), (sys.prefix, sys.argv[1])
EOF

# 2. the server's own imports, under the test venv's pins
CONSTRAINTS="$(mktemp /tmp/sglang-server-constraints.XXXXXX.txt)"
trap 'rm -f "$CONSTRAINTS"' EXIT
grep -v '^sglang==' <<<"$BEFORE" > "$CONSTRAINTS"
log "pinned: $(echo $BEFORE)"
log "installing into $VENV: ${SERVER_PKGS[*]}"
"$VPY" -m pip --disable-pip-version-check -q install -c "$CONSTRAINTS" "${SERVER_PKGS[@]}" 2>&1 \
  | grep -v -e '^WARNING: Location' -e '^sglang 0.5.23 requires' -e "^ERROR: pip's dependency resolver" || true

# 3. checks
AFTER_BASE="$(pinned "$PY")"; AFTER_VENV="$(pinned "$VPY")"
if [[ "$BEFORE" != "$AFTER_BASE" || "$BEFORE" != "$AFTER_VENV" ]]; then
  echo "setup_sglang_server: pinned packages changed!" >&2
  diff <(echo "$BEFORE") <(echo "$AFTER_VENV") >&2 || true
  exit 1
fi
SGLANG_USE_CPU_ENGINE=1 PYTHONPATH="$PWD/tests/support/sgl_kernel_shim:$PWD" "$VPY" -W ignore - <<'EOF'
import importlib.metadata as md
import sglang.srt.entrypoints.http_server  # noqa: F401  (tokenizer manager, scheduler, detokenizer)
import sglang.srt.multimodal.processors.qwen_vl  # noqa: F401
import sgl_kernel
assert sgl_kernel.__version__.endswith("vidcache-cpu-shim"), sgl_kernel.__file__
print("[setup_sglang_server] OK: sglang", md.version("sglang"), "torch", md.version("torch"),
      "transformers", md.version("transformers"), "with the sgl_kernel CPU shim")
EOF
log "done in $(( $(date +%s) - T0 )) s"
