"""Trainer-side tensors, computed from the cached frames (the SGLang side is ``vidcache.sglang``).

Two temporal modes (see README, "Stock SGLang vs the plugin"):
  ``plugin``  the original video's metadata (what qwen-vl-utils reports): the
              correct Qwen2.5-VL ``second_per_grid_ts`` and Qwen3-VL timestamps.
  ``stock``   what SGLang 0.5.23 computes from a frozen file as shipped: no
              metadata for Qwen2/2.5 (so 2/24 s per grid for Qwen2.5-VL) and
              the frozen file's own timeline for Qwen3-VL.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from fractions import Fraction

import torch
import xxhash

MODES = ("plugin", "stock")
# The rate frozen files are stamped at, and SGLang's fps sampler is configured with (stock mode):
# in stock mode Qwen3-VL's timestamps come from this timeline, so the trainer reproduces it.
FROZEN_FPS = Fraction(2)
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"
TRAIN_KEYS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def video_metadata(manifest, mode: str) -> dict | None:
    """The ``video_metadata`` the HF processor gets for an entry in ``mode`` (None: none is passed)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "plugin":       # the original video's timeline, as qwen-vl-utils reports it
        return {"fps": manifest.source.average_fps_from_decoder,
                "frames_indices": list(manifest.sampling.frame_indices),
                "total_num_frames": manifest.sampling.total_num_frames}
    if manifest.family == "qwen3_vl":   # SGLang passes the frozen file's own metadata
        n = manifest.num_frames
        return {"fps": float(FROZEN_FPS), "frames_indices": list(range(n)), "total_num_frames": n}
    return None                # SGLang passes none for Qwen2/2.5-VL


def processor_kwargs(processor, handles, mode: str) -> dict:
    """The HF processor kwargs for cached frames: sampling and resizing off (both were done once)."""
    kw = {"do_sample_frames": False, "do_resize": False, "return_tensors": "pt"}
    vp = getattr(processor, "video_processor", processor)
    if hasattr(type(vp), "cap_pixels_per_frame"):
        # transformers >= 5.2x warns on every call unless this is explicit.  False is what it does
        # when unset (so what SGLang gets), and with do_resize=False the cap touches nothing anyway.
        kw["cap_pixels_per_frame"] = False
    metas = [video_metadata(h.manifest, mode) for h in handles]
    if any(m is not None for m in metas):
        kw["video_metadata"] = metas
    return kw


def model_tensors(out) -> dict[str, torch.Tensor]:
    res = {"pixel_values_videos": out["pixel_values_videos"], "video_grid_thw": out["video_grid_thw"].to(torch.int64)}
    if "second_per_grid_ts" in out:
        res["second_per_grid_ts"] = torch.as_tensor(out["second_per_grid_ts"], dtype=torch.float32)
    return res


class _Memo:
    """Recently computed train inputs, keyed by (cache keys, mode, processor config), bounded in bytes.

    Partial-rollout resumes, multi-turn requests and n samples per prompt ask for the same
    video again; the frames never change under a key, so neither do the tensors.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def put(self, key, value: dict) -> None:
        size = sum(t.numel() * t.element_size() for t in value.values())
        with self._lock:
            if size > self.max_bytes or key in self._items:
                return
            self._items[key] = value
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= sum(t.numel() * t.element_size() for t in old.values())


MEMO = _Memo()


def processor_fingerprint(processor) -> str:
    """Digest of everything in the processor that shapes the video tensors."""
    vp = getattr(processor, "video_processor", processor)
    return type(processor).__name__ + ":" + xxhash.xxh3_64_hexdigest(vp.to_json_string().encode())


def train_inputs(processor, handles, mode: str = "plugin", memo: bool = True) -> dict[str, torch.Tensor]:
    """HF processor outputs for the cached frames, with sampling and resizing off (they were done once).

    Results are memoised in-process (``MEMO``); treat the returned tensors as read-only.
    """
    handles = list(handles)
    if not handles:
        return {}
    memo_key = (tuple(h.resolve() for h in handles), mode, processor_fingerprint(processor)) if memo else None
    if memo_key is not None and (hit := MEMO.get(memo_key)) is not None:
        return dict(hit)
    text = VIDEO_PLACEHOLDER * len(handles)
    videos = [h.frames() for h in handles]          # builds a lazy handle's entry first, if it must
    out = processor(text=[text], videos=videos, **processor_kwargs(processor, handles, mode))
    result = model_tensors(out)
    if memo_key is not None:
        MEMO.put(memo_key, result)
    return dict(result)


def expanded_ids(processor, prompt: str, handles, mode: str = "plugin") -> list[int]:
    """The processor's expanded prompt ids, from the manifests alone: no frames are read.

    Uses the processor's own ``replace_video_token`` (pads, and Qwen3-VL's ``<t seconds>`` text from
    the mode's metadata) and ``get_text_with_replacements``, then its tokenizer, so long prompts can be
    measured exactly before anything is loaded.  Equal to ``prepare(...).expanded_ids`` (tested).
    """
    from transformers.video_utils import VideoMetadata

    handles = list(handles)
    reps = []
    for h in handles:
        m = h.manifest
        inputs = {"video_grid_thw": torch.tensor([list(m.tokens.video_grid_thw)])}
        meta = video_metadata(m, mode)
        if meta is not None:
            inputs["video_metadata"] = [VideoMetadata(**meta)]
        reps.append(processor.replace_video_token(inputs, 0))
    text = processor.get_text_with_replacements([prompt], videos_replacements=reps)[0][0] if reps else prompt
    return list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
