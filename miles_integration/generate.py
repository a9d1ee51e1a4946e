"""Video-aware generate functions for ``--custom-generate-function-path``.

``generate`` (single turn, partial-rollout aware) and ``generate_multi_turn`` (Miles' tool-calling loop with the
video sent on every turn).  For a sample whose ``metadata["vidcache"]`` names videos:

* ``vidcache.prepare`` turns the templated prompt + handles into compact ids (one placeholder run per video),
  the processor-expanded ids, the ``video_data`` URIs and the train tensors.  One run serves a whole group
  (``--vidcache-prepare-cache-size``) and runs off the event loop;
* SGLang receives ``compact ids + response tail`` and ``video_data``; ``max_new_tokens`` / context truncation are
  computed by Miles' ``compute_request_payload`` on the *expanded* ids, which is what ``sample.tokens`` holds;
* every handle is pinned first (resolved to its key; a video not cached yet is built here, on first use), so
  the handle tensor of ``--vidcache-train-inputs handles`` resolves on train nodes that cannot see the source;
* ``sample.multimodal_train_inputs`` is tensors only: the model tensors, or with ``--vidcache-train-inputs
  handles`` a small handle tensor (train_hooks.py);
* the divergence guard: every request sends ``return_prompt_token_ids: true`` and the response must show that
  SGLang expanded the prompt to exactly ``sample.tokens`` (ids if returned, else ``meta_info.prompt_tokens``),
  otherwise ``vidcache.ParityError`` stops the rollout;
* partial-rollout resume reuses ``metadata["vidcache"]["request"]`` and never re-runs the processor.

Samples without video go to Miles' own ``single_turn.generate`` / ``multi_turn.generate``.
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
from collections import OrderedDict
from copy import deepcopy

import vidcache
from miles.rollout.base_types import GenerateFnInput, GenerateFnOutput
from miles.rollout.generate_hub import multi_turn, single_turn
from miles.rollout.generate_utils.generate_endpoint_utils import (
    compute_request_payload,
    compute_routing_headers,
    update_sample_from_response,
)
from miles.utils.http_utils import post
from miles.utils.types import Sample
from vidcache import PreparedRequest
from vidcache.rollout.ref import MAX_AHEAD
from vidcache.sglang.request import check_prompt_ids

from .args import VidcacheConfig, add_vidcache_arguments
from .data_source import upcoming_keys
from .meta import has_video, handles_from_metadata, request_state, set_request_state
from .server_check import ensure_servers_checked
from .train_hooks import handle_train_inputs

_EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="vidcache-prepare")
_PREPARED: "OrderedDict[tuple, concurrent.futures.Future]" = OrderedDict()


def _url(args) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"


# --- preparation ------------------------------------------------------------------------------------
def _images(sample: Sample) -> list:
    """The sample's images as Miles' own image path made them (the data source's ``multimodal_inputs``)."""
    return list((sample.multimodal_inputs or {}).get("images") or [])


def _pin_and_prepare(processor, prompt: str, handles, cfg: VidcacheConfig, images=()) -> PreparedRequest:
    """In the worker thread: pin every handle first (a video not prewarmed is fetched, decoded and cached
    here, on first use; ``prepare`` reads manifests, which never build), then ``vidcache.prepare``."""
    pinned = [h.pinned() for h in handles]
    ahead = upcoming_keys(min(cfg.server_read_ahead, MAX_AHEAD)) if cfg.mode == "plugin" else None
    return vidcache.prepare(processor, prompt, pinned, cfg.mode, cfg.transport, cfg.base_url, images=list(images),
                            ahead=ahead)


async def prepare_sample(state, sample: Sample, cfg: VidcacheConfig) -> PreparedRequest:
    """``vidcache.prepare`` for ``sample``, shared by identical prompts (a group) and run in a worker thread."""
    processor = state.processor
    if processor is None:
        raise RuntimeError(f"video sample {sample.index}: --hf-checkpoint has no processor (AutoProcessor failed); "
                           "vidcache needs the model's Qwen-VL processor")
    if not isinstance(sample.prompt, str):
        raise TypeError("video samples need a chat-templated string prompt (--apply-chat-template)")
    handles = handles_from_metadata(sample.metadata)
    images = _images(sample)
    # The images enter the key by content: a group's n samples are deep copies (other objects, same pixels).
    key = (id(processor), sample.prompt, json.dumps([h.to_dict() for h in handles], sort_keys=True),
           cfg.mode, cfg.transport, cfg.base_url, tuple(_image_digest(im) for im in images))
    fut = _PREPARED.get(key)
    if fut is None:
        fut = _EXECUTOR.submit(_pin_and_prepare, processor, sample.prompt, handles, cfg, images)
        _PREPARED[key] = fut
        while len(_PREPARED) > max(cfg.prepare_cache_size, 1):
            _PREPARED.popitem(last=False)
    else:
        _PREPARED.move_to_end(key)
    try:
        return await asyncio.wrap_future(fut)
    except BaseException:
        if _PREPARED.get(key) is fut:
            del _PREPARED[key]
        raise


def _image_digest(image) -> str:
    import xxhash
    return f"{image.mode}:{image.size}:{xxhash.xxh3_128_hexdigest(image.tobytes())}"


def start_video_sample(sample: Sample, prep: PreparedRequest, cfg: VidcacheConfig) -> dict:
    """First turn: expanded ids into ``sample.tokens``, train inputs, and the resume state into metadata."""
    sample.tokens = list(prep.expanded_ids)
    handles = handles_from_metadata(sample.metadata)
    if cfg.train_inputs == "handles":
        for h in handles:           # the trainer may not see the source: pin the content key
            h.resolve()
        # Images are not cached: their tensors travel as Miles' do, beside the handle tensor (hydrate keeps them).
        image_tensors = {k: prep.train_inputs[k] for k in ("pixel_values", "image_grid_thw") if k in prep.train_inputs}
        sample.multimodal_train_inputs = {**handle_train_inputs(handles, prep.mode), **image_tensors}
    else:
        # shared tensors, own dict; not the prompt's mm_token_type_ids: Miles concatenates every key over a
        # micro-batch (training_utils/data.py) and builds its own from the full sequence (processing_utils.py:143)
        sample.multimodal_train_inputs = {k: v for k, v in prep.train_inputs.items() if k != "mm_token_type_ids"}
    return set_request_state(sample.metadata, prep)


def video_payload(args, sample: Sample, st: dict, sampling_params: dict):
    """Miles' payload for the expanded ``sample.tokens`` (its truncation rules, and its own ``image_data`` for
    the sample's images), re-pointed at compact ids + video."""
    payload, halt = compute_request_payload(args, input_ids=sample.tokens, sampling_params=sampling_params,
                                            multimodal_inputs=sample.multimodal_inputs)
    if payload is None:
        return None, halt
    payload["input_ids"] = list(st["compact_ids"]) + list(sample.tokens[st["prompt_len"]:])
    payload["video_data"] = list(st["video_data"])
    payload["return_prompt_token_ids"] = True
    return payload, None


def check_divergence(st: dict, expected_ids, output: dict) -> None:
    """Raise ``vidcache.ParityError`` unless SGLang's expanded prompt equals ``expected_ids``
    (vidcache's one divergence check, on the whole ``/generate`` response)."""
    check_prompt_ids(list(expected_ids), output)


async def _post_checked(args, sample, st, payload) -> dict:
    expected = list(sample.tokens)
    output = await post(_url(args), payload, headers=compute_routing_headers(args, sample))
    if (output.get("meta_info") or {}).get("finish_reason", {}).get("type") != "abort":
        check_divergence(st, expected, output)
    return output


# --- single turn --------------------------------------------------------------------------------------
async def generate(input: GenerateFnInput) -> GenerateFnOutput:
    """``--custom-generate-function-path miles_integration.generate.generate``."""
    if not has_video(input.sample.metadata):
        return await single_turn.generate(input)
    args, sample, sampling_params = input.args, input.sample, input.sampling_params
    assert sample.status in {Sample.Status.PENDING, Sample.Status.ABORTED}, f"{sample.status=}"
    cfg = VidcacheConfig.from_args(args)
    await ensure_servers_checked(args, input.state.processor, cfg)     # once per process, before the first video

    if len(sample.response) > 0:                      # partial-rollout resume: no processor run
        st = request_state(sample.metadata)
        if st is None or len(sample.tokens) < st["prompt_len"]:
            raise RuntimeError(f"sample {sample.index}: resuming a video sample without its vidcache request state")
        sampling_params["max_new_tokens"] -= len(sample.tokens) - st["prompt_len"]
        assert sampling_params["max_new_tokens"] >= 0
        if sampling_params["max_new_tokens"] == 0:
            sample.status = Sample.Status.TRUNCATED
            return GenerateFnOutput(samples=sample)
    else:
        st = start_video_sample(sample, await prepare_sample(input.state, sample, cfg), cfg)

    payload, halt = video_payload(args, sample, st, sampling_params)
    if payload is None:
        sample.status = halt
        return GenerateFnOutput(samples=sample)
    output = await _post_checked(args, sample, st, payload)
    await update_sample_from_response(args, sample, payload=payload, output=output)
    return GenerateFnOutput(samples=sample)


# --- multi turn ---------------------------------------------------------------------------------------
async def generate_multi_turn(input: GenerateFnInput) -> GenerateFnOutput:
    """Miles' ``multi_turn.generate`` with the video on every turn
    (``--custom-generate-function-path miles_integration.generate.generate_multi_turn``)."""
    if not has_video(input.sample.metadata):
        return await multi_turn.generate(input)
    from miles.rollout.generate_utils.tool_call_utils import (
        create_tool_call_parser,
        execute_tool_calls,
        update_sample_with_tool_responses,
    )
    from miles.utils.misc import load_function

    args = input.args
    sample = deepcopy(input.sample)
    assert not args.partial_rollout, "Partial rollout is not supported"
    cfg = VidcacheConfig.from_args(args)
    await ensure_servers_checked(args, input.state.processor, cfg)
    execute_tool_function = load_function(args.generate_execute_tool_function_path)
    tool_specs = load_function(args.generate_tool_specs_path)
    tool_call_parser = create_tool_call_parser(tool_specs, args.generate_tool_call_parser)

    st = start_video_sample(sample, await prepare_sample(input.state, sample, cfg), cfg)
    for _turn in range(args.generate_max_turns):
        payload, halt = video_payload(args, sample, st, input.sampling_params)
        if payload is None:
            sample.status = halt
            break
        output = await _post_checked(args, sample, st, payload)
        await update_sample_from_response(args, sample, payload=payload, output=output, update_loss_mask=True)
        if output["meta_info"]["finish_reason"]["type"] in ("abort", "length"):
            break
        _, tool_calls = tool_call_parser.parse_non_stream(output["text"])
        if not tool_calls:
            break
        tool_messages = await execute_tool_calls(tool_calls, execute_tool_function)
        update_sample_with_tool_responses(sample, tool_messages, tokenizer=input.state.tokenizer)
    return GenerateFnOutput(samples=sample)


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    add_vidcache_arguments(parser)


def _add_multi_turn_arguments(parser: argparse.ArgumentParser) -> None:
    add_vidcache_arguments(parser)
    if "--generate-max-turns" not in parser._option_string_actions:
        multi_turn.generate.add_arguments(parser)


generate.add_arguments = _add_arguments
generate_multi_turn.add_arguments = _add_multi_turn_arguments
