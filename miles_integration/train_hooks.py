"""``--vidcache-train-inputs handles``: handles travel to the trainer, tensors are rebuilt there.

Rollout side (generate.py): ``sample.multimodal_train_inputs = {HANDLE_KEY: encode_handles(...)}``, a small
uint8 tensor holding the handles' JSON.  It is a tensor, so Miles' conversion, object-store codec and
``get_rollout_data``'s ``.to(cuda)`` carry it untouched, and the ``n_samples_per_prompt`` copies of a group cost a
few hundred bytes each instead of the clip's pixels.

Train side: ``install_train_hooks(args)`` (``--custom-megatron-init-path
miles_integration.train_hooks.install_train_hooks``) wraps ``get_batch`` so that each micro-batch's
``multimodal_train_inputs`` entries are rebuilt from the cache (``vidcache.train_inputs_batch``: the same
tensors the rollout side's ``train_inputs`` would have made) just before ``get_batch`` concatenates them, on the
actor's current CUDA device when it has one (HF's processor runs there, bit-identical to the CPU).  ``get_batch`` is imported *by name* by
``miles.backends.megatron_utils.model`` (and ``fsdp_utils.actor``), so the hook replaces the name in each importing
module, not only in ``training_utils.data``.  Everything above ``install_train_hooks`` is pure (no Miles import).
"""
from __future__ import annotations

import functools
import importlib
import json
import logging
import sys

import torch

import vidcache
from vidcache import VideoHandle
from vidcache.positions import use_engine_positions

logger = logging.getLogger(__name__)

HANDLE_KEY = "vidcache_handles"
# Modules that hold ``get_batch`` as a global; the defining module first.
GET_BATCH_MODULES = (
    "miles.backends.training_utils.data",
    "miles.backends.megatron_utils.model",
    "miles.backends.fsdp_utils.actor",
)
# Modules that hold ``get_data_iterator`` as a global; the defining module first.
GET_DATA_ITERATOR_MODULES = (
    "miles.backends.training_utils.data",
    "miles.backends.megatron_utils.actor",
    "miles.backends.fsdp_utils.actor",
)
# Modules that hold the train side's ``log_rollout_data`` (not miles.ray.rollout.metrics' one of the same name).
LOG_ROLLOUT_DATA_MODULES = (
    "miles.backends.training_utils.log_utils",
    "miles.backends.megatron_utils.actor",
    "miles.backends.fsdp_utils.actor",
)


# --- encoding (rollout side) --------------------------------------------------------------------
def encode_handles(handles, mode: str) -> torch.Tensor:
    """Handles (objects or ``to_dict()`` dicts) and the processing mode as a 1-D uint8 tensor of JSON."""
    videos = [h.to_dict() if isinstance(h, VideoHandle) else dict(h) for h in handles]
    raw = json.dumps({"v": 1, "mode": mode, "videos": videos}, sort_keys=True, separators=(",", ":")).encode()
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()


def decode_handles(t: torch.Tensor) -> tuple[str, list[VideoHandle]]:
    rec = json.loads(bytes(t.detach().to("cpu", torch.uint8).numpy().tobytes()).decode())
    if rec.get("v") != 1:
        raise ValueError(f"unknown vidcache handle encoding {rec.get('v')!r}")
    return rec["mode"], [VideoHandle.from_dict(d) for d in rec["videos"]]


def handle_train_inputs(handles, mode: str) -> dict[str, torch.Tensor]:
    return {HANDLE_KEY: encode_handles(handles, mode)}


# --- rebuilding (train side) ----------------------------------------------------------------------
def train_device() -> torch.device | None:
    """The actor's current CUDA device, when it has one: the handles are hydrated there (None: the CPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None


def hydrate_all(mms: list, processor, device: torch.device | None = None) -> list:
    """Each micro-batch entry with its handle entry replaced by the model tensors it names; others pass
    through.  All handles of the micro-batch are hydrated in one ``vidcache.train_inputs_batch`` call
    per mode, on ``device`` (default: ``train_device()``), and the tensors end on the handle tensor's
    device (where Miles put the sample)."""
    device = train_device() if device is None else device
    todo: dict[str, list[tuple[int, list[VideoHandle]]]] = {}
    for i, mm in enumerate(mms):
        if mm and HANDLE_KEY in mm:
            mode, handles = decode_handles(mm[HANDLE_KEY])
            todo.setdefault(mode, []).append((i, handles))
    out = list(mms)
    for mode, items in todo.items():
        tensors = vidcache.train_inputs_batch(processor, [hs for _, hs in items], mode=mode, device=device)
        for (i, _), ti in zip(items, tensors):
            enc = mms[i][HANDLE_KEY]
            rest = {k: v for k, v in mms[i].items() if k != HANDLE_KEY}
            out[i] = {**rest, **{k: v.to(enc.device) for k, v in ti.items()}}
    return out


def hydrate(mm: dict | None, processor, device: torch.device | None = None) -> dict | None:
    """One entry's ``hydrate_all``."""
    return hydrate_all([mm], processor, device)[0]


