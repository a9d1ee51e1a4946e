"""``vidcache check-computation --engine vllm``: each canary (``rollout.computation``) goes to vLLM's OpenAI chat
endpoint as a rollout would send it (its videos as vidcache references, ``chat_request``'s frames-are-final kwargs)
with ``logprobs``/``top_logprobs`` and ``prompt_logprobs``.  vLLM returns at most ``--max-logprobs`` per position
(default 20): the check asks for top-k and says so (``rollout.computation.top_k_for``).  The image canary is not sent
(vLLM's image path is not one vidcache prepares)."""
from __future__ import annotations

from ..errors import ParityError
from ..handle import train_inputs
from ..processing import expanded_ids, request_layout
from ..rollout import computation as comp
from ..rollout.check import error_message, exact_canary_options, http_json
from ..rollout.ref import ref_uri
from .config import MM_PROCESSOR_KWARGS
from .request import check_prompt_ids

DEFAULT_MAX_LOGPROBS = 20          # vLLM's --max-logprobs default


def _token(tok: str) -> int:
    """``return_tokens_as_token_ids``' spelling of a token: ``token_id:123``."""
    return int(str(tok).rpartition(":")[2])


def sender(url: str, model: str, processor, family: str, vocab: int, top_k: int, cache=None, timeout: float = 600,
           token_layout: str | None = None):
    """``send(canary) -> Sample`` for the vLLM server at ``url`` serving ``model`` (its name in ``/v1/models``)."""
    import torch
    url = url.rstrip("/")
    layout = request_layout(processor, family, "plugin", token_layout)

    def send(c: comp.Canary) -> comp.Sample:
        if c.images:
            raise comp.Refused("images are not sent to vLLM by this check")
        handles = [comp.canary_handle(exact_canary_options(family, n), cache) for n in c.videos]
        refs = iter(ref_uri(h.identity, h.resolve()) for h in handles)
        msgs = c.messages()
        wire = [{**m, "content": [{"type": "video_url", "video_url": {"url": next(refs)}} if p["type"] == "video"
                                  else p for p in m["content"]]} for m in msgs]
        prompt = processor.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        expected = (expanded_ids(processor, prompt, [h.manifest for h in handles], "plugin", layout) if handles
                    else list(processor.tokenizer(prompt, add_special_tokens=False)["input_ids"]))
        body = {"model": model, "messages": wire, "max_tokens": comp.NEW_TOKENS, "temperature": 0,
                "return_token_ids": True, "return_tokens_as_token_ids": True, "logprobs": True, "top_logprobs": top_k,
                "prompt_logprobs": top_k, "mm_processor_kwargs": dict(MM_PROCESSOR_KWARGS)}
        status, out = http_json(url + "/v1/chat/completions", body, timeout)
        if status != 200:
            raise comp.Refused(f"HTTP {status}: {error_message(out)[:300]}")
        check_prompt_ids(expected, out)         # the guard (ParityError)
        choice = out["choices"][0]
        prompt_rows = [[(int(t), float(v["logprob"])) for t, v in row.items()] for row in out["prompt_logprobs"][1:]]
        out_rows = [[(_token(e["token"]), float(e["logprob"])) for e in pos["top_logprobs"]]
                    for pos in choice["logprobs"]["content"]]
        rows = torch.cat([comp.dense_rows(prompt_rows, vocab), comp.dense_rows(out_rows, vocab)])
        ids = expected + [int(i) for i in choice["token_ids"]]
        if rows.shape[0] != len(ids) - 1:
            raise ParityError(f"vLLM returned logprobs for {rows.shape[0]} positions, expected {len(ids) - 1}")
        tensors = dict(train_inputs(processor, handles, mode="plugin")) if handles else {}
        return comp.Sample(ids, rows, tensors, len(expected))
    return send


def check_computation(url: str, checkpoint: str, cache=None, token_layout: str | None = None, timeout: float = 600,
                      max_logprobs: int = DEFAULT_MAX_LOGPROBS, **kw) -> comp.ComputationCheck:
    """``rollout.computation.check`` against the vLLM server at ``url`` (its first model in ``/v1/models``);
    ``max_logprobs``: the server's ``--max-logprobs`` (asking for more is refused)."""
    _, models = http_json(url.rstrip("/") + "/v1/models", timeout=timeout)
    model = (models.get("data") or [{}])[0].get("id")
    if model is None:
        raise ParityError(f"{url}/v1/models names no model: is it a vLLM OpenAI server?")

    def make_send(processor, family, vocab, k):
        return sender(url, model, processor, family, vocab, k, cache, timeout, token_layout)
    return comp.check(url, checkpoint, "vllm", "plugin", make_send, top_k_cap=max_logprobs, **kw)
