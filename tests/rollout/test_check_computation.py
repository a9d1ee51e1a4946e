"""``vidcache check-computation``'s parts that need no server (the real-server runs are in
tests/sglang_server/test_sglang_real_server.py and tests/vllm_engine/test_real_server.py): the KL it scores with
when an engine returns only its top-k tokens, and the threshold it refuses to guess."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from support.cli import run_cli
from support.tiny_checkpoint import write_tiny_checkpoint
from vidcache.rollout.computation import kl_per_token


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2 ** 31 - 1), k=st.integers(1, 50), scale=st.floats(0.1, 8.0))
def test_top_k_kl_is_a_kl_never_above_the_full_one(seed, k, scale):
    """The coarsened KL (the engine's k tokens + "the rest") is >= 0 and <= the full-vocabulary KL (data
    processing), and with every token returned it is the full KL."""
    g = torch.Generator().manual_seed(seed)
    p = torch.log_softmax(scale * torch.randn(3, 50, generator=g, dtype=torch.float64), -1)
    q = torch.log_softmax(scale * torch.randn(3, 50, generator=g, dtype=torch.float64), -1)
    full = (p.exp() * (p - q)).sum(-1)
    top = p.topk(k, -1).indices
    partial = torch.full_like(p, float("nan")).scatter(-1, top, p.gather(-1, top))
    kl = kl_per_token(partial, q)
    assert (kl >= -1e-12).all() and (kl <= full + 1e-9).all()
    assert torch.allclose(kl_per_token(p, q), full)


def test_no_measured_floor_is_a_clear_error(tmp_path):
    """A device/dtype pair without a measured floor is refused, naming --threshold; the measured pairs (CPU, and the
    H100's GPU run) name where their floor comes from; a non-positive --threshold is refused from the CLI."""
    from vidcache.errors import ConfigError
    from vidcache.rollout.computation import threshold_for
    with pytest.raises(ConfigError, match=r"no measured floor for mps float32 .* --threshold"):
        threshold_for("mps", "float32")
    assert "H100" in threshold_for("cuda:0", "bfloat16").source and threshold_for("cuda", "bfloat16").mean == 0.1
    assert threshold_for("cpu", "float32").mean == 1e-6
    ckpt = write_tiny_checkpoint("qwen2_5_vl", tmp_path / "ckpt")
    r = run_cli(["check-computation", "http://127.0.0.1:9", "--model", ckpt, "--mode", "plugin", "--threshold", "0"],
                node=tmp_path / "node")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "vidcache: error: [config] --threshold must be a positive KL" in r.stderr, r.stderr
