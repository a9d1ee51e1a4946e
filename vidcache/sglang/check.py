"""``vidcache check-server``: is this live SGLang server going to feed the trainer's inputs?

Uses SGLang's own endpoints only:
  ``GET /server_info``   ``version``, ``mm_process_config``, ``device`` (the resolved server args);
  ``GET /model_info``    ``model_type``, ``architectures``, ``tokenizer_path``;
  ``POST /generate``     a canary video with ``return_prompt_token_ids`` and ``max_new_tokens: 0``.

The canary is a small synthetic clip, cached by vidcache through this node's configuration (so in plugin
mode the server resolves it through the shared tier, like any training video), and sent exactly as a
rollout would (``prepare``).  SGLang's expanded ids must equal the trainer's; in plugin mode the canary
carries an attestation with its rows (``attest="values"``), so a passing canary proves the plugin is
loaded and that its pixels, grid and ``second_per_grid_ts`` are the trainer's, and a second canary with
a deliberately wrong attestation must be refused (proof that the plugin checks).

Each failed check is one ``Cause`` naming what differs; parity is established only when there is none.
"""
from __future__ import annotations

import json
import os

from ..errors import ModelTypeError, ParityError
from ..options import VideoOptions
from ..positions import position_warning
from ..processing import VIDEO_PLACEHOLDER, layout_of, request_layout
from .. import families
from ..families import FAMILIES, unknown_family
from ..rollout.check import (Cause, ServerCheck, canary_video, check_version, error_message, exact_canary_options,
                             http_json, load_processor, local_checkpoint, server_processor_dir)
from ..rollout.ref import parse_ref, ref_uri
from ..token_layout import (ENV_LAYOUT, implied_layout, layout_difference, server_transformers,
                            unverified_warning)
from .config import mm_process_config
from ..sglang_facts import (MODEL_PACKAGE, MODEL_PACKAGE_ENV, MODES, STOCK_GPU_TORCHCODEC,
                            TRAINER_VISION, VERIFIED_SGLANG_VERSIONS, VISION_ACROSS_FRAMES,
                            default_mode, server_vision, stock_distorts, stock_grid, stock_pixel_bounds,
                            vision_differs)
from .request import ATTESTATION_MARK, check_prompt_ids, parse_server_facts, prepare
from .transport import ENV_SERVER_PATH

# SGLang's model_type -> vidcache family: the one table of model types (vidcache.families).
FAMILY_OF_MODEL_TYPE = families.FAMILY_OF_MODEL_TYPE
CANARY_PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}vidcache canary.<|im_end|>\n<|im_start|>assistant\n"
# The caller's spelling of the settings a failure tells the operator to change: the CLI's by default; Miles'
# startup check (miles_integration/server_check.py) passes its --vidcache-* flags, so the fix named is the one
# its user can type.
CLI_FLAGS = {"allow_unverified": "--allow-unverified-sglang", "server_torchcodec": "--server-torchcodec",
             "mode": "--mode", "server_vision": "--server-vision package"}


def canary_options(family: str, mode: str, sglang_version: str | None = None, nframes: int | None = None) -> VideoOptions:
    """Plugin mode: the exact canary (``rollout.check.exact_canary_options``: two small frames).  Stock mode: four
    (decord cannot open a two-frame frozen NUT file: "broken metadata"), on a grid stock SGLang keeps (Qwen3-VL
    stock: 224), and within the release's pixel bounds (``sglang_facts.stock_pixel_bounds``: 224x448 for Qwen3-VL
    on SGLang 0.5.16).  ``nframes``: another count (the computation check's canaries; stock mode sends fewer than
    four as Matroska, ``frozen_format="ffv1"``)."""
    if mode == "plugin":
        return exact_canary_options(family, nframes or 2)
    distorts = stock_distorts(family)     # Qwen3-VL: stock SGLang keeps only its 224 grid
    side = stock_grid(family) if distorts else 2 * FAMILIES[family].grid
    width = side
    while width * side < stock_pixel_bounds(family, sglang_version)[0]:
        width += side
    return VideoOptions(family=family, nframes=nframes or 4, resized_height=side, resized_width=width,
                        size_factor=stock_grid(family) if distorts else None)


