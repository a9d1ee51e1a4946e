"""The trainer's M-RoPE position ids, by the rule of the engine that made the rollout.

``rope_positions(processor, input_ids, handles, engine=...)`` is the one call: pass its result to the model as
``position_ids`` (``pos[:, None, :]`` for transformers' ``[3, batch, seq]``), so the trainer puts every token
where the rollout engine put it.  transformers' own Qwen2-VL / Qwen2.5-VL models would otherwise resume the
text after a long video at another position than SGLang and vLLM do (``vidcache.mrope`` says where and why),
and score the same response 1.5-4.8 nats/token apart with identical inputs.

The grids come from the same tensors the trainer is given (``train_inputs``, memoised, so the trainer's own
call costs nothing more), so the positions and the pixels cannot disagree.
"""
from __future__ import annotations

import torch

from . import mrope
from .errors import ConfigError
from .families import FAMILIES, MODEL_TYPES
from .handle import train_inputs

# Qwen2.5-VL's vision_config.tokens_per_second in every published checkpoint (3B/7B/32B/72B config.json; the
# tiny test models too).  transformers' config class defaults to another value (4), so a processor alone cannot
# tell it: pass ``config`` (the model's config) or ``tokens_per_second`` when a checkpoint sets its own.
PUBLISHED_TOKENS_PER_SECOND = 2


def tokens_per_second_of(config) -> float | None:
    """``vision_config.tokens_per_second`` of a model config (an object or a ``config.json`` dict), or None."""
    if config is None:
        return None
    vision = config.get("vision_config") if isinstance(config, dict) else getattr(config, "vision_config", None)
    if vision is None:
        return None
    return vision.get("tokens_per_second") if isinstance(vision, dict) else getattr(vision, "tokens_per_second", None)


def token_ids(processor) -> dict[str, int]:
    tok = processor.tokenizer
    return {"image_token_id": tok.convert_tokens_to_ids("<|image_pad|>"),
            "video_token_id": tok.convert_tokens_to_ids("<|video_pad|>")}


def positions_from_tensors(processor, input_ids, tensors: dict, family: str, engine: str = "sglang", *,
                           config=None, tokens_per_second: float | None = None) -> torch.Tensor:
    """``[3, len(input_ids)]`` positions from a sample's model tensors (``video_grid_thw``, Qwen2.5-VL's
    ``second_per_grid_ts``, and ``image_grid_thw`` when it has images), by ``engine``'s rule."""
    merge = int(getattr(getattr(processor, "video_processor", processor), "merge_size", 2) or 2)
    tps = tokens_per_second if tokens_per_second is not None else tokens_per_second_of(config)
    if tps is None and (family in FAMILIES and FAMILIES[family].scaled_time):
        tps = PUBLISHED_TOKENS_PER_SECOND
    spg = tensors.get("second_per_grid_ts")
    try:
        return mrope.positions(input_ids, rule=engine, family=family, merge=merge, tokens_per_second=tps,
                               image_grid_thw=tensors.get("image_grid_thw"),
                               video_grid_thw=tensors.get("video_grid_thw"),
                               second_per_grid_ts=None if spg is None else spg.reshape(-1).cpu(),
                               **token_ids(processor))
    except ValueError as e:
        raise ConfigError(f"M-RoPE positions ({engine}): {e}") from None