# --- read-ahead over a step's micro-batches (train side) ------------------------------------------------------
_STEP: dict = {}        # this process's step: "data" (the id of its rollout data) and its "ahead" (a ReadAhead)


def _handle_groups(data_iterator):
    """The step's handles, one list per sample, in the order its micro-batches take the samples."""
    mms = data_iterator.rollout_data.get("multimodal_train_inputs") or []
    batches = getattr(data_iterator, "micro_batch_indices", None)
    order = [i for b in batches for i in b] if batches else range(len(mms))
    for i in order:
        if mms[i] and HANDLE_KEY in mms[i]:
            yield decode_handles(mms[i][HANDLE_KEY])[1]


def read_ahead_step(data_iterator) -> None:
    """When a step's rollout data is new in this process, pull its later micro-batches' entries into this node's
    local tier while the earlier ones train (``vidcache.read_ahead``; the previous step's read-ahead is closed)."""
    data = getattr(data_iterator, "rollout_data", None)
    if data is None or _STEP.get("data") == id(data):
        return
    if (old := _STEP.pop("ahead", None)) is not None:
        old.close()
    _STEP.update(data=id(data), ahead=vidcache.read_ahead(_handle_groups(data_iterator)))


def wrap_get_data_iterator(get_data_iterator):
    """A ``get_data_iterator`` that starts the step's read-ahead as soon as the step's iterators exist.  Miles'
    actor builds them, then swaps the reference model's weights in (``_switch_model("ref")``, a copy of the whole
    model from host memory) before the first forward asks ``get_batch`` for a micro-batch: the pulls run during
    that swap instead of after it.  ``get_batch``'s own ``read_ahead_step`` then finds the step already started."""
    if getattr(get_data_iterator, "_vidcache_wrapped", False):
        return get_data_iterator

    @functools.wraps(get_data_iterator)
    def vidcache_get_data_iterator(*args, **kwargs):
        iterators, num_microbatches = get_data_iterator(*args, **kwargs)
        mms = (iterators[0].rollout_data.get("multimodal_train_inputs") or []) if iterators else []
        if _passed(mms):
            read_ahead_step(iterators[0])
        return iterators, num_microbatches

    vidcache_get_data_iterator._vidcache_wrapped = True
    vidcache_get_data_iterator.__wrapped__ = get_data_iterator
    return vidcache_get_data_iterator


def _passed(mms) -> int:
    return sum(1 for mm in mms if mm and HANDLE_KEY in mm)


class HydratingIterator:
    """Wraps Miles' ``DataIterator``: ``get_next`` returns micro-batches with handle entries rebuilt (the step's
    later entries read ahead, ``read_ahead_step``).  With ``engine``, it also computes each sample's M-RoPE
    positions by that engine's rule (``positions``, one ``[3, L]`` tensor or None per sample of the last
    micro-batch), for ``get_batch``'s ``position_ids`` (``packed_positions``)."""

    def __init__(self, inner, processor, engine: str | None = None):
        self._inner, self._processor, self._engine = inner, processor, engine
        self.positions: list | None = None

    def get_next(self, keys):
        read_ahead_step(self._inner)
        batch = self._inner.get_next(keys)
        mm = batch.get("multimodal_train_inputs")
        if mm is not None:
            if (ahead := _STEP.get("ahead")) is not None:
                ahead.advance(_passed(mm))       # these are read now, by hydrate_all
            batch["multimodal_train_inputs"] = hydrate_all(list(mm), self._processor)
        self.positions = None
        if self._engine is not None and mm is not None and batch.get("tokens") is not None:
            self.positions = [sample_positions(self._processor, t, m, self._engine)
                              for t, m in zip(batch["tokens"], batch["multimodal_train_inputs"])]
        return batch

    def __getattr__(self, name):          # rollout_data, offset, reset(), ...
        return getattr(self._inner, name)


def positions_family(processor, tensors: dict) -> str | None:
    """The family whose M-RoPE rule the trainer's transformers gets wrong (``Family.trainer_rope``), from what
    decides it: the processor's class where it names a family, else its patch size and whether the sample carries
    ``second_per_grid_ts`` (a scaled-time rule); None otherwise (Qwen3-VL and its successors: transformers'
    positions are the engines')."""
    from vidcache.families import FAMILIES, family_of_processor
    named = family_of_processor(processor)
    if named is not None:
        return named if FAMILIES[named].trainer_rope is not None else None
    patch = getattr(getattr(processor, "video_processor", processor), "patch_size", None)
    scaled = "second_per_grid_ts" in tensors
    fits = [f.name for f in FAMILIES.values()
            if f.trainer_rope is not None and f.patch == patch and f.scaled_time == scaled]
    return fits[0] if len(fits) == 1 else None


