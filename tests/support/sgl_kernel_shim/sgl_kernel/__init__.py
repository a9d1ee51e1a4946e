"""EXPERIMENTAL, test-only: the few ``sgl_kernel`` CPU symbols SGLang 0.5.23 reads at import, in plain torch.

SGLang with ``SGLANG_USE_CPU_ENGINE=1`` imports some ``sgl_kernel`` CPU symbols whenever ``is_cpu()``, with no
AMX gate, although on a CPU without AMX its layers compute with native torch (``forward_native``).  PyPI's
``sglang-kernel`` is a CUDA-only build, so those imports fail.  This package supplies only those symbols (as a
torchvision shim supplies a CPU ``torchvision``); it is put on ``PYTHONPATH`` of the server
process only (``tests/support/sglang_server.py``), never installed, and SGLang's own files are not touched.

* the ones a Qwen2.5-VL request runs are implemented in torch, with the kernel's semantics as read from SGLang's
  Triton twin in the same file (named per function);
* the ones only other models or speculative decoding call raise ``NotImplementedError`` naming themselves.

It must NOT define ``convert_weight_packed``: SGLang takes that op as the sign of an AMX build
(``utils/common.py: _is_intel_amx_backend_available``) and would then route layers to kernels that are not here.
"""
from __future__ import annotations

import torch

__version__ = "0.0.0+vidcache-cpu-shim"


def _missing(name: str):
    def fn(*args, **kwargs):
        raise NotImplementedError(f"sgl_kernel.{name} is not in vidcache's CPU shim (tests/support/sgl_kernel_shim): "
                                  "only the ops a Qwen-VL request needs are implemented")
    fn.__name__ = name
    return fn


# --- called on every request --------------------------------------------------------------------------------
def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len):
    """``req_to_token[req_pool_indices[i], start[i]:end[i]] = out_cache_loc[<i's slice>]`` for each request i,
    the slices of ``out_cache_loc`` packed in request order (Triton twin: mem_cache/allocation.py
    ``assign_req_to_token_pool``)."""
    starts, ends = start_offset.tolist(), end_offset.tolist()
    rows = req_pool_indices.tolist()
    off = 0
    for row, s, e in zip(rows, starts, ends):
        n = e - s
        req_to_token[row, s:e] = out_cache_loc[off:off + n].to(req_to_token.dtype)
        off += n


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc):
    """Raw-pointer KV copy between slots (Triton twin: kernels/ops/kvcache/cache_move.py); only reached by
    KV-cache moves (hierarchical cache, speculative decoding), not by a plain request."""
    raise NotImplementedError("sgl_kernel.copy_all_layer_kv_cache_cpu is not in vidcache's CPU shim")


# --- speculative decoding only (imported by the scheduler's modules, never called without --speculative-*) ----
build_tree_kernel_efficient_cpu = _missing("build_tree_kernel_efficient_cpu")
verify_tree_greedy_cpu = _missing("verify_tree_greedy_cpu")
fill_accept_out_cache_loc_cpu = _missing("fill_accept_out_cache_loc_cpu")
fill_bonus_tokens_cpu = _missing("fill_bonus_tokens_cpu")
rotate_input_ids_cpu = _missing("rotate_input_ids_cpu")
assign_draft_cache_locs_contiguous_cpu = _missing("assign_draft_cache_locs_contiguous_cpu")
assign_extend_cache_locs_cpu = _missing("assign_extend_cache_locs_cpu")


# --- torch.ops.sgl_kernel.* read at import by srt/models/qwen3_5.py:284-297, which every Qwen-VL processor module
# imports (srt/multimodal/processors/qwen_vl.py).  Only Qwen3.5 / Qwen3-Next layers call them; a Qwen2.5-VL or
# Qwen3-VL request never does.  Defined with the kernel library's schemas so the dispatcher knows them.
_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")      # kept alive: the ops live as long as this object
_QWEN3_5_SCHEMAS = (
    "fused_sigmoid_mul_cpu(Tensor(a!) input, Tensor gate) -> ()",
    "fused_qk_gemma_rmsnorm_cpu(Tensor q, Tensor k, Tensor q_weight, Tensor k_weight, float eps, int head_dim)"
    " -> (Tensor, Tensor)",
    "fused_qk_gemma_rmsnorm_with_gate_cpu(Tensor q_gate, Tensor k, Tensor q_weight, Tensor k_weight, float eps,"
    " int head_dim, int num_head) -> (Tensor, Tensor, Tensor)",
    "fused_qkvzba_split_reshape_cat_contiguous_cpu(Tensor mixed_qkvz, Tensor mixed_ba, int num_heads_qk,"
    " int num_heads_v, int head_qk, int head_v) -> (Tensor, Tensor, Tensor, Tensor)",
)
for _schema in _QWEN3_5_SCHEMAS:
    _name = _schema.split("(", 1)[0]
    if not hasattr(torch.ops.sgl_kernel, _name):
        _LIB.define(_schema)
        _LIB.impl(_name, _missing(_name), "CPU")
