#!/usr/bin/env bash
# Install vidcache into ./.venv on a fresh machine.
#
#   bash scripts/install.sh          # the library and CLI
#   bash scripts/install.sh --test   # + test deps, SGLang 0.5.23's processor (test peer), Miles (when MILES_SRC names a
#                                    #   checkout) and transformers 5.19.0 / 5.25.0 overlays (.overlays/) for the layout matrix,
#                                    #   SGLang 0.5.16's and vLLM 0.34.0's (tests/vllm_engine/: vLLM's own processor on CPU)
#
# torch and torchvision must be a matched pair (both CPU or both CUDA builds): PyPI's torchvision
# next to a CPU torch fails to import.  torch 2.14.1 + torchvision 0.29.1 is a matched pair that also
# runs on machines without a GPU, and SGLang 0.5.23 pins torch 2.14.1.  Override with TORCH_PAIR.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_PAIR="${TORCH_PAIR:-torch==2.14.1 torchvision==0.29.1}"
WITH_TESTS=0
[[ "${1:-}" == "--test" ]] && WITH_TESTS=1

log() { echo "[install] $*"; }

# FFmpeg's shared libraries: torchcodec (used by SGLang's decoder in the test peer) links them.
if ! command -v ffmpeg >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    log "apt-get install ffmpeg"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ffmpeg >/dev/null
  else
    log "warning: ffmpeg not found; install it for torchcodec (only the SGLang test peer needs it)"
  fi
fi

[[ -x .venv/bin/python ]] || { log "creating .venv"; "$PYTHON" -m venv .venv; }
PIP=(.venv/bin/python -m pip --disable-pip-version-check -q)
log "installing $TORCH_PAIR"
# shellcheck disable=SC2086
"${PIP[@]}" install $TORCH_PAIR
log "installing vidcache"
if [[ $WITH_TESTS == 1 ]]; then
  "${PIP[@]}" install -e ".[test]" -c scripts/test-constraints.txt    # the test venv's transformers, fixed
  bash scripts/setup_peer_env.sh .venv/bin/python
  bash scripts/setup_miles.sh .venv/bin/python      # a no-op without MILES_SRC; fails loudly when Miles is given but broken
  # The other verified transformers releases, for the token-layout matrix (tests/test_transformers_matrix.py,
  # tests/sglang/test_layout_across_versions.py): one overlay each, the venv's own left as it is.
  for v in 5.19.0 5.25.0; do bash scripts/setup_transformers.sh "$v" .venv/bin/python; done
  bash scripts/setup_sglang_overlay.sh .venv/bin/python    # SGLang 0.5.16 + transformers 5.12.1: Miles' image
  bash scripts/setup_vllm_overlay.sh .venv/bin/python      # vLLM 0.34.0 + transformers 5.22.2: tests/vllm_engine/
else
  "${PIP[@]}" install -e .
fi
.venv/bin/python -c "import torch, torchvision, decord, av, qwen_vl_utils, lmdb, vidcache; \
print('[install] ok: torch', torch.__version__, '/ torchvision', torchvision.__version__)"