def canary_handle(family: str, mode: str, cache=None, sglang_version: str | None = None):
    """The canary video for ``mode`` (``canary_options``), cached through this node's configuration
    (``rollout.check.canary_video``: the same entry on every run)."""
    return canary_video(canary_options(family, mode, sglang_version), cache)


def check_server(url: str, family: str | None = None, mode: str | None = None, processor=None,
                 allow_unverified: str | None = None, server_torchcodec: str | None = None,
                 cache=None, timeout: float = 120.0, token_layout: str | None = None,
                 flags: dict[str, str] | None = None, trainer_positions: bool = True,
                 server_vision: str | None = None) -> ServerCheck:
    """Run every check against the SGLang server at ``url``; never raises for a failed check (see
    ``ServerCheck.causes``).  ``processor``: an HF processor or a directory (default: the server's
    ``tokenizer_path`` when it exists here).  ``allow_unverified``: the exact SGLang version to accept
    although it is not in ``VERIFIED_SGLANG_VERSIONS``.  ``server_torchcodec``: the torchcodec version
    installed on a GPU server (stock mode; nothing over HTTP reports it).  ``token_layout``: the layout the
    trainer's ids are in (``processing.request_layout``'s default otherwise).  ``flags``: the caller's names for
    ``CLI_FLAGS``' settings, used in the fixes the failures name.  ``trainer_positions``: warn when this
    environment's transformers computes other M-RoPE positions than SGLang (``vidcache.positions``); off where
    the trainer is given SGLang's (Miles with vidcache's train hooks).  ``server_vision``: ``"package"`` states that
    the servers run vidcache's model package (stock mode: nothing reports it; plugin mode: the plugin does)."""
    flags = {**CLI_FLAGS, **(flags or {})}
    url = url.rstrip("/")
    res = ServerCheck(url, engine="SGLang", mode_flag=flags["mode"])
    try:
        status, info = http_json(url + "/server_info", timeout=timeout)
        if status != 200 or "version" not in info:
            res.causes.append(Cause("server", _not_sglang(url, status, timeout)))
            return res
        status, model = http_json(url + "/model_info", timeout=timeout)
        if status != 200:
            res.causes.append(Cause("server", f"{url}/model_info answered HTTP {status}: {error_message(model)[:200]}"))
            return res
    except (OSError, ValueError) as e:
        res.causes.append(Cause("server", f"cannot read {url}/server_info and /model_info: {e}"))
        return res

    # --- version
    res.version = version = str(info.get("version"))
    check_version(res, "SGLang", version, VERIFIED_SGLANG_VERSIONS, allow_unverified, flags["allow_unverified"])

    # --- model and family: from the checkpoint's processing (--processor DIR) and the server's model_type
    model_type = model.get("model_type")
    served = FAMILY_OF_MODEL_TYPE.get(model_type) if isinstance(model_type, str) else None
    ckpt = processor if isinstance(processor, (str, os.PathLike)) else None
    if processor is None and (found := local_checkpoint(model.get("tokenizer_path"))) is not None:
        ckpt = found                  # a directory here, or the hub id's snapshot in the local HF cache
    if ckpt is not None:
        try:
            derived = families.derive(ckpt, family, model_type=model_type)
        except ModelTypeError as e:
            res.causes.append(Cause("model", str(e)))
            return res
        if not derived.verified:
            res.warnings.append(derived.reason)
        if derived.model_type != model_type:
            res.causes.append(Cause("model", f"the server runs model_type {model_type!r} "
                                             f"({model.get('architectures')}), the checkpoint {ckpt} is "
                                             f"{derived.model_type!r}: pass the --processor of the served model"))
            return res
        family = derived.family
    if family is None:
        family = served
    if family is None:
        res.causes.append(Cause("model", f"the server's model_type {model_type!r} is not one vidcache serves "
                                         f"({', '.join(FAMILY_OF_MODEL_TYPE)}); pass --processor DIR (the "
                                         "checkpoint) to derive its family from its processor and vision config"))
        return res
    if family not in FAMILIES:
        raise ValueError(unknown_family(family))
    if served is not None and served != family:
        res.causes.append(Cause("model", f"the server runs {model_type} ({model.get('architectures')}), "
                                         f"not {family}"))
    res.family = family
    res.mode = mode = default_mode(family) if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")

    # --- mm_process_config
    want = mm_process_config(version, family)
    got = info.get("mm_process_config")
    if got != want:
        res.causes.append(Cause("config", f"mm_process_config differs: the server has "
                                          f"{json.dumps(got, sort_keys=True)}, `vidcache sglang-config --mode {mode} --sglang-version {version}` "
                                          f"gives {json.dumps(want, sort_keys=True)}"))
    else:
        res.passed.append("mm_process_config matches")

    # --- stock mode on a GPU: the decoder nothing over HTTP reports
    device = info.get("device")
    if mode == "stock" and device not in ("cpu",):
        if server_torchcodec == STOCK_GPU_TORCHCODEC:
            res.passed.append(f"torchcodec {server_torchcodec} stated for the {device} server")
        else:
            res.causes.append(Cause("torchcodec", f"stock mode on a {device or 'GPU'} server decodes frozen frames "
                                                  f"exactly only with torchcodec=={STOCK_GPU_TORCHCODEC} (SGLang "
                                                  "0.5.23's pin 0.17.0 decodes them on CUDA with errors up to 2), "
                                                  "and no endpoint reports it: install it on the server and pass "
                                                  f"{flags['server_torchcodec']} {STOCK_GPU_TORCHCODEC}, or use "
                                                  f"{flags['mode']} plugin (which does not decode)"))

    # --- the canary
    if processor is None and (processor := server_processor_dir(res, model.get("tokenizer_path"),
                                                                "the server's processor")) is None:
        return res
    if isinstance(processor, (str, os.PathLike)):
        processor = load_processor(str(processor))
    facts = _canary(res, url, processor, family, mode, cache, timeout, info, token_layout, trainer_positions)
    _vision(res, family, mode, info, facts, server_vision, flags)
    return res


