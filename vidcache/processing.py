"""Trainer-side tensors from cached frames and their manifests (the SGLang side is ``vidcache.sglang``).

This module knows nothing of handles: it is given uint8 frames (on the CPU or already on the trainer's
device) and manifests, and calls HF's own processor on them with sampling and resizing off (both were
done once, when the entry was built).  Handles read their frames and call down into it
(``vidcache.handle.train_inputs``), so nothing here calls back up.

Two temporal modes (see docs/sglang.md, "Stock SGLang vs the plugin"):
  ``plugin``  the original video's metadata (what qwen-vl-utils reports): the
              correct Qwen2.5-VL ``second_per_grid_ts`` and Qwen3-VL timestamps.
  ``stock``   what SGLang 0.5.23 computes from a frozen file as shipped: no
              metadata for Qwen2/2.5 (so 2/24 s per grid for Qwen2.5-VL) and
              the frozen file's own timeline for Qwen3-VL.
"""
from __future__ import annotations

import math
import threading
import weakref
from collections import OrderedDict

import torch
import xxhash

# Serving facts: in stock mode Qwen3-VL's timestamps come from the frozen file's FROZEN_FPS timeline; the modes
# (plugin: the source's timeline, stock: the frozen file's) are SGLang's names for the two.
from .errors import TokenLayoutError
from .families import FAMILIES
from .serving import FROZEN_FPS
from .sglang_facts import MODES
from .token_layout import check_layout, convert, env_layout, layouts

VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"


def video_metadata(manifest, mode: str) -> dict | None:
    """The ``video_metadata`` the HF processor gets for an entry in ``mode`` (None: none is passed)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "plugin":       # the original video's timeline, as qwen-vl-utils reports it
        return {"fps": manifest.source.average_fps_from_decoder,
                "frames_indices": list(manifest.sampling.frame_indices),
                "total_num_frames": manifest.sampling.total_num_frames}
    if FAMILIES[manifest.family].per_frame:   # SGLang passes the frozen file's own metadata (timestamps are text)
        n = manifest.num_frames
        return {"fps": float(FROZEN_FPS), "frames_indices": list(range(n)), "total_num_frames": n}
    return None                # SGLang passes none for Qwen2/2.5-VL


def video_processor(processor):
    """The video processor inside a multimodal processor (or the processor itself)."""
    return getattr(processor, "video_processor", processor)


def check_family(processor, manifests) -> None:
    """Refuse frames of one family given to another family's processor: the processor's class names its family
    (``families.family_of_processor``: Qwen2-VL and Qwen2.5-VL entries share a patch size, but not a rule for
    time), and the patch sizes must agree (Qwen2.5-VL entries with a Qwen3-VL processor fail deep in transformers
    with a reshape error)."""
    from .errors import ConfigError
    from .families import family_of_processor
    patch = getattr(video_processor(processor), "patch_size", None)
    for m in manifests:
        own_patch = FAMILIES[m.family].patch if m.family in FAMILIES else patch
        if isinstance(patch, int) and own_patch != patch:
            fams = sorted(f.name for f in FAMILIES.values() if f.patch == patch)
            raise ConfigError(f"the processor's patch size is {patch} ({' / '.join(fams)}), but entry {m.key} is "
                              f"{m.family} (patch {own_patch}): use the {m.family} checkpoint's "
                              f"processor, or prewarm with --family {fams[-1]}")
    own = family_of_processor(processor)        # same patch size: the class tells Qwen2-VL from Qwen2.5-VL
    for m in manifests:
        if own is not None and m.family != own:
            raise ConfigError(f"entry {m.key} was built for {m.family}, but the processor is {own}'s "
                              f"({type(processor).__name__}): its tensors and M-RoPE positions follow {own}'s "
                              f"rules. Use the {m.family} checkpoint's processor, or prewarm with --family {own}")


def resolve_mode(family: str, mode: str | None, what: str = "train_inputs") -> str:
    """The processing mode of a sample's videos: ``mode`` when given, never a guess where it changes the result.
    Only Qwen2.5-VL's tensors and positions depend on it (``second_per_grid_ts``: the source's 2/sample_fps in
    plugin mode, the frozen file's 2/24 in stock mode); the other families' tensors are the same in both."""
    from .errors import ConfigError
    if mode is not None:
        if mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {mode!r}")
        return mode
    fam = FAMILIES.get(family)
    if fam is not None and fam.scaled_time:
        raise ConfigError(f"{what}: {family}'s second_per_grid_ts (and so its M-RoPE positions) depend on the mode "
                          "the rollout was made in: pass the PreparedRequest (request=req, or req.train_inputs) or "
                          "mode='stock' / mode='plugin' (the mode of your SGLang servers; `vidcache sglang-config` "
                          "defaults to stock for this family; vLLM: plugin)")
    return "plugin"


def processor_kwargs(processor, manifests, mode: str) -> dict:
    """The HF processor kwargs for cached frames: sampling and resizing off (both were done once)."""
    check_family(processor, manifests)
    return _final_frames_kwargs(processor, [video_metadata(m, mode) for m in manifests])


def _final_frames_kwargs(processor, metas: list) -> dict:
    kw = {"do_sample_frames": False, "do_resize": False, "return_tensors": "pt"}
    if hasattr(type(video_processor(processor)), "cap_pixels_per_frame"):
        # transformers >= 5.2x warns on every call unless this is explicit.  False is what it does
        # when unset (so what SGLang gets), and with do_resize=False the cap touches nothing anyway.
        kw["cap_pixels_per_frame"] = False
    if any(m is not None for m in metas):
        kw["video_metadata"] = metas
    return kw


def model_tensors(out) -> dict[str, torch.Tensor]:
    """The model's video kwargs from a processor output, all on the device of ``pixel_values_videos``."""
    pv = out["pixel_values_videos"]
    res = {"pixel_values_videos": pv, "video_grid_thw": out["video_grid_thw"].to(pv.device, torch.int64)}
    if "second_per_grid_ts" in out:
        res["second_per_grid_ts"] = torch.as_tensor(out["second_per_grid_ts"], dtype=torch.float32).to(pv.device)
    return res


