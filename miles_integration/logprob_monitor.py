"""The video share of Miles' rollout-vs-train logprob difference (``--vidcache-logprob-monitor N``).

Miles logs the train-side ``log_probs`` and the engine's ``rollout_log_probs`` each as one mean over the whole batch
(``miles.backends.training_utils.log_utils.log_rollout_data``), so a difference that only videos cause (a vision
tower attending otherwise, another M-RoPE rule: 1.5-4.8 nats/token on the tokens after a video) is diluted by the
text-only samples and its cause unnamed.  This splits the difference per scored response token by what precedes the
token in its sequence: a video (``after video``: a video-only defect shows here and only here), an image only
(``after image``), or text alone (``text``).  Tokens inside a video span (a tool turn's) carry loss mask 0 and are
not scored, as in Miles.

``split_by_modality`` is pure (torch only) and can be called on any batch; ``wrap_log_rollout_data`` is what the train
hook installs (``train_hooks.install_train_hooks``): every Nth rollout it logs one line per modality before Miles'
own ``log_rollout_data`` runs.  No Miles hook receives both tensors: ``--custom-megatron-before-train-step-hook-path``
gets (args, rollout_id, step_id, model, optimizer, scheduler) and ``rollout_data_postprocess`` gets args only
(miles/backends/megatron_utils/model.py:461, actor.py:564), so, like ``get_batch``, the function is replaced by name
in the modules that import it.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

MODALITIES = ("text", "after image", "after video")


@dataclass(frozen=True)
class Part:
    tokens: int
    abs_diff: float           # sum over the tokens of |train - rollout| logprob, nats

    @property
    def mean(self) -> float:
        return self.abs_diff / self.tokens if self.tokens else 0.0


@dataclass(frozen=True)
class Split:
    parts: dict[str, Part]
    skipped: int = 0          # samples whose logprobs do not cover the response (context parallelism: local slices)

    @property
    def video_share(self) -> float:
        """The share of the whole batch's |difference| on tokens after a video (0 when there is no difference)."""
        total = sum(p.abs_diff for p in self.parts.values())
        return self.parts["after video"].abs_diff / total if total else 0.0

    def line(self) -> str:
        body = "; ".join(f"{m} {p.tokens} tokens, mean |d logprob| {p.mean:.3g}" for m, p in self.parts.items())
        return (f"rollout-vs-train logprob difference by modality: {body}; video share {self.video_share:.1%}"
                + (f" ({self.skipped} samples skipped: logprobs not over the whole response)" if self.skipped else ""))


def response_modality(tokens, response_length: int, video_token_id: int, image_token_id: int) -> list[str]:
    """Per response token (the last ``response_length`` of ``tokens``): what precedes it in the sequence."""
    t = torch.as_tensor(tokens).reshape(-1)
    seen_video = torch.cumsum(t == video_token_id, 0) > 0
    seen_image = torch.cumsum(t == image_token_id, 0) > 0
    start = t.numel() - response_length
    # token j is predicted from the tokens before it: a video at position j itself is inside a span (masked anyway)
    return ["after video" if seen_video[i - 1] else "after image" if seen_image[i - 1] else "text"
            for i in range(start, t.numel())]


def split_by_modality(tokens, log_probs, rollout_log_probs, response_lengths, loss_masks, *, video_token_id: int,
                      image_token_id: int) -> Split:
    """The |train - rollout| logprob difference of a batch (Miles' ``rollout_data`` lists, one entry per sample),
    summed per modality over the tokens the loss counts."""
    sums = {m: [0, 0.0] for m in MODALITIES}
    skipped = 0
    for toks, lp, rlp, n, mask in zip(tokens, log_probs, rollout_log_probs, response_lengths, loss_masks):
        lp, rlp = torch.as_tensor(lp).double().cpu(), torch.as_tensor(rlp).double().cpu()
        mask = torch.as_tensor(mask).cpu().bool()
        if not lp.numel() == rlp.numel() == mask.numel() == n:
            skipped += 1
            continue
        diff = (lp - rlp).abs()
        for m, d, keep in zip(response_modality(toks, n, video_token_id, image_token_id), diff.tolist(),
                              mask.tolist()):
            if keep:
                sums[m][0] += 1
                sums[m][1] += d
    return Split({m: Part(k, s) for m, (k, s) in sums.items()}, skipped)


def wrap_log_rollout_data(log_rollout_data, token_ids_factory, every: int):
    """Miles' ``log_rollout_data(rollout_id, args, rollout_data)``, which first logs the split every ``every``
    rollouts where the batch has both logprobs.  ``token_ids_factory() -> (video id, image id)``."""
    if getattr(log_rollout_data, "_vidcache_wrapped", False):
        return log_rollout_data

    @functools.wraps(log_rollout_data)
    def vidcache_log_rollout_data(rollout_id, args, rollout_data, *a, **kw):
        if rollout_id % every == 0 and rollout_data.get("log_probs") and rollout_data.get("rollout_log_probs"):
            video, image = token_ids_factory()
            split = split_by_modality(rollout_data["tokens"], rollout_data["log_probs"],
                                      rollout_data["rollout_log_probs"], rollout_data["response_lengths"],
                                      rollout_data["loss_masks"], video_token_id=video, image_token_id=image)
            logger.info("vidcache: rollout %s: %s", rollout_id, split.line())
        return log_rollout_data(rollout_id, args, rollout_data, *a, **kw)

    vidcache_log_rollout_data._vidcache_wrapped = True
    vidcache_log_rollout_data.__wrapped__ = log_rollout_data
    return vidcache_log_rollout_data
