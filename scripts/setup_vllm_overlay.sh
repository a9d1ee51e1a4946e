#!/usr/bin/env bash
# vLLM 0.34.0 with the transformers it pins, beside the venv: the environment the vLLM exactness and check-server
# tests run vLLM's own multimodal processor in (tests/vllm_engine/, tests/support/vllm_peer.py), on CPU, without weights.
#
# Usage: scripts/setup_vllm_overlay.sh [PYTHON]     -> .overlays/vllm-0.34.0/
#   Run a process in it with PYTHONPATH=.overlays/vllm-0.34.0 (it shadows the venv's transformers with 5.22.2, the
#   newest release inside vLLM 0.34.0's pin transformers>=5.16.1,<5.23; torch, numpy and the rest are the venv's).
#
# --no-deps, on purpose: vLLM 0.34.0's full dependency set does not even resolve (it pins flashinfer-python==0.7.3,
# which PyPI does not have) and is ~9 GB of CUDA wheels; its processing path needs only the few small packages
# below on top of this venv (found one missing import at a time: docs/vllm.md, "Testing"; oss-harmony is vLLM's own
# pin for the openai_harmony module its chat parser imports).  torch stays the venv's
# 2.14.1 (vLLM pins 2.14.0; no CPU build of it exists for x86_64), so the tests run vLLM's code on torch 2.14.1.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
VLLM=0.34.0
TF=5.22.2
PKGS=("vllm==$VLLM" "transformers==$TF" "cachetools==8.0.2" "cbor2==6.3.0" "cloudpickle==3.1.3" "uvloop==0.23.0"
      "py-cpuinfo==9.0.0" "llguidance==1.7.6" "blake3==1.0.11" "oss-harmony==0.0.11")
DIR=".overlays/vllm-$VLLM"
probe() {     # every pin installed at its version (a changed list rebuilds), and vLLM's processing path imports
  PINS="${PKGS[*]}" PYTHONPATH="$DIR" "$PY" - <<'PYEOF' 2>/dev/null
import importlib.metadata as md, os, sys
from vllm.config import ModelConfig  # noqa: F401
from vllm.multimodal import MULTIMODAL_REGISTRY  # noqa: F401
from vllm.multimodal.video import VIDEO_LOADER_REGISTRY  # noqa: F401
from vllm.renderers.chat_utils.chat_message import parse_chat_messages  # noqa: F401  (the chat stand-in's path)
sys.exit(any(md.version(n) != v for n, v in (p.split("==") for p in os.environ["PINS"].split())))
PYEOF
}
if [[ -d "$DIR" ]] && probe; then
  echo "[setup_vllm_overlay] vLLM $VLLM + transformers $TF already in $DIR"
  exit 0
fi
rm -rf "$DIR"
"$PY" -m pip --disable-pip-version-check -q install --no-deps --target "$DIR" "${PKGS[@]}"
rm -rf "$DIR/bin"                       # console scripts would name this venv's python; nothing runs them
probe || { echo "[setup_vllm_overlay] vLLM $VLLM does not import from $DIR" >&2; exit 1; }
echo "[setup_vllm_overlay] vLLM $VLLM + transformers $TF in $DIR"
