#!/usr/bin/env bash
# Video GRPO for Qwen2.5-VL on Miles, with vidcache (docs/miles.md).  Run it where `ray job submit` reaches the
# cluster, from a Miles checkout (train.py), with vidcache installed on every node (docs/miles.md section 0).
#
#   MODE=stock SGLANG_VERSION=0.5.16 bash examples/miles/qwen2_5_vl_video_grpo.sh     # Miles' production SGLang
#   MODE=plugin SGLANG_VERSION=0.5.23 bash examples/miles/qwen2_5_vl_video_grpo.sh
#   DRY_RUN=1 ... prints the command instead of submitting it (tests/test_examples.py runs that form).
#
# The SGLang settings are not written here: they come from `vidcache sglang-config --format miles` for the
# named release and mode (the one source of launch settings), which defines VIDCACHE_SGLANG_ENV (the SGLang
# servers' env_vars) and VIDCACHE_MILES_ARGS (train.py's --vidcache-* and --sglang-* flags).  In stock mode
# they include --vidcache-server-torchcodec 0.16.0: install torchcodec==0.16.0 in the SGLang environment of
# GPU servers (SGLang 0.5.23's own 0.17.0 decodes frozen frames inexactly on CUDA); the startup check stops
# the job before its first rollout when a server does not match.  They also carry what makes the two sides compute
# the same thing (issue 47): the train hook (--custom-megatron-init-path miles_integration.train_hooks.install_train_hooks:
# the trainer computes SGLang's M-RoPE positions; the startup check fails without it), and the model's vision
# tower on the servers (stock: --sglang-model-impl transformers; plugin: SGLANG_EXTERNAL_MODEL_PACKAGE in the env).
set -euo pipefail

MODE="${MODE:-stock}"                          # stock (SGLang as shipped) or plugin (vidcache's processor plugin)
SGLANG_VERSION="${SGLANG_VERSION:-0.5.16}"     # the release the image's SGLang servers run
VIDCACHE="${VIDCACHE:-vidcache}"               # the vidcache command (e.g. /workspace/vidcache/.venv/bin/vidcache)
PYTHON="${PYTHON:-python3}"

# --- the model: the one part a new example changes (Qwen3.5: examples/miles/qwen3_5_video_grpo.sh, to come) ---
FAMILY=qwen2_5_vl
HF_CHECKPOINT="${HF_CHECKPOINT:-/models/Qwen2.5-VL-7B-Instruct}"
REF_LOAD="${REF_LOAD:-/models/Qwen2.5-VL-7B-Instruct_torch_dist}"
CKPT_DIR="${CKPT_DIR:-/ckpt/qwen25vl-video}"
MODEL_ARGS=(--hf-checkpoint "$HF_CHECKPOINT" --ref-load "$REF_LOAD" --load "$CKPT_DIR" --save "$CKPT_DIR"
            --rollout-num-gpus-per-engine 2 --sglang-mem-fraction-static 0.7)

# --- the cluster and the data ---
RAY_ADDRESS="${RAY_ADDRESS:-http://127.0.0.1:8265}"
VIDCACHE_DIR="${VIDCACHE_DIR:-/local/nvme/vidcache}"        # each node's own local disk, never NFS
VIDCACHE_SHARED="${VIDCACHE_SHARED:-s3://bucket/vidcache}"  # the shared tier every node reaches
PROMPT_DATA="${PROMPT_DATA:-/data/train.jsonl}"             # prewarm it first: docs/miles.md section 3
EXTRA_PYTHONPATH="${EXTRA_PYTHONPATH:-/root/Megatron-LM}"

# (Captured first, so that a failing sglang-config stops the script here.)
SETTINGS="$("$VIDCACHE" sglang-config --family "$FAMILY" --mode "$MODE" --sglang-version "$SGLANG_VERSION" --format miles)"
eval "$SETTINGS"

# The job's env_vars: the SGLang servers' (from sglang-config) + every node's cache settings.
RUNTIME_ENV="$("$PYTHON" -c 'import json, sys
env = json.loads(sys.argv[1])
env.update(VIDCACHE_DIR=sys.argv[2], VIDCACHE_SHARED=sys.argv[3], PYTHONPATH=sys.argv[4])
print(json.dumps({"env_vars": env}))' "$VIDCACHE_SGLANG_ENV" "$VIDCACHE_DIR" "$VIDCACHE_SHARED" "$EXTRA_PYTHONPATH")"

CMD=(ray job submit --address="$RAY_ADDRESS" --runtime-env-json "$RUNTIME_ENV" --
  python3 train.py
  --actor-num-nodes 2 --actor-num-gpus-per-node 8 --colocate
  "${MODEL_ARGS[@]}"
  --prompt-data "$PROMPT_DATA" --input-key prompt --label-key label --apply-chat-template
  --multimodal-keys '{"video": "videos", "image": "images"}' --rollout-shuffle
  --rollout-max-prompt-len 16384 --rollout-max-response-len 1024
  --num-rollout 500 --rollout-batch-size 32 --n-samples-per-prompt 8 --global-batch-size 256
  --advantage-estimator grpo --rm-type math
  --data-source-path miles_integration.data_source.VidcacheDataSource
  --custom-generate-function-path miles_integration.generate.generate
  --rollout-function-path miles_integration.rollout.VidcacheRolloutFn
  --vidcache-fps 2 --vidcache-max-pixels 200704
  "${VIDCACHE_MILES_ARGS[@]}")

if [[ -n "${DRY_RUN:-}" ]]; then
  printf '%q ' "${CMD[@]}"; echo
else
  exec "${CMD[@]}"
fi
