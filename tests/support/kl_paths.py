"""Rollout-side and trainer-side inputs for the KL table (benchmarks/kl_table.py, tests/test_kl_table.py).

Not a test module.  Each function builds one side's (ids, tensors) the way that path builds them; the model and
the KL are ``vidcache.testing.kl``'s.  These live here, beside the SGLang peer they run (tests/support/
sglang_peer.py: SGLang 0.5.23's own ``_process_mm_data_uncached`` on CPU), so the benchmark and its test build
every row with the same code.

Trainer side (every row): ``train_inputs()`` and ``expanded_ids`` of the vidcache entry, in the row's mode.
Rollout side, per row:

  stock       SGLang's own processor (stock class, ``vidcache sglang-config --mode stock``) on the frozen file
  plugin      SGLang with vidcache's plugin class on the reference, resolved through this node's cache
  naive       SGLang's stock processor on the *original source*: it decodes (torchcodec, else decord), samples
              and resizes itself, with the same fps / pixel bounds in ``--mm-process-config`` (the best a naive
              set-up can do); the trainer is the one such a set-up has, qwen-vl-utils semantics (= vidcache's
              plugin-mode ``train_inputs``) with its own processor's ids
  backend     the rollout is vidcache's plugin path; the *trainer's* frames come from qwen-vl-utils'
              ``fetch_video`` with another reader backend (torchcodec) or decord at its own thread default
  layout      Qwen3-VL: the rollout's ids in transformers 5.24's ``wrapped`` layout, the trainer's in 5.25's
              ``collapsed`` layout; same pixels
  offset      the rollout's sampler is one source frame late (indices + 1, clamped), same size and processor
"""
from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass, field

import torch

from support import sglang_peer as sp

import vidcache
from vidcache import VideoOptions, prepare
from vidcache.processing import (VIDEO_PLACEHOLDER, _final_frames_kwargs, expanded_ids, layout_of, model_tensors,
                                 request_layout, special_ids)
from vidcache.sglang_facts import stock_pixel_bounds
from vidcache.token_layout import convert

PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe the video.<|im_end|>\n<|im_start|>assistant\n"
# The fixed response both sides score (K = its byte-level tokens; the toy tokenizer has one id per byte).
RESPONSE = "A red square slides across a moving colour gradient.<|im_end|>"
# The parity suite's tight budget: the 160 s clip's 320 frames stay a CPU forward pass.  Qwen3-VL in stock mode
# sits on the 224 grid (``for_stock_sglang``), whose smallest cell already is 50176 pixels: two cells there.
TIGHT = {"fps": 2.0, "min_pixels": 3136, "max_pixels": 50176}


def options(family: str, mode: str) -> VideoOptions:
    if mode == "stock":
        if family == "qwen3_vl":
            lo = stock_pixel_bounds("qwen3_vl", _sglang_version())[0]
            return VideoOptions.for_stock_sglang(family, fps=2.0, min_pixels=max(3136, lo),
                                                 max_pixels=max(100352, 2 * lo))
        return VideoOptions.for_stock_sglang(family, **TIGHT)
    return VideoOptions(family=family, **TIGHT)


def _sglang_version() -> str:
    import importlib.metadata as md
    return md.version("sglang")


@dataclass
class Side:
    """One side's prompt ids and video tensors (``pixel_values_videos``, ``video_grid_thw``,
    ``second_per_grid_ts`` for Qwen2.5-VL), and the frames they were computed from."""
    ids: list[int]
    tensors: dict
    frames: torch.Tensor | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)
    # The M-RoPE rule the side's model runs: None, the model's own (transformers'); "sglang" / "vllm": that
    # engine's positions over the whole sequence (vidcache.rope_positions' rule), as the engine or a trainer that
    # is given them computes.
    positions: str | None = None


def position_ids(processor, family: str, side: Side, response: list[int]):
    """The side's positions over prompt + response, or None for the model's own."""
    if side.positions is None:
        return None
    from vidcache.positions import positions_from_tensors
    return positions_from_tensors(processor, side.ids + list(response), side.tensors, family, side.positions)


def engine_positions(side: Side, engine: str = "sglang") -> Side:
    """The same side, scored at ``engine``'s positions."""
    return Side(side.ids, side.tensors, side.frames, side.note, side.extra, engine)


def response_ids(processor) -> list[int]:
    return list(processor.tokenizer(RESPONSE, add_special_tokens=False)["input_ids"])


# --- trainer -------------------------------------------------------------------------------------------
def trainer(processor, handle, mode: str, token_layout: str | None = None) -> Side:
    """vidcache's trainer side: ``train_inputs()`` (memo off: computed here, from the cached frames) and
    ``expanded_ids`` (no frames read), in ``mode`` and the request's token layout."""
    return Side(expanded_ids(processor, PROMPT, [handle.manifest], mode, token_layout),
                dict(handle.train_inputs(processor, mode=mode, memo=False)), handle.frames())


