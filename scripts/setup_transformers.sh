#!/usr/bin/env bash
# Put another transformers release beside the venv's, for the layout matrix (tests/test_token_layout.py and the
# peer tests that start an SGLang stand-in on another release).
#
# Usage: scripts/setup_transformers.sh VERSION [PYTHON]     -> .overlays/transformers-VERSION/
#   Run a process on it with PYTHONPATH=.overlays/transformers-VERSION (it shadows the venv's transformers and
#   nothing else).
#
# --no-deps, on purpose: the venv's tokenizers, huggingface_hub, torch and numpy stay as they are (the overlay
# is that release of transformers over this venv, the way an image with a pinned transformers is).  transformers
# 5.25 declares kernels>=0.19.1,<0.20, which this machine's index does not have (0.17.2 is its newest); 5.25
# imports and runs the processors without it (`kernels` is only imported for hub kernels), so it is left out.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${1:?usage: setup_transformers.sh VERSION [PYTHON]}"
PY="${2:-.venv/bin/python}"
DIR=".overlays/transformers-$VERSION"
probe() { PYTHONPATH="$DIR" "$PY" -c "import transformers, sys; sys.exit(transformers.__version__ != '$VERSION')" 2>/dev/null; }
if [[ -d "$DIR" ]] && probe; then
  echo "[setup_transformers] transformers $VERSION already in $DIR"
  exit 0
fi
rm -rf "$DIR"
"$PY" -m pip --disable-pip-version-check -q install --no-deps --target "$DIR" "transformers==$VERSION"
rm -rf "$DIR/bin"                       # its console scripts would name this venv's python; nothing runs them
probe || { echo "[setup_transformers] transformers $VERSION does not import from $DIR" >&2; exit 1; }
echo "[setup_transformers] transformers $VERSION in $DIR"