def sample_positions(processor, tokens, tensors: dict | None, engine: str):
    """One sample's ``[3, len(tokens)]`` positions by ``engine``'s rule, or None where transformers' own agree."""
    if not tensors or not any(k in tensors for k in ("video_grid_thw", "image_grid_thw")):
        return None
    family = positions_family(processor, tensors)
    if family is None:
        return None
    from vidcache.positions import positions_from_tensors
    return positions_from_tensors(processor, torch.as_tensor(tokens).tolist(), tensors, family, engine)


def packed_positions(batch: dict, per_sample: list, qkv_format: str, slice_with_cp) -> torch.Tensor:
    """``[4, B, T]`` position ids for transformers' Qwen-VL models: row 0 is ``get_batch``'s own ``position_ids``
    (the per-sample text positions transformers reads packing from), rows 1-3 each sample's M-RoPE positions (a
    text-only sample: its text positions) laid out as ``get_batch`` lays out the tokens: Miles' own
    ``slice_with_cp`` per sample, then concatenated and padded (``thd``) or stacked (``bshd``)."""
    import torch.nn.functional as F
    text = batch["position_ids"]
    rows = []
    for toks, p in zip(batch["unconcat_tokens"], per_sample):
        n = toks.size(0)
        p = torch.arange(n).expand(3, -1) if p is None else p
        rows.append(p.T.contiguous().to(text.device))           # [L, 3]: slice_with_cp works on dim 0
    if qkv_format == "thd":
        m = torch.cat([slice_with_cp(r, 0, "thd") for r in rows])
        m = F.pad(m, (0, 0, 0, text.shape[-1] - m.shape[0])).T.unsqueeze(1)
    elif qkv_format == "bshd":
        m = torch.stack([slice_with_cp(r, 0, "bshd", batch["max_seq_lens"][0]) for r in rows]).permute(2, 0, 1)
    else:
        raise ValueError(f"unsupported qkv_format {qkv_format!r}")
    return torch.cat([text.unsqueeze(0), m.to(text.dtype)])


def wrap_get_batch(get_batch, processor_factory, engine: str | None = None):
    """A ``get_batch`` that rebuilds handle entries per micro-batch before calling the original, and, with
    ``engine``, replaces the ``position_ids`` it returns (Miles' FSDP path: a plain ``arange`` per sample, which
    transformers copies onto all three M-RoPE axes) with the engine's M-RoPE positions (``packed_positions``)."""
    if getattr(get_batch, "_vidcache_wrapped", False):
        return get_batch
    import inspect
    signature = inspect.signature(get_batch)

    @functools.wraps(get_batch)
    def vidcache_get_batch(data_iterator, keys, *args, **kwargs):
        it = data_iterator
        if "multimodal_train_inputs" in keys:
            it = HydratingIterator(data_iterator, processor_factory(), engine)
        batch = get_batch(it, keys, *args, **kwargs)
        positions = getattr(it, "positions", None) if it is not data_iterator else None
        if positions and any(p is not None for p in positions) and batch.get("position_ids") is not None:
            bound = signature.bind(data_iterator, keys, *args, **kwargs)
            bound.apply_defaults()
            slicer = getattr(sys.modules[get_batch.__module__], "slice_with_cp")
            batch["position_ids"] = packed_positions(batch, positions, bound.arguments["qkv_format"], slicer)
        return batch

    vidcache_get_batch._vidcache_wrapped = True
    vidcache_get_batch.__wrapped__ = get_batch
    return vidcache_get_batch


def patch_by_name(attr: str, modules, wrap) -> list[str]:
    """Point ``attr`` in each of ``modules`` at ``wrap(original)`` (idempotent: the wrappers mark themselves).
    Returns the modules patched.

    ``from ..training_utils.data import get_batch`` copies the function into the importing module's globals,
    so every importer already loaded is patched by name (patching only the defining module would not reach
    Megatron's forward).  The defining module (``modules[0]``) is imported and patched too, so an importer
    loaded later picks up the wrapper; the other modules are never imported here.
    """
    patched = []
    for i, name in enumerate(modules):
        mod = sys.modules.get(name)
        if mod is None and i == 0:
            try:
                mod = importlib.import_module(name)
            except ImportError as e:
                logger.debug("vidcache: %s not importable (%s); not patched", name, e)
                continue
        if mod is None or not hasattr(mod, attr):
            continue
        setattr(mod, attr, wrap(getattr(mod, attr)))
        patched.append(name)
    return patched


