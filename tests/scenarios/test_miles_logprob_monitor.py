"""``--vidcache-logprob-monitor``: the rollout-vs-train logprob difference split by modality (issue 53).

Real tensors: the tiny random-weight Qwen2.5-VL (transformers' own class) scores a text-only sample and a video
sample (the computation check's time-dominated canary, built through vidcache) twice: at SGLang's M-RoPE positions
(the rollout engine's logprobs) and at transformers' own (a trainer without the train hook).  The difference is a
video-only defect: the split puts all of it on the tokens after the video, where Miles' batch mean dilutes it.
"""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pytest
import torch

from miles_integration.logprob_monitor import split_by_modality
from support.tiny_checkpoint import load_tiny_model, write_tiny_checkpoint
from vidcache.rollout import computation as comp

FAMILY = "qwen2_5_vl"
RESPONSE = "Coloured noise, changing fast."


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """Miles' ``rollout_data`` fields for a text-only and a video sample: full token sequences, and per response
    token the engine's (SGLang positions) and the trainer's (transformers positions) logprobs."""
    from transformers import AutoConfig

    from vidcache import VideoCache
    from vidcache.handle import train_inputs
    from vidcache.positions import positions_from_tensors, token_ids
    from vidcache.processing import expanded_ids, request_layout
    from vidcache.rollout.check import exact_canary_options, load_processor
    d = tmp_path_factory.mktemp("monitor")
    ckpt = write_tiny_checkpoint(FAMILY, d / "ckpt")
    processor, model, config = load_processor(ckpt), load_tiny_model(ckpt), AutoConfig.from_pretrained(ckpt)
    cache = VideoCache(d / "cache")
    response = processor.tokenizer(RESPONSE, add_special_tokens=False)["input_ids"]
    out = {k: [] for k in ("tokens", "log_probs", "rollout_log_probs", "response_lengths", "loss_masks")}
    for canary in (comp.Canary("text"), comp.Canary("video 4 patches", (comp.SEVERAL,))):
        handles = [comp.canary_handle(exact_canary_options(FAMILY, n), cache) for n in canary.videos]
        prompt = processor.apply_chat_template(canary.messages(), tokenize=False, add_generation_prompt=True)
        layout = request_layout(processor, FAMILY, "plugin")
        ids = (expanded_ids(processor, prompt, [h.manifest for h in handles], "plugin", layout) if handles
               else processor.tokenizer(prompt, add_special_tokens=False)["input_ids"]) + response
        tensors = dict(train_inputs(processor, handles, mode="plugin")) if handles else {}
        rows = {}
        for rule in ("sglang", "transformers"):
            pos = positions_from_tensors(processor, ids, tensors, FAMILY, rule, config=config) if handles else None
            lp = comp.trainer_logprobs(model, ids, tensors, pos)
            targets = torch.tensor(ids[-len(response):])
            rows[rule] = lp[len(ids) - len(response) - 1: len(ids) - 1].gather(-1, targets[:, None])[:, 0]
        out["tokens"].append(torch.tensor(ids))
        out["rollout_log_probs"].append(rows["sglang"])
        out["log_probs"].append(rows["transformers"])
        out["response_lengths"].append(len(response))
        out["loss_masks"].append(torch.ones(len(response), dtype=torch.int32))
    ids = token_ids(processor)
    return argparse.Namespace(data=out, ckpt=ckpt, video=ids["video_token_id"], image=ids["image_token_id"],
                              n=len(response))


def _split(b, **over):
    d = {**b.data, **over}
    return split_by_modality(d["tokens"], d["log_probs"], d["rollout_log_probs"], d["response_lengths"],
                             d["loss_masks"], video_token_id=b.video, image_token_id=b.image)


def test_the_split_puts_a_video_only_difference_on_the_tokens_after_the_video(batch):
    """Transformers' own M-RoPE rule after a time-dominated video: the tokens after it differ (> 1e-2 nats on
    average), the text-only sample's do not (same positions), so the video share is ~100% -- while Miles' batch
    mean of |d logprob| halves the video's figure."""
    split = _split(batch)
    text, video = split.parts["text"], split.parts["after video"]
    assert (text.tokens, video.tokens, split.parts["after image"].tokens) == (batch.n, batch.n, 0)
    assert text.mean < 1e-5 and video.mean > 1e-2, split.line()
    assert split.video_share > 0.999, split.line()
    whole = torch.cat([a - b for a, b in zip(batch.data["log_probs"], batch.data["rollout_log_probs"])]).abs().mean()
    assert float(whole) == pytest.approx(video.mean / 2, rel=1e-3)        # what a batch-wide mean shows
    print("\n" + split.line())
    # the loss mask decides which tokens count (Miles' tool-turn tokens carry 0); a sample whose logprobs do not cover
    # its response (context parallelism: a local slice) is skipped and said so, never misaligned
    masks = [torch.zeros(batch.n, dtype=torch.int32), batch.data["loss_masks"][1]]
    assert _split(batch, loss_masks=masks).parts["text"].tokens == 0
    short = [lp[:-1] for lp in batch.data["log_probs"]]
    skipped = _split(batch, log_probs=short)
    assert skipped.skipped == 2 and "2 samples skipped" in skipped.line()


def test_the_train_hook_logs_the_split_from_miles_log_rollout_data(batch, monkeypatch, caplog):
    """``--vidcache-logprob-monitor 2`` through ``install_train_hooks`` (``--custom-megatron-init-path``): Miles' own
    ``log_rollout_data`` (miles.backends.training_utils.log_utils), replaced by name, logs the split on rollouts 0,
    2, ... and always calls Miles' function with its arguments."""
    from support.miles_compat import miles_or_skip
    miles_or_skip(Path(__file__).resolve().parents[2])
    import miles.backends.training_utils.log_utils as log_utils

    from miles_integration.train_hooks import install_train_hooks
    calls = []
    monkeypatch.setattr(log_utils, "log_rollout_data", lambda rid, args, data: calls.append(rid))   # Miles' needs
    args = argparse.Namespace(hf_checkpoint=batch.ckpt, vidcache_positions="transformers",   # Megatron's ranks
                              vidcache_logprob_monitor=2)
    assert "miles.backends.training_utils.log_utils" in install_train_hooks(args)
    with caplog.at_level(logging.INFO, logger="miles_integration"):
        for rid in range(3):
            log_utils.log_rollout_data(rid, args, dict(batch.data))
    assert calls == [0, 1, 2]
    lines = [r.getMessage() for r in caplog.records if "by modality" in r.getMessage()]
    assert [ln.split(":")[0:2] for ln in lines] == [["vidcache", " rollout 0"], ["vidcache", " rollout 2"]], lines
    assert "video share 100.0%" in lines[0], lines[0]
