"""Running a checkpoint's frozen vision tower over cached entries, into the embedding tier.

The inputs are exactly the trainer's: ``pixel_values_videos`` and ``video_grid_thw`` from ``train_inputs`` on the
entry's cached frames and the checkpoint's own processor.  The output is what the decoder consumes in place of
them: transformers' ``get_video_features`` (the tower, then the merger), and for Qwen3-VL its deepstack features,
which the decoder adds at its first layers.  Which families take deepstack features is read from the code, not
listed: a language model whose ``forward`` has a ``deepstack_visual_embeds`` parameter consumes them (Qwen3-VL and
its MoE); Qwen2.5-VL and the Qwen3.5 line have none.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from .record import EmbeddingKey, VisionEmbeddings, weights_digest

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..cache import VideoCache
    from .tier import EmbeddingTier


def base_model(model):
    """The module holding ``visual`` and ``language_model`` (transformers' ``<Family>Model``)."""
    for m in (getattr(model, "model", None), model):
        if m is not None and hasattr(m, "visual") and hasattr(m, "get_video_features"):
            return m
    from ..errors import ConfigError
    raise ConfigError(f"{type(model).__name__} has no vision tower (`visual`) and `get_video_features`: "
                      "not a Qwen-VL model of transformers")


def takes_deepstack(model) -> bool:
    """Whether the decoder consumes deepstack features (its language model's ``forward`` takes them)."""
    lm = getattr(base_model(model), "language_model", None)
    return lm is not None and "deepstack_visual_embeds" in inspect.signature(lm.forward).parameters


@dataclass(frozen=True)
class Tower:
    """A loaded model's vision tower and what names its output: computed once (hashing the weights reads them
    all), then ``key(entry)`` per entry.  Make a new one after the tower's weights change."""
    model: object
    weights: str        # weights_digest of the tower's loaded tensors
    dtype: str          # "float32", "bfloat16", ...
    code: str           # "<family>:<module>.<class>@transformers <version>"

    def key(self, entry: str) -> EmbeddingKey:
        return EmbeddingKey(entry, self.weights, self.dtype, self.code)


def tower_of(model) -> Tower:
    """The ``Tower`` of a transformers Qwen-VL model as it is loaded now (its device, dtype and weights)."""
    import transformers

    from ..families import FAMILY_OF_MODEL_TYPE
    visual = base_model(model).visual
    model_type = model.config.model_type
    family = FAMILY_OF_MODEL_TYPE.get(model_type, model_type)
    cls = type(visual)
    code = f"{family}:{cls.__module__}.{cls.__qualname__}@transformers {transformers.__version__}"
    return Tower(model, weights_digest(visual.state_dict()), str(visual.dtype).removeprefix("torch."), code)


def compute(tower: Tower, tensors: dict, entry: str) -> VisionEmbeddings:
    """One entry's embeddings from its trainer tensors (``train_inputs``: one video)."""
    import torch
    base = base_model(tower.model)
    device = next(base.visual.parameters()).device
    grid = torch.as_tensor(tensors["video_grid_thw"]).to(torch.long).reshape(-1, 3)
    if grid.shape[0] != 1:
        from ..errors import ConfigError
        raise ConfigError(f"entry {entry}: {grid.shape[0]} videos in one entry's tensors; one is expected")
    with torch.no_grad():
        out = base.get_video_features(pixel_values_videos=tensors["pixel_values_videos"].to(device),
                                      video_grid_thw=grid.to(device), return_dict=True)
    embeds = torch.cat(tuple(out.pooler_output), dim=0)
    deepstack = ()
    if takes_deepstack(tower.model):
        deepstack = tuple(torch.cat(tuple(f), dim=0) for f in out.deepstack_features)
    return VisionEmbeddings(tower.key(entry), tuple(int(v) for v in grid[0].tolist()), embeds, deepstack)


def entry_tensors(cache: "VideoCache", processor, entry: str) -> dict:
    """The trainer's tensors for one cached entry (``train_inputs``, on the CPU; the mode only changes
    Qwen2.5-VL's ``second_per_grid_ts``, which the tower does not read)."""
    from ..handle import from_key
    return from_key(entry, cache).train_inputs(processor, mode="plugin", memo=False)


@dataclass
class EmbedSummary:
    computed: int = 0
    present: int = 0          # already in this node's tier (resume)
    pulled: int = 0           # read from the shared tier (checked) into this node's
    failed: int = 0
    bytes: int = 0
    failures: list = None

    def line(self) -> str:
        return (f"embed: {self.computed} computed, {self.pulled} pulled from the shared tier, {self.present} already "
                f"on this node, {self.failed} failed; {self.bytes} bytes written")


def embed_entries(tier: "EmbeddingTier", tower: Tower, processor, entries: Iterable[str],
                  progress: bool = False) -> EmbedSummary:
    """Make the embeddings of ``entries`` present on this node: skipped where they are (resume), read from the
    shared tier where it has them (a fresh node: checked, then kept locally), computed and stored otherwise."""
    from .. import keys
    from ..errors import VidcacheError
    s = EmbedSummary(failures=[])
    todo = list(dict.fromkeys(entries))
    local = tier.local.exists_many([keys.emb(tower.key(e).id) for e in todo]) if todo else []
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(todo), desc="embed", unit="video")
    try:
        for entry, here in zip(todo, local):
            try:
                if here:
                    s.present += 1
                elif tier.shared is not None and tier.get(tower.key(entry)) is not None:
                    s.pulled += 1
                else:
                    emb = compute(tower, entry_tensors(tier.cache, processor, entry), entry)
                    s.bytes += tier.put(emb)
                    s.computed += 1
            except VidcacheError as e:
                s.failed += 1
                s.failures.append({"entry": entry, "kind": e.kind, "error": str(e)})
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return s