# --- SGLang peers ----------------------------------------------------------------------------------------
class Peers:
    """SGLang processors as a server builds them (``build_processor(..., sglang_size_override=True)``), per
    (family, kind): ``stock`` / ``plugin`` with ``vidcache sglang-config``'s video config, ``naive`` with the
    options' own fps and pixel bounds."""

    def __init__(self):
        self._made: dict = {}
        self._plugin: dict | None = None

    def plugin_classes(self) -> dict:
        if self._plugin is None:
            import importlib

            from sglang.srt.managers.multimodal_processor import PROCESSOR_MAPPING, import_processors

            from vidcache.sglang.config import PLUGIN_PACKAGE
            sp.require_peer()
            importlib.import_module(PLUGIN_PACKAGE + ".qwen_vl")
            import_processors(PLUGIN_PACKAGE, overwrite=True)      # SGLang's own external-package hook
            self._plugin = {m.__name__: p for m, p in PROCESSOR_MAPPING.items()}
        return self._plugin

    def get(self, family: str, kind: str):
        if (family, kind) not in self._made:
            from support.toy_processors import build_processor

            from vidcache.sglang.config import sglang_config
            if kind == "naive":
                cfg, cls = dict(TIGHT), None
            else:
                cfg = sglang_config(family, kind)["mm_process_config"]["video"]
                cls = self.plugin_classes()[sp._ARCH[family]] if kind == "plugin" else None
            self._made[family, kind] = sp.build_peer(family, build_processor(family, sglang_size_override=True),
                                                     video_config=cfg, processor_cls=cls)
        return self._made[family, kind]


def _sglang_side(out: dict, note: str = "") -> Side:
    t = {"pixel_values_videos": out["pixel_values_videos"], "video_grid_thw": out["video_grid_thw"]}
    if out.get("second_per_grid_ts") is not None:
        t["second_per_grid_ts"] = torch.as_tensor(out["second_per_grid_ts"], dtype=torch.float32)
    frames = out["frames"][0] if out["frames"] else None
    if frames is not None and hasattr(frames, "frames"):       # the plugin's loaded item (VidcacheVideo)
        frames = frames.frames
    return Side(list(out["input_ids"]), t, frames, note, {"video_metadata": out.get("video_metadata"),
                                                          "mrope_positions": out.get("mrope_positions")})


def sglang_vidcache(peers: Peers, processor, handle, mode: str) -> Side:
    """Rows 1-2: what vidcache sends (compact ids + the frozen file's URI or the reference) through SGLang."""
    prep = prepare(processor, PROMPT, [handle], mode=mode)
    return _sglang_side(sp.run_peer(peers.get(handle.manifest.family, mode), prep.compact_ids, prep.video_data))


def sglang_naive(peers: Peers, family: str, source: str) -> Side:
    """Row 3: SGLang decodes, samples and resizes the original source itself."""
    quiet = contextlib.redirect_stderr(io.StringIO())      # "CUDA video decoding failed" per decode, on CPU
    with quiet:
        out = sp.run_peer(peers.get(family, "naive"), PROMPT, ["file://" + os.path.abspath(source)])
    # SGLang labels every decode "torchvision" in its metadata; the reader really used is its module's choice.
    from sglang.srt.utils import video_decoder
    return _sglang_side(out, f"SGLang: {video_decoder._BACKEND} on the CPU, its own sampler, bilinear resize")


def native_trainer(processor, handle) -> Side:
    """The naive set-up's trainer: qwen-vl-utils' frames (what the entry holds) and the original metadata
    (plugin mode's tensors), with ids in its own processor's layout (the same transformers as the server here)."""
    fam = handle.manifest.family
    return trainer(processor, handle, "plugin", token_layout=layout_of(processor, fam))


# --- frames from elsewhere, through the trainer's processor ----------------------------------------------
def processor_side(processor, family: str, frames: torch.Tensor, meta: dict, dst_layout: str, note: str = "") -> Side:
    """HF's processor on ``frames`` (final size, uint8) with ``meta``, as vidcache's trainer calls it (sampling
    and resizing off); its ids moved to ``dst_layout`` with ``token_layout.convert`` where they differ."""
    from transformers.video_utils import VideoMetadata

    kw = _final_frames_kwargs(processor, [meta])
    out = processor(text=[PROMPT], videos=[frames], **kw)
    ids = out["input_ids"][0].tolist()
    src = layout_of(processor, family)
    if src != dst_layout:
        rep = processor.replace_video_token({"video_grid_thw": out["video_grid_thw"],
                                             "video_metadata": [VideoMetadata(**meta)]}, 0)
        rep_ids = list(processor.tokenizer(rep, add_special_tokens=False)["input_ids"])
        ids = convert(ids, [rep_ids], src, dst_layout, *special_ids(processor))
    return Side(ids, model_tensors(out), frames, note)