def processor_fingerprint(processor) -> str:
    """Digest of everything in the processor that shapes the video tensors (read from the object)."""
    return type(processor).__name__ + ":" + xxhash.xxh3_64_hexdigest(
        video_processor(processor).to_json_string().encode())


# --- one processor call, or one per video ---------------------------------------------------------
def split_per_video(tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """One processor output over n videos as n per-video outputs: the patches of video i are the rows
    ``prod(grid[i])`` after those of the videos before it (HF concatenates per-video patches in order)."""
    grids = tensors["video_grid_thw"]
    rows = [math.prod(g) for g in grids.tolist()]
    pieces = tensors["pixel_values_videos"].split(rows)
    out = []
    for i, pv in enumerate(pieces):
        d = {"pixel_values_videos": pv, "video_grid_thw": grids[i:i + 1]}
        if "second_per_grid_ts" in tensors:
            d["second_per_grid_ts"] = tensors["second_per_grid_ts"][i:i + 1]
        out.append(d)
    return out


def join_videos(per_video: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The inverse of ``split_per_video``: what one processor call over these videos returns."""
    if len(per_video) == 1:
        return dict(per_video[0])
    return {k: torch.cat([d[k] for d in per_video]) for k in per_video[0]}


def process(processor, frames: list[torch.Tensor], manifests, mode: str = "plugin",
            batched: bool = True) -> list[dict[str, torch.Tensor]]:
    """Per-video model tensors for uint8 ``T x 3 x H x W`` frames, on the frames' device.

    ``batched``: one processor call for all videos (HF stacks those of one shape), else one call per
    video.  Either way video i gets exactly the tensors a call on video i alone gives: normalisation is
    elementwise and patchify moves data, so stacking changes no value (tested with ``torch.equal``).
    """
    manifests = list(manifests)
    if not batched and len(frames) > 1:
        return [process(processor, [f], [m], mode)[0] for f, m in zip(frames, manifests)]
    kw = processor_kwargs(processor, manifests, mode)
    try:    # no prompt: expanding and tokenising thousands of <|video_pad|> would be wasted work here
        out = processor(videos=list(frames), **kw)
    except (TypeError, ValueError):     # a processor that insists on text
        out = processor(text=[VIDEO_PLACEHOLDER * len(frames)], videos=list(frames), **kw)
    return split_per_video(model_tensors(out))


# --- the memo ---------------------------------------------------------------------------------------
def _nbytes(value: dict) -> int:
    return sum(t.numel() * t.element_size() for t in value.values())


class Memo:
    """Recently computed per-video train inputs, keyed by (cache key, mode, processor config, device).

    Partial-rollout resumes, multi-turn requests and ``n_samples_per_prompt`` copies ask for the same
    video again; the frames never change under a key, so neither do the tensors.  Each device has its
    own byte budget, so tensors kept on a GPU never hold more than ``max_device_bytes`` of its memory
    (the trainer needs it); the least recently used entries go first.
    """

    def __init__(self, max_bytes: int = 1 << 30, max_device_bytes: int = 256 << 20) -> None:
        self.max_bytes = max_bytes                    # host memory
        self.max_device_bytes = max_device_bytes      # per accelerator
        self._items: dict[str, OrderedDict] = {}      # device -> key -> value
        self._bytes: dict[str, int] = {}
        self._lock = threading.Lock()

    def budget(self, device: str) -> int:
        return self.max_bytes if device == "cpu" else self.max_device_bytes

    def nbytes(self, device: str | None = None) -> int:
        with self._lock:
            return self._bytes.get(device, 0) if device else sum(self._bytes.values())

    def get(self, key, device: str):
        with self._lock:
            items = self._items.get(device)
            if items is not None and key in items:
                items.move_to_end(key)
                return items[key]
        return None

    def put(self, key, device: str, value: dict) -> None:
        size = _nbytes(value)
        with self._lock:
            items = self._items.setdefault(device, OrderedDict())
            if size > self.budget(device) or key in items:
                return
            items[key] = value
            self._bytes[device] = self._bytes.get(device, 0) + size
            while self._bytes[device] > self.budget(device):
                _, old = items.popitem(last=False)
                self._bytes[device] -= _nbytes(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes.clear()


MEMO = Memo()


def expanded_ids(processor, prompt: str, manifests, mode: str = "plugin", token_layout: str | None = None) -> list[int]:
    """The processor's expanded prompt ids, from the manifests alone: no frames are read.

    Uses the processor's own ``replace_video_token`` (pads, and Qwen3-VL's ``<t seconds>`` text from
    the mode's metadata) and ``get_text_with_replacements``, then its tokenizer, so long prompts can be
    measured exactly before anything is loaded; then moves them to the request's token layout
    (``request_layout``).  Equal to ``prepare(...).expanded_ids`` (tested).
    """
    manifests = list(manifests)
    reps = video_replacements(processor, manifests, mode)
    text = processor.get_text_with_replacements([prompt], videos_replacements=reps)[0][0] if reps else prompt
    ids = list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    return to_layout(processor, ids, manifests, mode, token_layout, reps)


def video_replacements(processor, manifests, mode: str) -> list[str]:
    """Each video's expansion text, as the processor's own ``replace_video_token`` writes it (its groups'
    ``<t seconds>``, ``<|vision_start|>``, pads and ``<|vision_end|>``; no wrapper around them)."""
    from transformers.video_utils import VideoMetadata

    reps = []
    for m in manifests:
        inputs = {"video_grid_thw": torch.tensor([list(m.tokens.video_grid_thw)])}
        meta = video_metadata(m, mode)
        if meta is not None:
            inputs["video_metadata"] = [VideoMetadata(**meta)]
        reps.append(processor.replace_video_token(inputs, 0))
    return reps


# --- token layouts (vidcache.token_layout names them) -------------------------------------------------
_LAYOUT_OF: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def layout_of(processor, family: str) -> str:
    """The token layout this processor produces for ``family``, read from its own output on a probe: one
    two-frame video of one patch group through ``processor(text=..., videos=...)``, whose
    ``<|vision_start|>`` ids are counted against its temporal groups (one more: ``wrapped``).  Never from a
    version string; probed once per processor object."""
    try:
        return _LAYOUT_OF[processor]
    except (KeyError, TypeError):
        pass
    side = FAMILIES[family].patch * int(getattr(video_processor(processor), "merge_size", 2) or 2)
    frames = torch.zeros(2, 3, side, side, dtype=torch.uint8)
    meta = {"fps": 2.0, "frames_indices": [0, 1], "total_num_frames": 2}
    out = processor(text=[VIDEO_PLACEHOLDER], videos=[frames], **_final_frames_kwargs(processor, [meta]))
    ids = out["input_ids"][0].tolist()
    vision_start, _ = special_ids(processor)
    groups, starts = int(out["video_grid_thw"][0][0]), ids.count(vision_start)
    # The family's first layout has no wrapper (plain, collapsed); "wrapped" adds one pair around the groups.
    layout = {groups: layouts(family)[0] if layouts(family) else "?", groups + 1: "wrapped"}.get(starts)
    if layout not in layouts(family):
        raise TokenLayoutError(f"{type(processor).__name__} expands one {family} video of {groups} group(s) into "
                               f"{starts} <|vision_start|> ids: not a token layout vidcache knows "
                               f"({', '.join(layouts(family))})")
    try:
        _LAYOUT_OF[processor] = layout
    except TypeError:          # not weak-referenceable: probe again next time (a few ms)
        pass
    return layout


def special_ids(processor) -> tuple[int, int]:
    tok = processor.tokenizer
    return tok.convert_tokens_to_ids("<|vision_start|>"), tok.convert_tokens_to_ids("<|vision_end|>")


def request_layout(processor, family: str, mode: str, token_layout: str | None = None) -> str:
    """The token layout a request's ids are in: ``token_layout`` if given, else ``$VIDCACHE_TOKEN_LAYOUT``'s for
    the family, else in plugin mode the model's own (``Family.model_layout``: the plugin makes the server expand in it,
    whatever either side's transformers), and in stock mode this processor's (stock SGLang expands in its own
    transformers' layout; name the server's layout here to follow it: ``check-server`` tells it)."""
    if token_layout is not None:
        return check_layout(family, token_layout)
    named = env_layout(family)
    if named is not None:
        return named
    return FAMILIES[family].model_layout if mode == "plugin" else layout_of(processor, family)


def to_layout(processor, ids, manifests, mode: str, token_layout: str | None = None,
              reps: list[str] | None = None) -> list[int]:
    """``ids``, as ``processor`` expanded them for ``manifests``, in the request's layout (``request_layout``)."""
    manifests = list(manifests)
    if not manifests:
        return list(ids)
    family = manifests[0].family
    dst = request_layout(processor, family, mode, token_layout)
    src = layout_of(processor, family)
    if src == dst:
        return list(ids)
    reps = video_replacements(processor, manifests, mode) if reps is None else reps
    tok = processor.tokenizer
    rep_ids = [list(tok(r, add_special_tokens=False)["input_ids"]) for r in reps]
    return convert(ids, rep_ids, src, dst, *special_ids(processor))
