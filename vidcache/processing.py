"""Trainer-side tensors and rollout requests, computed from the cached frames.

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
from dataclasses import dataclass, field

import torch
import xxhash

from .errors import ParityError
from .loader.frozen import FROZEN_FPS

MODES = ("plugin", "stock")
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"
TRAIN_KEYS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def video_metadata(manifest: dict, family: str, mode: str) -> dict | None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    v = manifest["video"]
    if mode == "plugin":
        return {"fps": v["fps"], "frames_indices": list(v["frame_indices"]), "total_num_frames": v["total_num_frames"]}
    if family == "qwen3_vl":   # SGLang passes the frozen file's own metadata
        n = v["num_frames"]
        return {"fps": float(FROZEN_FPS), "frames_indices": list(range(n)), "total_num_frames": n}
    return None                # SGLang passes none for Qwen2/2.5-VL


def _processor_kwargs(handles, mode: str) -> dict:
    kw = {"do_sample_frames": False, "do_resize": False, "return_tensors": "pt"}
    metas = [video_metadata(h.manifest, h.options.family, mode) for h in handles]
    if any(m is not None for m in metas):
        kw["video_metadata"] = metas
    return kw


def _tensors(out) -> dict[str, torch.Tensor]:
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
    out = processor(text=[text], videos=[h.frames() for h in handles], **_processor_kwargs(handles, mode))
    result = _tensors(out)
    if memo_key is not None:
        MEMO.put(memo_key, result)
    return dict(result)


@dataclass
class PreparedRequest:
    """Everything a rollout client needs for one prompt; built from the cache, without decoding."""
    compact_ids: list[int]           # for SGLang: one placeholder run per video
    expanded_ids: list[int]          # for training: the processor's expansion
    video_data: list[str]            # frozen-frames URIs, one per video
    train_inputs: dict[str, torch.Tensor]
    mode: str
    extra: dict = field(default_factory=dict)

    def check(self, response: dict) -> None:
        """Divergence guard: SGLang's view of the prompt must equal ``expanded_ids``.

        Pass SGLang's ``/generate`` response (or its ``meta_info``).  Send the request with
        ``return_prompt_token_ids: true`` for the strict id comparison (SGLang 0.5.23 returns
        ``prompt_token_ids`` at the top level); otherwise only ``meta_info.prompt_tokens`` is compared.
        """
        meta_info = dict(response.get("meta_info") or {}) if "meta_info" in response else dict(response)
        if "prompt_token_ids" in response and "prompt_token_ids" not in meta_info:
            meta_info["prompt_token_ids"] = response["prompt_token_ids"]
        ids = meta_info.get("prompt_token_ids")
        if ids is not None:
            ids = list(ids[0] if ids and isinstance(ids[0], list) else ids)
            if ids != self.expanded_ids:
                first = next((i for i, (a, b) in enumerate(zip(ids, self.expanded_ids)) if a != b),
                             min(len(ids), len(self.expanded_ids)))
                raise ParityError(f"SGLang expanded the prompt differently from the trainer: {len(ids)} vs "
                                  f"{len(self.expanded_ids)} ids, first difference at position {first}. "
                                  "Check that the server runs with `vidcache sglang-config` for this mode.")
        n = meta_info.get("prompt_tokens")
        if n is not None and n != len(self.expanded_ids):
            raise ParityError(f"SGLang counted {n} prompt tokens, the trainer has {len(self.expanded_ids)}. "
                              "The server's video processing differs from the cache "
                              "(run SGLang with the flags from `vidcache sglang-config`).")
        if ids is None and n is None:
            raise ParityError("meta_info has neither prompt_token_ids nor prompt_tokens; cannot check divergence")


def prepare(processor, prompt: str, handles, mode: str = "plugin", transport: str = "file",
            base_url: str | None = None, frozen_format: str | None = None) -> PreparedRequest:
    """Build compact ids, expanded ids, frozen URIs and train tensors for ``prompt``.

    ``prompt`` is the chat-templated text with one ``<|vision_start|><|video_pad|><|vision_end|>``
    per handle, in order.
    """
    from .transport import video_uri
    handles = list(handles)
    n = prompt.count(VIDEO_PLACEHOLDER)
    if n != len(handles):
        raise ValueError(f"prompt has {n} video placeholder(s) but {len(handles)} handle(s) were given")
    tok = processor.tokenizer
    compact = tok(prompt, add_special_tokens=False)["input_ids"]
    if handles:
        out = processor(text=[prompt], videos=[h.frames() for h in handles], **_processor_kwargs(handles, mode))
        tensors = _tensors(out)
    else:
        out = tok([prompt], add_special_tokens=False, return_tensors="pt")
        tensors = {}
    expanded = out["input_ids"][0].tolist()
    return PreparedRequest(list(compact), expanded, [video_uri(h, mode, transport, base_url, frozen_format) for h in handles],
                           tensors, mode)


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
        inputs = {"video_grid_thw": torch.tensor([m["tokens"]["video_grid_thw"]])}
        meta = video_metadata(m, h.options.family, mode)
        if meta is not None:
            inputs["video_metadata"] = [VideoMetadata(**meta)]
        reps.append(processor.replace_video_token(inputs, 0))
    text = processor.get_text_with_replacements([prompt], videos_replacements=reps)[0][0] if reps else prompt
    return list(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