def qvu_trainer(processor, handle, backend: str) -> Side:
    """Row 4: the trainer re-decodes the source with qwen-vl-utils 0.0.14's ``fetch_video`` and ``backend``
    (``decord``: its own ``VideoReader(path)`` thread default; vidcache decodes with 2 threads)."""
    from qwen_vl_utils import vision_process as qvu

    m = handle.manifest
    ele = {"video": handle.source, **_element(m)}
    old = qvu.FORCE_QWENVL_VIDEO_READER
    qvu.FORCE_QWENVL_VIDEO_READER = backend          # qwen-vl-utils' own switch (its env var, read at import)
    qvu.get_video_reader_backend.cache_clear()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            video, meta = qvu.fetch_video(ele, image_patch_size=_patch(m.family), return_video_metadata=True)
    except AttributeError as e:
        if "read_video" not in str(e):
            raise
        # fetch_video catches its reader's error and retries with torchvision, which 0.29 no longer has.
        raise RuntimeError(f"qwen-vl-utils' {backend} reader cannot read this clip, and its torchvision fallback "
                           "is gone (torchvision 0.29 has no io.read_video)") from None
    finally:
        qvu.FORCE_QWENVL_VIDEO_READER = old
        qvu.get_video_reader_backend.cache_clear()
    used = meta.get("video_backend")
    if used != backend:      # fetch_video falls back to torchvision on any reader error: never score that silently
        raise RuntimeError(f"qwen-vl-utils read the video with {used!r}, not {backend!r}")
    meta = {"fps": float(meta["fps"]), "frames_indices": [int(i) for i in meta["frames_indices"]],
            "total_num_frames": int(meta["total_num_frames"])}
    # fetch_video resizes the uint8 frames, then casts to float: the values are whole numbers.
    frames = video.round().clamp(0, 255).to(torch.uint8)
    dst = request_layout(processor, m.family, "plugin")
    return processor_side(processor, m.family, frames, meta, dst, f"qwen-vl-utils {backend}")


def _patch(family: str) -> int:
    from vidcache.families import FAMILIES
    return FAMILIES[family].patch


def _element(manifest) -> dict:
    """The qwen-vl-utils element for the options the entry was built with (the same fps and pixel bounds)."""
    o = manifest.options
    return {k: o[k] for k in ("fps", "min_pixels", "max_pixels") if o.get(k) is not None}


def offset_rollout(processor, handle, shift: int = 1) -> Side:
    """Row 6: the rollout's frames are the source frames ``shift`` after the entry's (clamped to the last),
    decoded by the same decoder and resized to the same size; its metadata names the indices it used."""
    from vidcache.loader.decode import open_reader
    from vidcache.loader.resize import resize_frames

    m = handle.manifest
    _, reader = open_reader(handle.source, "decord")
    last = reader.num_frames - 1
    idx = [min(i + shift, last) for i in m.sampling.frame_indices]
    raw = reader.get_frames(idx)
    frames = resize_frames(raw, (m.height, m.width)).contiguous()
    meta = {"fps": m.source.average_fps_from_decoder, "frames_indices": idx,
            "total_num_frames": m.sampling.total_num_frames}
    dst = request_layout(processor, m.family, "plugin")
    return processor_side(processor, m.family, frames, meta, dst, f"indices + {shift}")


def layout_rollout(processor, handle) -> Side:
    """Row 5 (Qwen3-VL): the plugin's pixels, ids in transformers 5.24's ``wrapped`` layout (this venv's own
    processor expands in it natively: no conversion on this side)."""
    return Side(expanded_ids(processor, PROMPT, [handle.manifest], "plugin", token_layout="wrapped"),
                dict(handle.train_inputs(processor, mode="plugin", memo=False)), handle.frames(),
                "5.24 ids: this venv's processor (wrapped); 5.25 ids: token_layout.convert")


def frames_differ(a: torch.Tensor | None, b: torch.Tensor | None) -> str:
    """How two sides' frames differ ('' when they are equal)."""
    if a is None or b is None:
        return "frames unknown"
    if tuple(a.shape) != tuple(b.shape):
        return f"shape {tuple(a.shape)} vs {tuple(b.shape)}"
    if torch.equal(a, b):
        return ""
    d = (a.to(torch.int16) - b.to(torch.int16)).abs()
    return f"{float((d > 0).double().mean()) * 100:.1f}% of values differ, max {int(d.max())}"


def get(source: str, family: str, mode: str, cache):
    return vidcache.get(source, options(family, mode), cache)