def rope_positions(processor, input_ids, handles=None, engine: str = "sglang", *, request=None,
                   mode: str | None = None, config=None, tokens_per_second: float | None = None,
                   image_grid_thw=None) -> torch.Tensor:
    """The ``[3, len(input_ids)]`` int64 M-RoPE position ids of one whole sequence (prompt, response, later turns)
    whose videos are ``handles`` (in order), computed by ``engine``'s rule: ``"sglang"``, ``"vllm"`` or
    ``"transformers"`` (transformers' own ``get_rope_index``, kept for comparison).  Required as ``position_ids`` for
    every Qwen-VL family: transformers' models otherwise compute their own rule, or none.

    The mode and the grids come from what made the rollout, never from a guess:
    ``request``: the ``PreparedRequest`` the rollout was sent with (its mode and its ``train_inputs``' grids; then
    ``handles`` may be left out).  Else ``mode``: the processing mode (``"stock"`` / ``"plugin"``), required for
    Qwen2.5-VL, whose seconds per grid differ by mode (``processing.resolve_mode``; vLLM: plugin).  The rule's
    family is the processor's (its class); handles built for another family are refused.
    ``config`` / ``tokens_per_second``: the checkpoint's ``vision_config.tokens_per_second`` (Qwen2.5-VL; default
    the published checkpoints' 2).  ``image_grid_thw``: the sample's images' grids, when it has images.
    """
    from .processing import check_family, resolve_mode
    from .families import family_of_processor
    mrope._check_rule(engine)
    handles = list(handles or [])
    manifests = [h.manifest for h in handles]
    check_family(processor, manifests)
    family = family_of_processor(processor) or (manifests[0].family if manifests else "qwen2_vl")
    if request is not None:
        if mode is not None and mode != request.mode:
            raise ConfigError(f"mode={mode!r} but the request was prepared in {request.mode!r} mode")
        src = request.train_inputs
        tensors = {k: src[k] for k in ("video_grid_thw", "second_per_grid_ts", "image_grid_thw") if k in src}
    elif handles:
        mode = "plugin" if engine == "vllm" and mode is None else mode     # vLLM gets the source's timeline
        tensors = dict(train_inputs(processor, handles, mode=resolve_mode(family, mode, "rope_positions")))
    else:                                               # text (and images): the mode changes nothing
        tensors = {}
    if image_grid_thw is not None:
        tensors["image_grid_thw"] = torch.as_tensor(image_grid_thw).reshape(-1, 3)
    return positions_from_tensors(processor, input_ids, tensors, family, engine, config=config,
                                  tokens_per_second=tokens_per_second)


def mm_token_type_ids(processor, input_ids) -> torch.Tensor:
    """``[1, len(input_ids)]`` int64: 1 at image pads, 2 at video pads, 0 elsewhere, as the HF Qwen-VL processors
    return with ``return_mm_token_type_ids=True`` (transformers 5.2x's models compute M-RoPE only when given them,
    or ``position_ids``)."""
    ids = list(input_ids.tolist() if torch.is_tensor(input_ids) else input_ids)
    own = getattr(processor, "create_mm_token_type_ids", None)       # the processor's own, where it has one
    if own is not None:
        return torch.tensor(own([ids]), dtype=torch.long)
    ids = torch.tensor([ids])
    t = token_ids(processor)
    out = torch.zeros_like(ids, dtype=torch.long)
    out[ids == t["image_token_id"]] = 1
    out[ids == t["video_token_id"]] = 2
    return out


# --- is the trainer's own rule the engine's? ------------------------------------------------------------
# Canary sequences: text, a video whose temporal extent is longer than its spatial one (24 groups over 10 x 10
# merged patches), text, a second video at half a second per group (transformers 5.12.1 floors it to 0), text.
_CANARY_IDS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
               "vision_end_token_id": 151653}
_CANARY_GRIDS = [[24, 20, 20], [6, 12, 16]]
_CANARY_SECONDS = [1.0, 0.5]
# transformers' classes per model type are its record's (``ModelType.trainer_classes``), and so is its family's rule
# (Qwen3.5 / 3.6 / 3.8 position their videos as Qwen3-VL does: one item per frame group).


def _canary(family: str) -> list[int]:
    vs, ve, vp = (_CANARY_IDS[k] for k in ("vision_start_token_id", "vision_end_token_id", "video_token_id"))
    ids = list(range(1000, 1007))
    for t, h, w in _CANARY_GRIDS:
        per = h * w // 4
        if FAMILIES[family].per_frame:
            for _ in range(t):
                ids += [2000, 2001, vs] + [vp] * per + [ve]
        else:
            ids += [vs] + [vp] * (t * per) + [ve]
        ids += list(range(3000, 3009))
    return ids


