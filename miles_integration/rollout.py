"""``VidcacheRolloutFn``: ``--rollout-function-path miles_integration.rollout.VidcacheRolloutFn``.

Miles' ``InferenceRolloutFn`` with two changes:

* ``--recompute-logprobs-via-prefill`` is video-aware.  The inner state runs with the flag off; after the rollout,
  video samples are scored one by one (``/flush_cache`` first, never batched) with ``compact ids + response``,
  their ``video_data`` and ``logprob_start_len = expanded prompt length - 1``: SGLang counts
  ``logprob_start_len`` on the expanded sequence it builds, so the returned ``input_token_logprobs`` tail lines up
  with the expanded ``sample.tokens``.  Samples without video go through Miles' own prefill code.
* eval datasets are lazy: during ``_call_eval`` Miles' eval module builds ``VidcacheDataset`` instead of the eager
  ``miles.utils.data.Dataset``.

``add_arguments`` registers the ``--vidcache-*`` flags (Miles scans the rollout-function path for it).
"""
from __future__ import annotations

import copy
import functools

from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnEvalInput, RolloutFnTrainInput
from miles.rollout.generate_utils.generate_endpoint_utils import compute_routing_headers
from miles.rollout.generate_utils.prefill_logprobs import (
    _lora_path_for_sample,
    recompute_samples_rollout_logprobs_via_prefill,
)
from miles.rollout.inference_rollout.inference_rollout_common import InferenceRolloutFn
from miles.utils.http_utils import post
from miles.utils.types import Sample

from .args import VidcacheConfig, add_vidcache_arguments
from .server_check import ensure_servers_checked
from .generate import check_divergence
from .meta import has_video, request_state


def video_prefill_payload(args, sample: Sample, sampling_params: dict) -> tuple[dict, dict]:
    """(payload, request state) that scores ``sample``'s response through SGLang with its video."""
    st = request_state(sample.metadata)
    if st is None:
        raise RuntimeError(f"sample {sample.index}: video sample without vidcache request state (not generated "
                           "by miles_integration.generate?)")
    prompt_len = st["prompt_len"]
    if len(sample.tokens) - sample.response_length != prompt_len:
        raise ValueError(f"sample {sample.index}: {len(sample.tokens)} tokens - {sample.response_length} response "
                         f"!= expanded prompt length {prompt_len}")
    payload = {
        "input_ids": list(st["compact_ids"]) + list(sample.tokens[prompt_len:]),
        "sampling_params": {**dict(sampling_params), "max_new_tokens": 0, "temperature": 0,
                            "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": prompt_len - 1,        # expanded space: where SGLang counts it
        "video_data": list(st["video_data"]),
        "return_prompt_token_ids": True,
    }
    if images := (sample.multimodal_inputs or {}).get("images"):
        # The row's images beside its videos, encoded as Miles encodes them for every request (lossless PNG).
        from miles.utils.processing_utils import encode_image_for_rollout_engine
        payload["image_data"] = [encode_image_for_rollout_engine(im) for im in images]
    if (lora := _lora_path_for_sample(args, sample)) is not None:
        payload["lora_path"] = lora
    return payload, st


def response_logprobs(sample: Sample, meta_info: dict) -> list[float]:
    items = meta_info.get("input_token_logprobs")
    if not items:
        raise ValueError("SGLang prefill scoring response did not include input_token_logprobs")
    tail = items[-sample.response_length:]
    if [it[1] for it in tail] != list(sample.tokens[-sample.response_length:]):
        raise ValueError("SGLang prefill scoring token alignment mismatch for a video sample")
    lps = [it[0] for it in tail]
    if any(lp is None for lp in lps):
        raise ValueError("SGLang prefill scoring returned None for a response-token logprob")
    return lps


async def recompute_video_logprobs_via_prefill(args, samples: list[Sample], *, url: str, sampling_params: dict) -> None:
    """Miles' ``recompute_samples_rollout_logprobs_via_prefill`` with video samples sent with their video."""
    if not getattr(args, "recompute_logprobs_via_prefill", False):
        return
    scored = [s for s in samples if s.response_length != 0 and s.status != Sample.Status.ABORTED]
    video = [s for s in scored if has_video(s.metadata)]
    other = [s for s in scored if not has_video(s.metadata)]
    if other:
        await recompute_samples_rollout_logprobs_via_prefill(args, other, url=url, sampling_params=sampling_params)
    flush_url = url.rsplit("/", 1)[0] + "/flush_cache"
    for sample in video:
        headers = compute_routing_headers(args, sample)
        await post(flush_url, {}, headers=headers)
        payload, st = video_prefill_payload(args, sample, sampling_params)
        output = await post(url, payload, headers=headers)
        check_divergence(st, sample.tokens, output)
        sample.rollout_log_probs = response_logprobs(sample, output["meta_info"])
        sample.metadata["rollout_log_probs_source"] = "sglang_prefill_recompute"


class VidcacheRolloutFn(InferenceRolloutFn):
    def __init__(self, input: RolloutFnConstructorInput):
        self.outer_args = input.args
        inner = copy.copy(input.args)
        inner.recompute_logprobs_via_prefill = False
        super().__init__(RolloutFnConstructorInput(args=inner, data_source=input.data_source))
        self.config = VidcacheConfig.from_args(input.args)

    async def _call_train(self, input: RolloutFnTrainInput):
        # Before the first rollout: every SGLang server must reproduce the trainer's inputs (check-server).
        await ensure_servers_checked(self.outer_args, self.state.processor, self.config)
        output = await super()._call_train(input)
        args = self.outer_args
        if getattr(args, "recompute_logprobs_via_prefill", False):
            samples = [s for group in output.samples for s in (group if isinstance(group, list) else [group])]
            await recompute_video_logprobs_via_prefill(
                args, samples, url=f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate",
                sampling_params=self.state.sampling_params)
        return output

    async def _call_eval(self, input: RolloutFnEvalInput):
        from miles.rollout.inference_rollout import inference_rollout_eval as ev

        from .data_source import VidcacheDataset, miles_builds_async

        await ensure_servers_checked(self.outer_args, self.state.processor, self.config)
        # scoped: other rollout functions in this process keep Miles' Dataset
        async with miles_builds_async(ev, functools.partial(VidcacheDataset, config=self.config)):
            return await super()._call_eval(input)

    add_arguments = staticmethod(add_vidcache_arguments)
