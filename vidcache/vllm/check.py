"""``vidcache check-server --engine vllm``: is this live vLLM OpenAI server going to feed the trainer's inputs?

Uses vLLM's own endpoints only:
  ``GET /version``               the vLLM release;
  ``GET /v1/models``             the served model's name and ``root`` (its checkpoint path);
  ``GET /server_info``           (only with ``VLLM_SERVER_DEV_MODE=1`` on the server) the resolved config, so
                                 ``mm_device_do_normalize`` and ``media_io_kwargs`` can be compared with
                                 ``vidcache.vllm.config.ENGINE_KWARGS``;
  ``POST /v1/chat/completions``  a canary video as a vidcache reference (``chat_request``), ``return_token_ids``.

The canary is the SGLang plugin check's (``vidcache.rollout.check``: a deterministic noise clip, cached through this
node's configuration, so the server resolves it through the shared tier like any training video).  vLLM's ``prompt_token_ids`` must equal the
trainer's expansion of the same chat message (the checkpoint's chat template, then ``expanded_ids``).

What it cannot see (docs/vllm.md, "What check-server cannot see"): the pixels (vLLM returns no tensors and has no
attestation hook before its processor), and without dev mode the server's normalisation setting; a resize that the
canary's small grid happens to survive.
"""
from __future__ import annotations

import json
import os

from ..errors import ModelTypeError, ParityError
from ..families import FAMILIES, unknown_family
from ..positions import position_warning
from ..processing import layout_of, request_layout
from .. import families as model_types
from ..rollout.check import (Cause, ServerCheck, canary_video, check_version, error_message, exact_canary_options,
                             http_json, load_processor, server_processor_dir)
from ..token_layout import implied_layout, layout_difference
from .config import (ENGINE_KWARGS, REQUEST_GATE_FLAG, VERIFIED_VLLM_VERSIONS, VLLM_TRANSFORMERS_PIN, serve_flags,
                     settings_problems)
from .request import chat_expected_ids, chat_request, check_prompt_ids

CANARY_TEXT = "vidcache canary."


def check_server(url: str, family: str | None = None, processor=None, allow_unverified: str | None = None,
                 cache=None, timeout: float = 120.0, token_layout: str | None = None) -> ServerCheck:
    """Run every check against the vLLM server at ``url``; never raises for a failed check (``.causes``).
    ``processor``: an HF processor or a directory (default: the served model's ``root`` when it is a directory
    here).  ``token_layout``: the layout the trainer's ids are in (``processing.request_layout``'s default)."""
    url = url.rstrip("/")
    res = ServerCheck(url, engine="vLLM", mode="loader")
    try:
        st_ver, ver = http_json(url + "/version", timeout=timeout)
        st_models, models = http_json(url + "/v1/models", timeout=timeout)
    except (OSError, ValueError) as e:
        res.causes.append(Cause("server", f"cannot read {url}/version and /v1/models: {e}"))
        return res
    cards = models.get("data") if st_models == 200 else None
    if st_ver != 200 or not isinstance(cards, list) or not cards or not isinstance(cards[0], dict) \
            or not isinstance(cards[0].get("id"), str):
        res.causes.append(Cause("server", f"{url} does not answer as a vLLM OpenAI server (/version: HTTP {st_ver}, "
                                          f"/v1/models: HTTP {st_models}, no served model listed): check the URL "
                                          "and port; an SGLang server is checked without --engine vllm"))
        return res
    card = cards[0]
    model = card["id"]

    res.version = version = str(ver.get("version"))
    check_version(res, "vLLM", version, VERIFIED_VLLM_VERSIONS, allow_unverified)

    if processor is None and (processor := server_processor_dir(res, card.get("root"),
                                                                "the served model's root")) is None:
        return res
    if isinstance(processor, (str, os.PathLike)):
        try:      # the family from what decides the checkpoint's video processing (vidcache.families)
            derived = model_types.derive(processor, family)
        except ModelTypeError as e:
            res.causes.append(Cause("model", str(e)))
            return res
        if not derived.verified:
            res.warnings.append(derived.reason)
        family = derived.family
    if family is None:
        res.causes.append(Cause("model", "no checkpoint directory to derive the family from: pass --processor DIR "
                                         f"or --family ({', '.join(sorted(FAMILIES))})"))
        return res
    if family not in FAMILIES:
        raise ValueError(unknown_family(family))
    res.family = family
    if (warn := position_warning(family, "vllm")) is not None:
        res.warnings.append(warn)          # the trainer's own rule (this environment's transformers): a warning

    # --- the engine settings, where the server reports them (dev mode only)
    status, info = http_json(url + "/server_info?config_format=json", timeout=timeout)
    mc = ((info.get("vllm_config") or {}).get("model_config")) if status == 200 else None
    if isinstance(mc, dict):
        problems = settings_problems(mc, family)
        for p in problems:
            res.causes.append(Cause("config", f"{p}. Start the server with {' '.join(serve_flags(family))}"))
        if not problems:
            res.passed.append("engine settings match (mm_device_do_normalize off, vidcache loader)")
    else:
        res.warnings.append("the server does not report its config (/server_info needs VLLM_SERVER_DEV_MODE=1): "
                            "mm_device_do_normalize is NOT checked; it must be off "
                            f"({' '.join(serve_flags(family))}), or vLLM normalises on the GPU with other rounding")

    if isinstance(processor, (str, os.PathLike)):
        processor = load_processor(str(processor))
    if not getattr(processor, "chat_template", None):
        res.causes.append(Cause("processor", "the processor has no chat template: the canary goes through vLLM's chat "
                                             "endpoint, whose prompt the trainer can only reproduce with it"))
        return res
    _canary(res, url, model, processor, family, cache, timeout, version, token_layout)
    return res