def _not_sglang(url: str, status: int, timeout: float) -> str:
    """Why ``url`` is not answering as an SGLang server does, and what to do: a vLLM (OpenAI) server is asked for
    ``/v1/models``; anything else is named by its status."""
    try:
        st, models = http_json(url + "/v1/models", timeout=min(timeout, 30.0))
        vllm = st == 200 and isinstance(models.get("data"), list)
    except (OSError, ValueError):
        vllm = False
    if vllm:
        return (f"{url} answers /v1/models but not SGLang's /server_info (HTTP {status}): it looks like a vLLM "
                "(OpenAI-compatible) server: run check-server with --engine vllm")
    return (f"{url}/server_info answered HTTP {status} without an SGLang version: not an SGLang server (or a proxy "
            "that does not forward /server_info); check the URL and port, or pass --engine vllm for a vLLM server")


def _vision(res: ServerCheck, family: str, mode: str, info: dict, facts: dict | None,
            stated: str | None, flags: dict) -> None:
    """Does the server compute the trainer's vision tower?  The trainer runs transformers' (per temporal patch);
    SGLang's own code for ``VISION_ACROSS_FRAMES`` families attends across frames unless the server runs
    transformers' code (``model_impl`` in /server_info) or vidcache's model package (reported by the plugin in
    plugin mode, stated with ``server_vision`` in stock mode)."""
    if mode == "plugin" and facts is None and res.causes:
        return          # the canary failed before the plugin could report: that failure is the one to fix first
    version = str(info.get("version"))
    impl = info.get("model_impl")
    if facts is not None:
        package = facts.get("model_package")
        how = f"the plugin reports {MODEL_PACKAGE_ENV}={package or '(unset)'}"
    elif stated == "package":
        package, how = MODEL_PACKAGE, f"stated: {flags['server_vision']}"
    else:
        package, how = None, ("stock mode: nothing reports a model package" if mode == "stock"
                              else "the plugin did not report its model package (an older vidcache there?)")
    got = server_vision(family, impl, package)
    if got == TRAINER_VISION:
        what = ("transformers' model code (--model-impl transformers)" if str(impl).lower() == "transformers"
                else f"vidcache's model package ({how})" if package == MODEL_PACKAGE and vision_differs(family)
                else f"SGLang's own {family} code, which attends as the model does")
        res.passed.append(f"vision tower attends per temporal patch, as the trainer's: {what}")
        return
    verified = VISION_ACROSS_FRAMES[family]
    seen = "" if version in verified else f" (read in SGLang {', '.join(verified)}; {version} is unverified)"
    fix = (f"start the servers with {MODEL_PACKAGE_ENV}={MODEL_PACKAGE} (vidcache sglang-config --mode {mode} "
           "prints it)" if mode == "plugin" else
           "add --model-impl transformers to the server's flags (vidcache sglang-config --mode stock prints it), or "
           f"run vidcache's model package ({MODEL_PACKAGE_ENV}={MODEL_PACKAGE}) and pass {flags['server_vision']}")
    res.causes.append(Cause("vision", f"SGLang {version}'s own {family} vision tower attends across each video's "
                                      f"frames{seen}; the model and the trainer (transformers) attend within each "
                                      f"temporal patch: with identical inputs and positions the rollout's "
                                      f"logprobs are 1.6-2.6 nats/token from the trainer's on multi-patch videos "
                                      f"(model_impl {impl!r}; {how}). Fix: {fix}"))