def trainer_positions(model_type: str, model=None, tokens_per_second: float = PUBLISHED_TOKENS_PER_SECOND):
    """The canary's positions as the trainer's own model code computes them: ``model``'s ``get_rope_index`` (a
    transformers Qwen-VL model, or its inner ``.model``), else the installed transformers' class for ``family``
    run on a config alone (no weights).  The canary's own token ids and ``tokens_per_second`` are used either way
    (the rule, not the checkpoint, is what is compared).  Returns (positions [3, L], what ran)."""
    import importlib.metadata
    import types
    from functools import partial

    import transformers
    version = importlib.metadata.version("transformers")
    family = MODEL_TYPES[model_type].family
    ids = torch.tensor([_canary(family)])
    mm = torch.zeros_like(ids, dtype=torch.int32)
    mm[ids == _CANARY_IDS["video_token_id"]] = 2
    kw = {"video_grid_thw": torch.tensor(_CANARY_GRIDS)}
    if FAMILIES[family].scaled_time:
        kw["second_per_grid_ts"] = torch.tensor(_CANARY_SECONDS, dtype=torch.float32)
    if model is not None:
        inner = model if hasattr(model, "get_rope_index") else getattr(model, "model", None)
        if inner is None or not hasattr(inner, "get_rope_index"):
            raise ConfigError(f"{type(model).__name__} has no get_rope_index: not a transformers Qwen-VL model")
        cls, cfg_cls = type(inner), type(inner.config)
    else:
        cfg_name, cls_name = MODEL_TYPES[model_type].trainer_classes
        cls, cfg_cls = getattr(transformers, cls_name), getattr(transformers, cfg_name)
    # The class's own methods, run on a stand-in holding only a config: no weights are built.
    me = types.SimpleNamespace(config=_canary_config(cfg_cls, family, tokens_per_second), rope_deltas=None)
    me.get_vision_position_ids = partial(cls.get_vision_position_ids, me)
    fn, what = partial(cls.get_rope_index, me), f"transformers {version} {cls.__name__}"
    pos, _ = fn(ids, mm_token_type_ids=mm, **kw)
    return pos[:, 0, :], what


def _canary_config(cfg_cls, family, tokens_per_second):
    """The model's config with the canary's token ids (the geometry that decides positions is kept)."""
    vision = {"spatial_merge_size": 2}
    if FAMILIES[family].scaled_time:
        vision["tokens_per_second"] = tokens_per_second
    return cfg_cls(vision_config=vision, **_CANARY_IDS)


def trainer_rule_problem(model_type: str, engine: str = "sglang", model=None) -> str | None:
    """None when the trainer's own model code for ``model_type`` (one of ``families.MODEL_TYPES``) puts every
    canary token where ``engine`` does; else what differs, which component computes it, and the fix (pass
    ``vidcache.rope_positions`` as ``position_ids``)."""
    mrope._check_rule(engine)
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"no position check for model type {model_type!r}; known: {', '.join(MODEL_TYPES)}")
    family = MODEL_TYPES[model_type].family
    try:
        theirs, what = trainer_positions(model_type, model)
    except (AttributeError, TypeError, ValueError, ImportError) as e:
        return (f"could not run the trainer's get_rope_index for {model_type} ({type(e).__name__}: {e}): its "
                f"position rule is unverified; pass vidcache.rope_positions(..., engine={engine!r}) as position_ids")
    ids = _canary(family)
    spg = torch.tensor(_CANARY_SECONDS, dtype=torch.float32) if FAMILIES[family].scaled_time else None
    ours = mrope.positions(ids, rule=engine, family=family, merge=2, tokens_per_second=PUBLISHED_TOKENS_PER_SECOND,
                           image_token_id=_CANARY_IDS["image_token_id"], video_token_id=_CANARY_IDS["video_token_id"],
                           video_grid_thw=_CANARY_GRIDS, second_per_grid_ts=spg)
    if torch.equal(ours, theirs):
        return None
    first = int((ours != theirs).any(0).nonzero()[0])
    moved = int((ours != theirs).any(0).sum())
    return (f"{what}.get_rope_index puts {moved} of {len(ids)} canary tokens at other M-RoPE positions than "
            f"{engine} (first at token {first}: {theirs[:, first].tolist()} against {ours[:, first].tolist()}): the "
            f"trainer scores the rollout's tokens at other positions than the engine generated them. Fix: pass "
            f"vidcache.rope_positions(processor, ids, request=req, engine={engine!r}) to the model as position_ids "
            f"(Miles: --custom-megatron-init-path miles_integration.train_hooks.install_train_hooks)")


def position_warning(family: str, engine: str) -> str | None:
    """``check-server``'s warning when this environment's transformers (the trainer's, where the check runs beside
    it) would put tokens elsewhere than ``engine`` does; None when they agree."""
    problem = trainer_rule_problem(family, engine)
    return None if problem is None else f"[positions] {problem}"


# --- a trainer that computes its own positions: give its model class the engine's rule -------------------------
def patchable() -> dict[str, tuple[str, str]]:
    """family -> (module, class) of transformers' models whose get_rope_index differs from the engines'
    (``Family.trainer_rope``; Qwen3-VL's and its successors' do not)."""
    return {name: f.trainer_rope for name, f in FAMILIES.items() if f.trainer_rope is not None}


