"""SGLang 0.5.23's own server (``python -m sglang.launch_server``: its tokenizer manager, scheduler, ``/generate``)
on the CPU, on a tiny random-weight Qwen2.5-VL, started with exactly ``vidcache sglang-config``'s flags and env,
stock mode and plugin mode (``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE=vidcache.sglang.plugin``).  EXPERIMENTAL: the
environment is ``scripts/setup_sglang_server.sh``'s, with ``support/sgl_kernel_shim`` for the ``sgl_kernel`` CPU
symbols SGLang reads at import (see docs/testing.md, "SGLang's own server on CPU").

What it shows, per mode:
* ``vidcache check-server`` (the CLI) establishes parity against the real server;
* a prepared request's ``/generate``: the guard passes (SGLang's ``prompt_token_ids`` are the trainer's
  ``expanded_ids``), and SGLang's full-vocabulary prompt + sample logprobs against transformers' forward on
  ``train_inputs`` (M-RoPE positions from ``vidcache.rope_positions(engine="sglang")``, checked ``torch.equal``
  to SGLang's own ``get_rope_index``):
  - one temporal patch (``grid_t == 1``): at the noise floor;
  - several temporal patches: far above it, and back at the floor only when transformers' vision tower attends
    across the whole video, as SGLang 0.5.23's does (models/qwen2_5_vl.py: its full-attention ``cu_seqlens`` are
    ``t*h*w`` per video; transformers' are ``h*w`` per frame).  This pins that divergence: it fails when SGLang
    changes it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import sglang_server as ss

if not ss.server_python().exists():     # install.sh --test builds it: its absence is a failure, never a skip
    pytest.fail(f"SGLang server environment not built ({ss.server_venv()}): run scripts/setup_sglang_server.sh "
                "(scripts/install.sh --test does)", pytrace=False)

import torch  # noqa: E402

import vidcache  # noqa: E402
from vidcache import VideoCache, VideoOptions, prepare  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER  # noqa: E402
from vidcache.testing.videos import make_video  # noqa: E402

pytestmark = [pytest.mark.peer, pytest.mark.slow]
VIDCACHE = Path(sys.executable).parent / "vidcache"
# The floor measured here (fp32, SGLang's torch-native CPU path vs transformers' SDPA): mean KL ~1e-8 nats/token,
# max |d logprob| ~1e-4.  The bounds sit far below what an input mismatch gives (the 2nd case: ~1-2 nats/token).
FLOOR_MEAN_KL, FLOOR_MAX_KL = 1e-6, 1e-5
PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe.<|im_end|>\n<|im_start|>assistant\n"
# 1 s at 2 fps with qwen-vl-utils' floor of 4 frames lowered to 2: one temporal patch (SGLang's sampler keeps the
# frozen file's 2, capped by its frame count); 4 s: 8 frames, four patches.
OPTIONS = {1: VideoOptions(family="qwen2_5_vl", fps=2.0, min_frames=2, min_pixels=3136, max_pixels=20000),
           4: VideoOptions(family="qwen2_5_vl", fps=2.0, min_pixels=3136, max_pixels=20000)}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One node: the client's and the server's ``VIDCACHE_DIR`` (plugin references resolve through it)."""
    d = tmp_path_factory.mktemp("sglang-server")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(d / "node"))
        mp.delenv("VIDCACHE_SHARED", raising=False)
        yield d


@pytest.fixture(scope="module")
def ckpt(env):
    return ss.write_checkpoint(env / "ckpt")


@pytest.fixture(scope="module")
def clips(env):
    """1 s and 4 s of 160x120 H.264 at 10 fps."""
    return {t: make_video(str(env / f"clip{t}.mp4"), codec="h264", width=160, height=120, fps=10, n_frames=10 * t,
                          seed=t) for t in (1, 4)}


@pytest.fixture(scope="module", params=["stock", "plugin"])
def server(request, env, ckpt):
    with ss.Server(ckpt, request.param, node_dir=env / "node", log=env / f"server-{request.param}.log") as srv:
        print(f"\nSGLang 0.5.23 {request.param}-mode server on CPU: started in {srv.start_s:.1f} s")
        yield srv


@pytest.fixture(scope="module")
def hf_model(ckpt):
    import transformers
    return transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="sdpa").eval()