def _canary(res, url, model, processor, family, cache, timeout, version, token_layout) -> None:
    h = canary_video(exact_canary_options(family), cache)
    layout = request_layout(processor, family, "plugin", token_layout)
    res.token_layout = layout
    expected = chat_expected_ids(processor, CANARY_TEXT, [h], layout)
    status, body = http_json(url + "/v1/chat/completions", chat_request(model, CANARY_TEXT, [h], max_tokens=1),
                         timeout=timeout)
    if status != 200:
        msg = error_message(body)
        if REQUEST_GATE_FLAG in msg or "Per-request mm_processor_kwargs" in msg:
            # vLLM refused the request before any video was loaded: the loader was never asked
            res.causes.append(Cause("request", f"the server refuses per-request mm_processor_kwargs (vidcache's "
                                               "frames-are-final settings): start it with "
                                               f"{REQUEST_GATE_FLAG} ({' '.join(serve_flags(res.family))}). vLLM said "
                                               f"(HTTP {status}): {msg[:300]}"))
        elif "vidcache" in msg and ("reference" in msg or "cache" in msg):
            res.causes.append(Cause("loader", f"vidcache's loader could not resolve the canary: {msg[:500]}"))
        else:
            res.causes.append(Cause("loader", "vidcache's loader is not selected: vLLM decoded the canary's "
                                              "reference as a video file (start the server with --media-io-kwargs "
                                              f"'{json.dumps(ENGINE_KWARGS['media_io_kwargs'])}' and vidcache "
                                              f"installed there). vLLM said (HTTP {status}): {msg[:300]}"))
        return
    try:
        check_prompt_ids(expected, body)
        res.passed.append(f"canary ids match ({len(expected)} tokens, token layout '{layout}')")
    except ParityError as e:
        got = list(body.get("prompt_token_ids") or [])
        diff = layout_difference(expected, got)
        if diff:
            tf = VLLM_TRANSFORMERS_PIN.get(version)
            server = implied_layout(family, tf) or next(x for x in FAMILIES[family].layouts if x != layout)
            res.causes.append(Cause("layout", f"token layout differs: the trainer sends '{layout}' (transformers here "
                                              f"expands in '{layout_of(processor, family)}'), vLLM's chat endpoint "
                                              f"expands in '{server}'"
                                              + (f" (transformers {tf}, vLLM {version}'s)" if tf else "")
                                              + f" ({len(expected)} vs {len(got)} canary ids). Fix: run the trainer "
                                              f"with token_layout='{server}' (--token-layout {server}) for requests "
                                              "through the chat endpoint, or send token prompts (vidcache.vllm."
                                              "prepare_vllm puts them in the trainer's layout)"))
        else:
            res.causes.append(Cause("ids", f"the canary's expanded ids differ: {e}"))
