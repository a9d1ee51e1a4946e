"""``vidcache check-computation`` against a SGLang server: each canary (``rollout.computation``) is ``prepare``d as a
rollout would be and sent to ``/generate`` with ``return_logprob``, ``logprob_start_len: 0`` and ``top_logprobs_num``
(SGLang returns the prompt's and the sample's top logprobs: ``meta_info.input_top_logprobs`` /
``output_top_logprobs``); the guard checks SGLang's prompt ids are the trainer's before anything is scored."""
from __future__ import annotations

from ..errors import ParityError
from ..rollout import computation as comp
from ..rollout.check import error_message, http_json
from .check import canary_options
from .request import prepare


def engine_rows(meta: dict, key: str, vocab: int):
    """``meta_info[key]`` (``input_top_logprobs`` / ``output_top_logprobs``: per position ``[logprob, token id,
    text]`` triples) as a dense ``N x vocab`` float64 tensor; the prompt's first row (no prediction) is dropped."""
    return comp.dense_rows([[(int(t), float(lp)) for lp, t, *_ in row] for row in meta[key] if row], vocab)


def sender(url: str, processor, family: str, mode: str, vocab: int, top_k: int, cache=None, timeout: float = 600,
           token_layout: str | None = None, sglang_version: str | None = None):
    """``send(canary) -> Sample`` for the SGLang server at ``url``."""
    import torch
    url = url.rstrip("/")

    def send(c: comp.Canary) -> comp.Sample:
        handles = [comp.canary_handle(canary_options(family, mode, sglang_version, n), cache) for n in c.videos]
        images = [comp.canary_image() for _ in range(c.images)]
        # stock: SGLang decodes the frozen file itself, and decord opens no 2-frame NUT: Matroska (FFV1) for those
        stock = {"frozen_format": "ffv1"} if mode == "stock" and min(c.videos, default=4) < 4 else {}
        req = prepare(processor, c.text(), handles, mode=mode, images=images, token_layout=token_layout, **stock)
        payload = {"input_ids": req.compact_ids, "return_prompt_token_ids": True, "return_logprob": True,
                   "logprob_start_len": 0, "top_logprobs_num": top_k,
                   "sampling_params": {"max_new_tokens": comp.NEW_TOKENS, "temperature": 0}}
        if handles:
            payload["video_data"] = req.video_data
        if images:
            payload["image_data"] = [comp.image_data_uri(im) for im in images]
        status, out = http_json(url + "/generate", payload, timeout)
        if status != 200:
            raise comp.Refused(f"HTTP {status}: {error_message(out)[:300]}")
        req.check(out)                  # the guard: SGLang's prompt ids are the trainer's (ParityError otherwise)
        meta = out["meta_info"]
        rows = torch.cat([engine_rows(meta, "input_top_logprobs", vocab),
                          engine_rows(meta, "output_top_logprobs", vocab)])
        ids = req.expanded_ids + [int(i) for i in out["output_ids"]]
        if rows.shape[0] != len(ids) - 1:
            raise ParityError(f"SGLang returned logprobs for {rows.shape[0]} positions, expected {len(ids) - 1}")
        return comp.Sample(ids, rows, dict(req.train_inputs), len(req.expanded_ids))
    return send


def check_computation(url: str, checkpoint: str, mode: str, cache=None, token_layout: str | None = None,
                      timeout: float = 600, **kw) -> comp.ComputationCheck:
    """``rollout.computation.check`` against the SGLang server at ``url`` (``kw``: its options)."""
    def make_send(processor, family, vocab, k):
        return sender(url, processor, family, mode, vocab, k, cache, timeout, token_layout)
    return comp.check(url, checkpoint, "sglang", mode, make_send, **kw)