_NEW_FORM = ("mm_token_type_ids", "image_grid_thw", "video_grid_thw", "second_per_grid_ts", "attention_mask")
_OLD_FORM = _NEW_FORM[1:]


def _rope_index_args(input_ids, args: tuple, kwargs: dict):
    """(image_grid_thw, video_grid_thw, second_per_grid_ts, attention_mask) of a ``get_rope_index`` call in either
    of its forms: transformers >= 5.3's ``(input_ids, mm_token_type_ids, image_grid_thw, ...)``, which
    Megatron-Bridge uses since #3040 (positionally), or the older ``(input_ids, image_grid_thw, video_grid_thw,
    ...)``.  The first positional argument after the ids is token types only if it has the ids' shape (a grid is
    ``[n, 3]``; a caller of the new form always builds the types)."""
    first = args[0] if args else None
    new = not args or (torch.is_tensor(first) and tuple(first.shape) == tuple(input_ids.shape))
    names = _NEW_FORM if new else _OLD_FORM
    if len(args) > len(names):
        raise TypeError(f"get_rope_index takes at most {len(names) + 1} positional arguments, got {len(args) + 1}")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in bound:
            raise TypeError(f"get_rope_index got two values for {k!r}")
        bound[k] = v
    return tuple(bound.get(k) for k in _OLD_FORM)


def engine_get_rope_index(engine: str, family: str):
    """A drop-in for transformers' ``get_rope_index(self, input_ids, mm_token_type_ids, image_grid_thw=None,
    video_grid_thw=None, second_per_grid_ts=None, attention_mask=None)`` that computes ``engine``'s rule: for a
    trainer that computes its positions inside the model (Megatron-Bridge's Qwen2.5-VL binds this very method of
    transformers' class in its ``__init__``, and ignores any ``position_ids`` it is given)."""
    mrope._check_rule(engine)

    def get_rope_index(self, input_ids, *args, **kwargs):
        image_grid_thw, video_grid_thw, second_per_grid_ts, attention_mask = _rope_index_args(input_ids, args, kwargs)
        vision = self.config.vision_config
        merge = int(vision.spatial_merge_size)
        tps = getattr(vision, "tokens_per_second", None)
        image_id, video_id = self.config.image_token_id, self.config.video_token_id
        out = torch.zeros(3, *input_ids.shape, dtype=input_ids.dtype, device=input_ids.device)
        deltas = []
        igrids = list(image_grid_thw.tolist()) if image_grid_thw is not None else []
        vgrids = list(video_grid_thw.tolist()) if video_grid_thw is not None else []
        spg = list(second_per_grid_ts.reshape(-1).cpu()) if second_per_grid_ts is not None else None
        for b in range(input_ids.shape[0]):
            keep = attention_mask[b].bool() if attention_mask is not None else torch.ones_like(input_ids[b]).bool()
            ids = input_ids[b][keep].tolist()
            n_img = len(mrope._runs(ids, image_id))
            n_vid = len(mrope._runs(ids, video_id))
            pos = mrope.positions(ids, rule=engine, family=family, merge=merge, tokens_per_second=tps,
                                  image_token_id=image_id, video_token_id=video_id,
                                  image_grid_thw=igrids[:n_img], video_grid_thw=vgrids[:n_vid],
                                  second_per_grid_ts=None if spg is None else spg[:n_vid])
            igrids, vgrids = igrids[n_img:], vgrids[n_vid:]
            spg = None if spg is None else spg[n_vid:]
            out[:, b, keep] = pos.to(out.device, out.dtype)
            deltas.append(int(pos.max()) + 1 - len(ids) if pos.numel() else 0)
        return out, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)

    get_rope_index._vidcache_rule = engine
    return get_rope_index


def use_engine_positions(engine: str = "sglang") -> list[str]:
    """Give transformers' Qwen2-VL and Qwen2.5-VL model classes ``engine``'s M-RoPE rule (idempotent), for
    trainers whose model computes its own positions.  Call it before the model is built: Megatron-Bridge binds
    the method at construction.  Returns the classes patched."""
    import importlib
    done = []
    for family, (module, name) in patchable().items():
        cls = getattr(importlib.import_module(module), name)
        if getattr(cls.get_rope_index, "_vidcache_rule", None) != engine:
            cls.get_rope_index = engine_get_rope_index(engine, family)
        done.append(f"{module}.{name}")
    return done
