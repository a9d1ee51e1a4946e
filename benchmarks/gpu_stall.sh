#!/usr/bin/env bash
# Issue 50, item 3: the trainer-stall figures on a GPU (run on an H100 on 2026-12-07: docs/benchmarks.md, "On a GPU:
# the tiny launch-bound step ...").  Ratios in one run each: without read-ahead, with it, and with the next batch's
# tensors made ahead too (vidcache.train_inputs_ahead), whole run and after step 1.
#
#   bash benchmarks/gpu_stall.sh [WHEEL_DIR]          # from the repository root, on the GPU machine
#
# The device image has CUDA torch and transformers but lacks what the benchmark reads and serves through.  Carry
# these wheels (and their dependencies) for the device's Python, made on a machine with network access:
#
#   pip download -d .wheels --python-version 3.X --only-binary=:all: \
#       lmdb av xxhash "s3fs>=2024.6" "fsspec>=2024.6" aiohttp "moto[server]>=5.0" boto3 \
#       qwen-vl-utils==0.0.14 pebble pyarrow decord            # decord: x86_64 only
#
# (.wheels/ is git-ignored.)  The script installs them with --no-index, so nothing is fetched on the device.
# Budget device time: on an H100 (2026-12-07) the tiny run took ~100 s (most of it generating the clips and node A's
# prewarm), each 1.2b run ~110-125 s with the clips made; give the three runs 10 minutes.
set -euo pipefail
WHEELS=${1:-.wheels}
PY=${PYTHON:-python3}
if [ -d "$WHEELS" ]; then
    "$PY" -m pip install --no-index --find-links "$WHEELS" lmdb av xxhash s3fs fsspec aiohttp "moto[server]" boto3 \
        qwen-vl-utils pebble pyarrow || exit 1
    "$PY" -m pip install --no-index --find-links "$WHEELS" decord 2>/dev/null || echo "decord not installed (PyAV decodes)"
fi
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "${OUT:-.}"
# 1. the tiny launch-bound step (fp32 Qwen2.5-VL of 2 layers): the step holds the GIL launching kernels
"$PY" benchmarks/trainer_stall.py --gpu --clips 128 | tee "${OUT:-.}/stall_gpu_tiny.txt"
# 2. a production-size step: the same model class with a 1.24B-parameter bf16 text decoder, forward + backward +
#    AdamW, GPU-bound; HF's processor on the device (train_inputs_batch(device=cuda)).
"$PY" benchmarks/trainer_stall.py --gpu --decoder 1.2b --clips 128 | tee "${OUT:-.}/stall_gpu_1.2b.txt"
# 3. the same two with read-ahead built with the loop (no head start): what a late start costs
"$PY" benchmarks/trainer_stall.py --gpu --decoder 1.2b --clips 128 --head-start 0 | tee "${OUT:-.}/stall_gpu_1.2b_h0.txt"
grep -h "^stall:" "${OUT:-.}"/stall_gpu_*.txt