def test_check_server_cli(server, env):
    out = subprocess.run([str(VIDCACHE), "check-server", server.url, "--mode", server.mode],
                         capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ss.ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr + server.log_tail()
    assert any(ln.startswith("OK") and f"{server.mode} mode: parity established" in ln
               for ln in out.stdout.splitlines()), out.stdout
    assert any(ln.startswith("WARN [positions]") for ln in out.stdout.splitlines()), out.stdout   # Qwen2.5-VL


def _generate(server, ckpt, clip, options, frozen_format=None):
    import transformers
    proc = transformers.AutoProcessor.from_pretrained(ckpt)
    h = vidcache.get(clip, options, VideoCache())
    stock = {"transport": "file", "frozen_format": frozen_format} if server.mode == "stock" else {}
    req = prepare(proc, PROMPT, [h], mode=server.mode, **stock)
    vocab = len(proc.tokenizer)
    t0 = time.monotonic()
    status, out = server.generate({"input_ids": req.compact_ids, "video_data": req.video_data,
                                   "return_prompt_token_ids": True, "return_logprob": True, "logprob_start_len": 0,
                                   "top_logprobs_num": vocab,
                                   "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    took = time.monotonic() - t0
    assert status == 200, (out, server.log_tail())
    req.check(out)                                             # the guard: SGLang's prompt ids are the trainer's
    assert list(out["prompt_token_ids"]) == req.expanded_ids
    meta = out["meta_info"]
    eng = torch.cat([ss.engine_logprobs(meta, "input_top_logprobs", vocab),
                     ss.engine_logprobs(meta, "output_top_logprobs", vocab)])
    assert not torch.isnan(eng).any(), "SGLang did not return the full vocabulary"
    ids = req.expanded_ids + list(out["output_ids"])
    # The trainer's positions by SGLang's rule (vidcache.rope_positions) are SGLang's own get_rope_index's.
    ti = req.train_inputs
    pos = vidcache.rope_positions(proc, ids, [h], engine="sglang", mode=server.mode, config=proc_config(ckpt))
    assert torch.equal(pos, ss.sglang_positions(ckpt, ids, ti["video_grid_thw"], ti["second_per_grid_ts"])[:, 0])
    pos_tf = vidcache.rope_positions(proc, ids, [h], engine="transformers", mode=server.mode, config=proc_config(ckpt))
    return req, ids, eng, took, pos[:, None, :], pos_tf[:, None, :]


def proc_config(ckpt):
    import transformers
    return transformers.AutoConfig.from_pretrained(ckpt)


def _kl(model, req, ids, eng, pos, vision_per_video=False):
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as mq
    ti = req.train_inputs
    with pytest.MonkeyPatch.context() as mp:
        if vision_per_video:      # transformers' full-attention blocks over the whole video, as SGLang's
            orig = mq.get_vision_attention_seqlens
            mp.setattr(mq, "get_vision_attention_seqlens",
                       lambda grid_thw, config, kwargs=None: orig(grid_thw, config, merge_temporal=True, kwargs=kwargs))
        hf = ss.hf_logprobs(model, ids, ti, pos)[: len(ids) - 1].double()
    assert hf.shape == eng.shape
    kl = (eng.exp() * (eng - hf)).sum(-1)
    return kl, bool((eng.argmax(-1) == hf.argmax(-1)).all()), float((eng - hf).abs().max())


def test_generate_one_temporal_patch_is_at_the_floor(server, ckpt, clips, hf_model):
    # stock: FFV1 in Matroska, as decord opens no 2-frame NUT (vidcache refuses to write one)
    req, ids, eng, took, pos, _ = _generate(server, ckpt, clips[1], OPTIONS[1], frozen_format="ffv1")
    assert req.train_inputs["video_grid_thw"][0, 0] == 1
    kl, argmax_equal, dmax = _kl(hf_model, req, ids, eng, pos)
    print(f"\n{server.mode}: /generate {took:.2f} s, {len(req.expanded_ids)} prompt ids; vs transformers: "
          f"mean KL {kl.mean():.2e}, max KL {kl.max():.2e}, max |d logprob| {dmax:.2e}")
    assert kl.mean() < FLOOR_MEAN_KL and kl.max() < FLOOR_MAX_KL and argmax_equal


def test_generate_several_temporal_patches_differ_in_the_vision_tower(server, ckpt, clips, hf_model):
    req, ids, eng, took, pos, pos_tf = _generate(server, ckpt, clips[4], OPTIONS[4])
    assert req.train_inputs["video_grid_thw"][0, 0] == 4
    kl, _, _ = _kl(hf_model, req, ids, eng, pos)
    kl_pv, argmax_equal, dmax = _kl(hf_model, req, ids, eng, pos, vision_per_video=True)
    print(f"\n{server.mode}: /generate {took:.2f} s, {len(req.expanded_ids)} prompt ids; vs transformers: "
          f"mean KL {kl.mean():.2e} (per-frame vision attention, transformers' own), "
          f"{kl_pv.mean():.2e} (per-video, SGLang's), max |d logprob| then {dmax:.2e}")
    assert kl.mean() > 1e-2                                    # far above the floor
    assert kl_pv.mean() < FLOOR_MEAN_KL and kl_pv.max() < FLOOR_MAX_KL and argmax_equal
    if server.mode == "plugin":
        # 2/sample_fps seconds per grid: time dominates this grid (3 x 2 x 1 >= max(8, 12) / 2), so transformers'
        # own rule resumes the text elsewhere, and the real engine shows what that costs.
        assert not torch.equal(pos, pos_tf)
        kl_tf, _, _ = _kl(hf_model, req, ids, eng, pos_tf, vision_per_video=True)
        print(f"plugin: with transformers' own M-RoPE rule instead: mean KL {kl_tf.mean():.2e}")
        assert kl_tf.mean() > 1e-2