def _transformers_here() -> str:
    import transformers
    return transformers.__version__


def layout_sides(processor, family: str, mode: str, info: dict, token_layout: str | None = None) -> dict:
    """Both sides of the token-layout handshake: the layout the trainer's ids are in, what this node's
    transformers expands in (probed), and the server's transformers and its layout as far as they can be
    known (``token_layout.server_transformers``: reported, or implied by its SGLang release's pin)."""
    server_tf, how = server_transformers(info)
    return {"request": request_layout(processor, family, mode, token_layout),
            "trainer": layout_of(processor, family), "trainer_transformers": _transformers_here(),
            "server": implied_layout(family, server_tf), "server_transformers": server_tf, "server_how": how}


def _layout_cause(sides: dict, family: str, mode: str, expected: list[int], got: list[int]) -> Cause | None:
    diff = layout_difference(expected, got)
    if diff is None:
        return None
    req = sides["request"]
    other = next(x for x in FAMILIES[family].layouts if x != req)
    extra = "the trainer's" if len(expected) > len(got) else "the server's"
    server = (f"the server's transformers {sides['server_transformers']} ({sides['server_how']}) expands in "
              f"'{other}'" if sides["server_transformers"] else f"the server expands in '{other}' (its transformers "
                                                                   "is not reported)")
    fix = (f"run the trainer with token_layout='{other}' (--token-layout {other}, ${ENV_LAYOUT}={family}:{other}) to "
           "follow the server, match the two transformers releases, or use --mode plugin (it expands in the "
           "request's layout)" if mode == "stock" else
           "the server's vidcache plugin did not expand in the request's layout (an older vidcache there?): "
           "upgrade vidcache on the server")
    return Cause("layout", f"token layout differs: the trainer sends '{req}' (transformers "
                           f"{sides['trainer_transformers']} here expands in '{sides['trainer']}'), {server}; {extra} ids "
                           f"carry the extra <|vision_start|>...<|vision_end|> pair ({len(expected)} vs {len(got)} "
                           f"canary ids). Fix: {fix}")


def _layout_passed(sides: dict, family: str, mode: str) -> str:
    line = f"token layout '{sides['request']}'"
    if len(FAMILIES[family].layouts) < 2:
        return line
    line += f" (trainer's transformers {sides['trainer_transformers']} expands in '{sides['trainer']}'"
    if sides["server_transformers"]:
        line += f"; the server's {sides['server_transformers']}, {sides['server_how']}, in '{sides['server']}'"
    if mode == "plugin" and sides["server"] not in (None, sides["request"]):
        line += "; the plugin expands in the request's"
    return line + ")"


