"""Why SGLang's own server does not run the Qwen3.5 line (``qwen3_5``, ``qwen3_5_moe``) on this CPU, named exactly.

Qwen3.5's decoder is hybrid: three of every four layers are Gated DeltaNet linear attention.  SGLang 0.5.23's CPU
path for it is ``sgl_kernel``'s AMX build: ``layers/attention/linear/gdn_backend.py:188-192`` imports
``sgl_kernel.mamba.causal_conv1d_fn_cpu`` / ``causal_conv1d_update_cpu`` and reads
``torch.ops.sgl_kernel.fused_gdn_gating_cpu``; ``linear/kernels/gdn_triton.py:27-33`` imports
``sgl_kernel.mamba.chunk_gated_delta_rule_cpu`` and reads ``fused_sigmoid_gating_delta_rule_update_cpu``; and
``models/qwen3_5.py:283-297`` calls four more ops (``fused_sigmoid_mul_cpu``, ``fused_qk_gemma_rmsnorm_cpu``,
``fused_qk_gemma_rmsnorm_with_gate_cpu``, ``fused_qkvzba_split_reshape_cat_contiguous_cpu``), which the shim
defines only as stubs that raise (so the model module imports).  PyPI's ``sglang-kernel`` is a CUDA build, and this
CPU has no AMX.  What runs instead for the Qwen3.5 line: SGLang's own processor (tests/sglang/, both releases)
and its vision tower's family, Qwen3-VL, on the real server (test_sglang_real_server.py).

This test fails the day the environment can run it (the shim or SGLang provides them): then add ``qwen3_5`` to the
real-server test's ``SERVERS``.
"""
from __future__ import annotations

import os
import subprocess

import pytest

from support import sglang_server as ss

pytestmark = [pytest.mark.peer]

PROBE = r"""
import importlib, json, torch
out = {}
for m in ("sglang.srt.models.qwen3_5", "sglang.srt.layers.attention.linear.gdn_backend",
          "sglang.srt.layers.attention.linear.kernels.gdn_triton"):
    try:
        importlib.import_module(m); out[m] = "ok"
    except Exception as e:
        out[m] = f"{type(e).__name__}: {e}"
ops = ("fused_gdn_gating_cpu", "fused_sigmoid_gating_delta_rule_update_cpu")
out["ops"] = {op: hasattr(torch.ops.sgl_kernel, op) for op in ops}
print(json.dumps(out))
"""


def test_qwen3_5_linear_attention_has_no_cpu_kernels_here():
    if not ss.server_python().exists():
        pytest.fail(f"SGLang server environment not built ({ss.server_venv()}): run scripts/setup_sglang_server.sh",
                    pytrace=False)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}, "SGLANG_USE_CPU_ENGINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ss.SHIM), str(ss.ROOT)])}
    r = subprocess.run([str(ss.server_python()), "-W", "ignore", "-c", PROBE], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    import json
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["sglang.srt.models.qwen3_5"] == "ok"          # the model module imports (the shim's stubs)
    for m in ("sglang.srt.layers.attention.linear.gdn_backend", "sglang.srt.layers.attention.linear.kernels.gdn_triton"):
        assert out[m] == "ModuleNotFoundError: No module named 'sgl_kernel.mamba'", out
    assert out["ops"] == {"fused_gdn_gating_cpu": False, "fused_sigmoid_gating_delta_rule_update_cpu": False}, out