def patch_get_batch(processor_factory, modules=GET_BATCH_MODULES, engine: str | None = None) -> list[str]:
    """Point ``get_batch`` in each of ``modules`` at a hydrating wrapper (``patch_by_name``)."""
    return patch_by_name("get_batch", modules, lambda f: wrap_get_batch(f, processor_factory, engine))


def patch_log_rollout_data(token_ids_factory, every: int, modules=LOG_ROLLOUT_DATA_MODULES) -> list[str]:
    """``--vidcache-logprob-monitor N``: Miles' train-side ``log_rollout_data`` logs the per-modality split of the
    rollout-vs-train logprob difference every N rollouts first (``logprob_monitor``)."""
    from .logprob_monitor import wrap_log_rollout_data
    return patch_by_name("log_rollout_data", modules, lambda f: wrap_log_rollout_data(f, token_ids_factory, every))


@functools.lru_cache(maxsize=4)
def checkpoint_token_ids(checkpoint: str) -> tuple[int, int]:
    """(video token id, image token id) of the checkpoint's processor (Miles' own ``load_processor``)."""
    from miles.utils.processing_utils import load_processor

    from vidcache.positions import token_ids
    ids = token_ids(load_processor(checkpoint, trust_remote_code=True))
    return ids["video_token_id"], ids["image_token_id"]


def install_train_hooks(args) -> list[str]:
    """``--custom-megatron-init-path miles_integration.train_hooks.install_train_hooks`` (called as ``f(args)``).

    First, whatever the train inputs: the trainer's Qwen2-VL / Qwen2.5-VL model is given the rollout engine's
    M-RoPE rule (``--vidcache-positions``, default SGLang's; ``vidcache.positions.use_engine_positions``).
    Miles' Megatron path passes ``position_ids=None`` and Megatron-Bridge's ``Qwen25VLModel`` always computes its
    positions with transformers' ``Qwen2_5_VLModel.get_rope_index``, bound when the model is built (after this
    hook runs), whose rule resumes the text after a long video elsewhere than SGLang (docs/miles.md, "Positions").

    With ``--vidcache-logprob-monitor N``, Miles' ``log_rollout_data`` logs every Nth rollout's rollout-vs-train
    logprob difference split by modality (``logprob_monitor``; the returned list names the modules patched).

    Then, unless ``--vidcache-train-inputs handles``, nothing more.  With handles, ``get_batch`` is wrapped: it
    rebuilds the tensors, and where Miles' FSDP path asks for ``position_ids`` (a plain ``arange`` per sample,
    which transformers copies onto all three M-RoPE axes) it gets the engine's positions instead
    (``packed_positions``; Qwen2-VL / Qwen2.5-VL samples).  The processor is loaded from
    ``--hf-checkpoint`` on first use, once per actor.  The handles arrive pinned (with their keys) and name the
    shared tier, so the train node needs only its cache configuration, never the source videos.
    """
    rule = getattr(args, "vidcache_positions", "sglang")
    patched_rules = [] if rule == "transformers" else use_engine_positions(rule)
    if patched_rules:
        logger.info("vidcache: %s compute %s's M-RoPE positions", patched_rules, rule)
    if every := int(getattr(args, "vidcache_logprob_monitor", 0) or 0):
        patched_rules += patch_log_rollout_data(functools.partial(checkpoint_token_ids, args.hf_checkpoint), every)
    if getattr(args, "vidcache_train_inputs", "tensors") != "handles":
        return patched_rules
    from .args import VidcacheConfig

    # The node's cache (--vidcache-cache / --vidcache-shared, else $VIDCACHE_DIR / $VIDCACHE_SHARED), opened
    # now: a misconfigured node fails at init, and handles naming this cache resolve to it.
    cache = VidcacheConfig.from_args(args).open_cache()

    @functools.lru_cache(maxsize=1)
    def processor():
        from miles.utils.processing_utils import load_processor
        p = load_processor(args.hf_checkpoint, trust_remote_code=True)
        if p is None:
            raise RuntimeError(f"--vidcache-train-inputs handles needs a processor in --hf-checkpoint {args.hf_checkpoint}")
        return p

    patched = patch_get_batch(processor, engine=None if rule == "transformers" else rule)
    patched += patch_by_name("get_data_iterator", GET_DATA_ITERATOR_MODULES, wrap_get_data_iterator)
    logger.info("vidcache: train-side tensor rebuild from %r installed in %s", cache, patched)
    return patched_rules + patched