def _send(url: str, prep, timeout: float) -> tuple[int, dict]:
    payload = {"input_ids": list(prep.compact_ids), "video_data": list(prep.video_data),
               "sampling_params": {"max_new_tokens": 0, "temperature": 0}, "return_prompt_token_ids": True}
    return http_json(url + "/generate", payload, timeout)


def _canary(res: ServerCheck, url: str, processor, family: str, mode: str, cache, timeout: float,
            info: dict, token_layout: str | None, trainer_positions: bool = True) -> dict | None:
    """The canary requests; returns what the plugin reported of the server (``parse_server_facts``), if any."""
    h = canary_handle(family, mode, cache, str(info.get("version")))
    sides = layout_sides(processor, family, mode, info, token_layout)
    res.token_layout = sides["request"]
    warn = unverified_warning(family, sides["trainer_transformers"])
    if warn:
        res.warnings.append(warn)
    if trainer_positions and (warn := position_warning(family, "sglang")) is not None:
        res.warnings.append(warn)          # the trainer's own rule, not the server's: a warning, never a failure
    prep = prepare(processor, CANARY_PROMPT, [h], mode=mode, attest="values", token_layout=sides["request"])
    status, body = _send(url, prep, timeout)
    if status != 200:
        msg = error_message(body)
        if ATTESTATION_MARK in msg:
            res.causes.append(Cause("attestation", msg))
        elif "vnd.vidcache.ref" in msg and "cannot load vidcache reference" not in msg:
            res.causes.append(Cause("plugin", "the vidcache plugin is not loaded: SGLang could not decode the "
                                              "canary's reference (start the server with the env of `vidcache "
                                              f"sglang-config --mode plugin`). SGLang said: {msg[:300]}"))
        elif "cannot load vidcache reference" in msg:
            res.causes.append(Cause("plugin", f"the plugin could not load the canary: {msg[:500]}"))
        else:
            hint = ""
            if prep.video_data[0].startswith("file://") and prep.video_data[0][:40] in msg:
                # The server could not open a file by the path this node sent: most often its node mounts the
                # shared tier elsewhere.  (msg is cut at 500 characters; the URI's start is enough to tell.)
                hint = (f" (if the SGLang nodes mount the shared tier at another path, set ${ENV_SERVER_PATH} to "
                        "theirs here)")
            res.causes.append(Cause("server", f"the canary request failed with HTTP {status}: {msg[:500]}{hint}"))
        return None
    try:
        check_prompt_ids(prep.expanded_ids, body)
        res.passed.append(f"canary ids match ({len(prep.expanded_ids)} tokens)")
        res.passed.append(_layout_passed(sides, family, mode))
    except ParityError as e:
        got = body.get("prompt_token_ids") or []
        got = got[0] if got and isinstance(got[0], list) else got
        res.causes.append(_layout_cause(sides, family, mode, prep.expanded_ids, list(got))
                          or Cause("ids", f"the canary's expanded ids differ: {e}"))
    if mode != "plugin" or res.causes:
        return None
    res.passed.append("canary attested (pixels, grid, second_per_grid_ts)")
    # The plugin must refuse a wrong attestation, or a 200 proves nothing about the pixels.
    rec = parse_ref(prep.video_data[0])          # the reference this check built: the one parser, never by hand
    rec["attest"]["pixel_values_videos"] = "0" * 32
    rec["attest"].pop("values", None)
    prep.video_data = [ref_uri(rec["tier"], rec["key"], rec["attest"], rec.get("layout"))]
    status, body = _send(url, prep, timeout)
    msg = error_message(body)
    if status == 200 or ATTESTATION_MARK not in msg:
        res.causes.append(Cause("plugin", "the server accepted a canary with a wrong attestation: its vidcache "
                                          "plugin does not check attestations (an older vidcache on the server?)"))
        return None
    res.passed.append("a wrong attestation is refused")
    return parse_server_facts(msg)