def load_checkpoint(path: str, dtype: str, device: str):
    """The checkpoint's model (transformers' own class, eval) and processor, with its vision tower on ``device`` in
    ``dtype``.  Only the tower's weights are read (``load_tower``): ``embed`` never runs the decoder, and a 72B
    checkpoint's decoder would not fit where its 0.7B tower does.  Where the tower cannot be loaded alone, the whole
    model is, as ``from_pretrained`` loads it; either way the tower's tensors, and so its ``weights`` digest, are
    the ones a trainer that loads the whole checkpoint gets (tested)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from ..errors import ConfigError
    try:
        torch_dtype = getattr(torch, dtype)
        assert isinstance(torch_dtype, torch.dtype)
    except (AttributeError, AssertionError):
        raise ConfigError(f"--dtype {dtype!r}: not a torch dtype (float32, bfloat16, float16)") from None
    processor = AutoProcessor.from_pretrained(path)
    model, why = load_tower(path, torch_dtype, device)
    if model is None:
        log.info("embed: loading the whole checkpoint (%s)", why)
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa")
        model = model.to(device).eval()
    return model, processor


# The tower's tensors in a checkpoint: ``model.visual.*`` (transformers 5's layout), or ``visual.*`` (the layout the
# Qwen2-VL / Qwen2.5-VL hub checkpoints were published in, which transformers renames on load).
_TOWER_PREFIXES = ("model.visual.", "visual.")


def load_tower(path: str, torch_dtype, device: str):
    """``(model, None)``: the checkpoint's model class built on the meta device (no memory, never run) with a real
    vision tower, whose every parameter and persistent buffer is read from the checkpoint's safetensors (strict:
    no tensor missing, none left over, every shape equal) and cast to ``torch_dtype`` as ``from_pretrained``
    casts.  ``(None, why)`` where that is not possible (a single-file or sharded safetensors checkpoint is
    required; quantized or renamed towers do not load strictly): the caller loads the whole model."""
    import json
    import os

    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForImageTextToText

    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
    elif os.path.isfile(single):
        with safe_open(single, "pt") as f:
            weight_map = {k: "model.safetensors" for k in f.keys()}
    else:
        return None, "no model.safetensors or model.safetensors.index.json in the checkpoint directory"
    config = AutoConfig.from_pretrained(path)
    cls = AutoModelForImageTextToText._model_mapping.get(type(config), None)
    if cls is None:
        return None, f"no image-text-to-text class for {type(config).__name__}"
    with torch.device("meta"):
        model = cls._from_config(config, dtype=torch_dtype, attn_implementation="sdpa")
    base = base_model(model)
    tower_cls = type(base.visual)
    with torch.device(device):
        tower = tower_cls._from_config(config.vision_config, dtype=torch_dtype, attn_implementation="sdpa")
    want = tower.state_dict()
    prefix = next((p for p in _TOWER_PREFIXES if any(k.startswith(p) for k in weight_map)), None)
    if prefix is None:
        return None, "no model.visual.* or visual.* tensors in the checkpoint"
    names = {k[len(prefix):]: (k, weight_map[k]) for k in weight_map if k.startswith(prefix)}
    if set(names) != set(want):
        missing, extra = sorted(set(want) - set(names)), sorted(set(names) - set(want))
        return None, (f"the checkpoint's tower tensors differ from the class's (missing {missing[:3]}, "
                      f"extra {extra[:3]})")
    by_file: dict[str, list[str]] = {}
    for name, (_, file) in names.items():
        by_file.setdefault(file, []).append(name)
    loaded = {}
    for file, group in by_file.items():
        with safe_open(os.path.join(path, file), "pt") as f:
            for name in group:
                t = f.get_tensor(names[name][0])
                if t.shape != want[name].shape:
                    return None, (f"{names[name][0]}: shape {tuple(t.shape)} in the checkpoint, "
                                  f"{tuple(want[name].shape)} in the class")
                loaded[name] = t.to(want[name].dtype) if t.is_floating_point() else t
    tower.load_state_dict(loaded, strict=True)
    base.visual = tower.eval()
    return model.eval(), None


def default_device() -> str:
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"
