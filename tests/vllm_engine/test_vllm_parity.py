"""vLLM 0.34.0's own multimodal processor (transformers 5.22.2, in the overlay's process) fed through vidcache's
request builder gives the trainer's tensors and ids, for Qwen2-VL, Qwen2.5-VL and Qwen3-VL on the test clips:
``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts`` ``torch.equal`` to ``train_inputs`` (transformers
5.24.0 here) and the prompt ids equal to the request's ``expanded_ids``; one 2-video prompt per family; Qwen3-VL in
both token layouts.  And vLLM's default (``mm_device_do_normalize`` on) is shown not to be exact: it returns the
raw uint8 patches (normalised later, on the GPU), which is why ``ENGINE_KWARGS`` turns it off.

All cases run in one subprocess (vLLM's import and three processors cost ~20 s a family on CPU)."""
from __future__ import annotations

import pytest
import torch

from support import vllm_peer as vp

vp.overlay_or_skip()

import vidcache  # noqa: E402
from vidcache import VideoOptions  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER  # noqa: E402
from vidcache.testing.processors import FAMILIES, build_processor  # noqa: E402
from vidcache.vllm.config import ENGINE_KWARGS  # noqa: E402
from vidcache.vllm.request import prepare_vllm  # noqa: E402

pytestmark = pytest.mark.vllm
CLIPS = ("h264_ntsc", "mpeg4_25_odd", "ffv1_10_small")     # 29.97 fps, 25 fps at an odd size, 10 fps tiny
PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe the video.<|im_end|>\n<|im_start|>assistant\n"
PROMPT2 = (f"<|im_start|>user\nFirst {VIDEO_PLACEHOLDER}, then {VIDEO_PLACEHOLDER}: what changed?<|im_end|>\n"
           "<|im_start|>assistant\n")


SMALL = {"shortest_edge": 3136, "longest_edge": 4 * 3136}        # 112 x 112: below the cached frames' size


def _opts(family):
    return VideoOptions(family=family, fps=2.0, min_pixels=3136, max_pixels=50176)


@pytest.fixture(scope="module")
def run(tmp_path_factory, videos):
    """Every case's request (built here), the trainer's processors, and vLLM's outputs for them."""
    root = tmp_path_factory.mktemp("vllm-parity")
    node = root / "node"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(node))
        mp.delenv("VIDCACHE_SHARED", raising=False)
        mp.delenv("VIDCACHE_TOKEN_LAYOUT", raising=False)
        cases, reqs, procs = [], {}, {}
        for fam in FAMILIES:
            procs[fam] = proc = build_processor(fam)
            ckpt = vp.write_checkpoint(fam, root / f"ckpt-{fam}")
            handles = {c: vidcache.get(videos[c], _opts(fam)) for c in CLIPS}
            plan = [(f"{fam}-{c}", PROMPT, [c], None, False) for c in CLIPS]
            plan += [(f"{fam}-two", PROMPT2, list(CLIPS[:2]), None, False),
                     (f"{fam}-default-norm", PROMPT, [CLIPS[0]], None, None)]
            if fam == "qwen3_vl":
                plan.append((f"{fam}-wrapped", PROMPT, [CLIPS[0]], "wrapped", False))
            if fam == "qwen2_5_vl":     # a checkpoint whose pixel bounds would shrink the cached frames
                small = vp.write_checkpoint(fam, root / f"ckpt-{fam}-small", size=SMALL)
                for name, kw in ((f"{fam}-small-bounds", None), (f"{fam}-small-bounds-resized", {})):
                    req = prepare_vllm(proc, PROMPT, [handles[CLIPS[0]]])
                    reqs[name] = (fam, [handles[CLIPS[0]]], req)
                    cases.append({"name": name, "ckpt": small, "device_norm": False, "keys": req.keys,
                                  "prompt_token_ids": req.prompt["prompt_token_ids"],
                                  "mm_processor_kwargs": req.prompt["mm_processor_kwargs"] if kw is None else kw})
            for name, prompt, clips, layout, norm in plan:
                hs = [handles[c] for c in clips]
                req = prepare_vllm(proc, prompt, hs, token_layout=layout)
                reqs[name] = (fam, hs, req)
                cases.append({"name": name, "ckpt": ckpt, "device_norm": norm, "keys": req.keys,
                              "prompt_token_ids": req.prompt["prompt_token_ids"],
                              "mm_processor_kwargs": req.prompt["mm_processor_kwargs"],
                              "frames_layout": "thwc" if name.endswith(CLIPS[1]) else "tchw"})
        for mt in MODEL_TYPES:          # Qwen3.5 lines: one clip, both layouts, their own config and real ids
            procs[mt] = proc = build_processor(mt)
            ckpt = vp.write_checkpoint(mt, root / f"ckpt-{mt}")
            hs = [vidcache.get(videos[CLIPS[0]], _opts("qwen3_vl"))]
            for layout in (None, "wrapped"):
                name = f"{mt}-{CLIPS[0]}" + ("-wrapped" if layout else "")
                req = prepare_vllm(proc, PROMPT, hs, token_layout=layout)
                reqs[name] = (mt, hs, req)
                cases.append({"name": name, "ckpt": ckpt, "device_norm": False, "keys": req.keys,
                              "prompt_token_ids": req.prompt["prompt_token_ids"],
                              "mm_processor_kwargs": req.prompt["mm_processor_kwargs"], "frames_layout": "tchw"})
        out = vp.run_process({"cases": cases}, root / "work", node)
        yield reqs, procs, out


