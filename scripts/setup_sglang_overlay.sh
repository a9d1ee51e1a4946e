#!/usr/bin/env bash
# An SGLang release other than the venv's, with the transformers it pins, beside the venv: the environment of an
# image built on that SGLang (Miles' production image is SGLang 0.5.16 with transformers 5.12.1).
#
# Usage: scripts/setup_sglang_overlay.sh [PYTHON]     -> .overlays/sglang-0.5.16/
#   Run a process in it with PYTHONPATH=.overlays/sglang-0.5.16 (it shadows the venv's sglang, transformers,
#   tokenizers and huggingface_hub; torch, numpy and the rest are the venv's).
#
# --no-deps, on purpose, as scripts/setup_peer_env.sh installs SGLang: its full dependency set is CUDA-only.
# transformers 5.12.1 refuses the venv's tokenizers 0.23.3 and huggingface_hub 2.x at import, so the overlay
# carries the newest releases it accepts (tokenizers 0.22.2; huggingface_hub 1.33.0).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
SGLANG=0.5.16
PKGS=("sglang==$SGLANG" "transformers==5.12.1" "tokenizers==0.22.2" "huggingface_hub==1.33.0")
DIR=".overlays/sglang-$SGLANG"
probe() {
  PYTHONPATH="$DIR" "$PY" - <<PYEOF 2>/dev/null
import importlib.metadata as md, sys
import sglang.srt.multimodal.processors.qwen_vl  # noqa: F401
sys.exit(not (md.version("sglang") == "$SGLANG" and md.version("transformers") == "5.12.1"))
PYEOF
}
if [[ -d "$DIR" ]] && probe; then
  echo "[setup_sglang_overlay] SGLang $SGLANG + transformers 5.12.1 already in $DIR"
  exit 0
fi
rm -rf "$DIR"
"$PY" -m pip --disable-pip-version-check -q install --no-deps --target "$DIR" "${PKGS[@]}"
rm -rf "$DIR/bin"
probe || { echo "[setup_sglang_overlay] SGLang $SGLANG does not import from $DIR" >&2; exit 1; }
echo "[setup_sglang_overlay] SGLang $SGLANG + transformers 5.12.1 in $DIR"