# vLLM 0.34 registers Qwen3.5's architectures with Qwen3-VL's multimodal processor (model_executor/models/qwen3_5.py);
# its Qwen4Exp model code is GPU-platform only (vllm/models/qwen4_exp/{nvidia,amd}): not run here.
MODEL_TYPES = ("qwen3_5", "qwen3_5_moe")
EXACT = [f"{f}-{c}" for f in FAMILIES for c in CLIPS + ("two",)] + ["qwen3_vl-wrapped", "qwen2_5_vl-small-bounds"] + \
    [f"{t}-{CLIPS[0]}{w}" for t in MODEL_TYPES for w in ("", "-wrapped")]


@pytest.mark.parametrize("name", EXACT)
def test_vllm_processor_equals_the_trainer(run, name):
    reqs, procs, out = run
    fam, handles, req = reqs[name]
    got = out[name]
    want = vidcache.train_inputs(procs[fam], handles, mode="plugin")          # the trainer's tensors (plugin mode), from the cache
    for k, w in want.items():
        assert k in got, f"vLLM returned no {k} ({sorted(got)})"
        g = got[k]
        assert g.dtype == w.dtype or k == "video_grid_thw", (k, g.dtype, w.dtype)
        assert torch.equal(g.to(w.dtype) if k == "video_grid_thw" else g, w), f"{name}: {k} differs"
    assert got["prompt_token_ids"].tolist() == req.expanded_ids
    req.check(got["prompt_token_ids"].tolist())                   # the guard agrees
    if fam in ("qwen3_vl",) + MODEL_TYPES:     # the layout the trainer asked for is what vLLM produced
        start = procs[fam].tokenizer.convert_tokens_to_ids("<|vision_start|>")
        grids = [int(g[0]) for g in want["video_grid_thw"].tolist()]        # one <|vision_start|> per temporal group
        extra = 0 if req.token_layout == "collapsed" else len(handles)
        assert req.expanded_ids.count(start) == sum(grids) + extra, req.token_layout


@pytest.mark.parametrize("fam", FAMILIES)
def test_vllm_default_device_norm_returns_raw_uint8_patches(run, fam):
    """vLLM 0.34.0's default leaves normalisation to the GPU: its processor output is the unnormalised uint8
    patches, equal to HF's patchify with rescale and normalise off, and so not the trainer's tensor."""
    reqs, procs, out = run
    assert ENGINE_KWARGS["mm_device_do_normalize"] is False
    _, handles, req = reqs[f"{fam}-default-norm"]
    got = out[f"{fam}-default-norm"]["pixel_values_videos"]
    assert got.dtype == torch.uint8
    want = vidcache.train_inputs(procs[fam], handles, mode="plugin")["pixel_values_videos"]
    assert got.shape == want.shape and not torch.equal(got.float(), want)
    from vidcache.processing import processor_kwargs
    kw = processor_kwargs(procs[fam], [h.manifest for h in handles], "plugin")
    raw = procs[fam](videos=[handles[0].frames()], do_rescale=False, do_normalize=False, **kw)["pixel_values_videos"]
    assert torch.equal(got.float(), raw)
    assert out[f"{fam}-default-norm"]["prompt_token_ids"].tolist() == req.expanded_ids   # the ids cannot tell


@pytest.mark.parametrize("fam", ["qwen2_5_vl"])
def test_without_mm_processor_kwargs_vllm_resizes_cached_frames(run, fam):
    """Against a checkpoint whose pixel bounds are below the cached frames' size, ``MM_PROCESSOR_KWARGS`` keep vLLM
    exact (the EXACT case ``qwen2_5_vl-small-bounds``); without them vLLM resizes the cached frames: another grid."""
    reqs, procs, out = run
    _, handles, _ = reqs[f"{fam}-small-bounds-resized"]
    want = vidcache.train_inputs(procs[fam], handles, mode="plugin")["video_grid_thw"]
    got = out[f"{fam}-small-bounds-resized"]["video_grid_thw"].to(want.dtype)
    assert got.prod() < want.prod(), (got, want)          # shrunk into the checkpoint's bounds
