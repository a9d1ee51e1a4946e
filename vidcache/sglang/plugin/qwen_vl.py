"""SGLang Qwen-VL processor that serves vidcache references from the cache.

Registered by SGLang's ``import_processors`` when the server runs with
``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE=vidcache.sglang.plugin``.  For every Qwen-VL processor class
this SGLang has (``QwenVLImageProcessor``; a separate Qwen3-VL class too, should upstream add one) it
defines a subclass that takes over all of that class's architectures, and behaves exactly like it
unless a request's ``video_data`` holds vidcache references (the
``data:application/vnd.vidcache.ref+json`` URIs that ``vidcache.prepare(..., mode="plugin")``
produces, ``vidcache.rollout.ref``).  For those it:

* reads the canonical uint8 frames straight from the cache: no codec, no
  re-sampling, no resize (the frames were sampled and sized once at prewarm);
* hands the HF processor the *original* video's metadata (fps, frame indices,
  total frames), so Qwen2.5-VL gets ``second_per_grid_ts = 2 / sample_fps`` and
  Qwen3-VL the original timestamps, exactly like ``train_inputs(mode="plugin")``;
* puts the expanded ids in the token layout the references name (``vidcache.token_layout``), whatever
  this server's transformers expands in, so trainer and server agree across releases;
* after the HF call, hashes its own output per video (``vidcache.attest``) and compares it with the
  reference's attestation, the trainer's digest of the same tensors: any difference rejects the request
  as a client error (SGLang answers 400) naming the key and the field.  References without an
  attestation are served and counted (``Counters``);
* for references that name a tower (``embeddings``, version 5), reads each video's precomputed embeddings through
  the server's lookup (``vidcache.rollout.embeddings.server_lookup``), checks them (the exact key, the grid, the row
  count, the family's deepstack, the attested digest) and hands SGLang a precomputed-embedding item in place of
  ``pixel_values_videos``: SGLang 0.5.23's scheduler then skips the vision tower for it
  (``srt/managers/mm_utils.py:606-616``, ``mm_schedule.py:75-141``).  Anything that does not check out is refused
  (400), never served from the frames instead.

No in-process memo of frames: a cache read is one copy out of LMDB's memory
map (page cache on a resend), which is small next to the HF processor's float
conversion, and a memo would pin up to GBs of frames in the server.
"""
from __future__ import annotations

import contextvars
import importlib
import inspect
import logging
import os
import threading

import torch
from sglang.srt.managers.schedule_batch import Modality
from sglang.srt.multimodal.processors.base_processor import BaseMultimodalProcessor

from ...attest import attest, compare
from ...errors import VidcacheError
from ...families import FAMILIES
from ...processing import layout_of, model_tensors, to_layout, video_metadata
from ...rollout.embeddings import (EmbeddingsMismatchError, Tower, check_grid, decoder_rows, decoder_width,
                                   embeddings_digest, server_lookup)
from ...rollout.ref import open_ref, parse_ref
from ...sglang_facts import MODEL_PACKAGE_ENV
from ..request import ATTESTATION_MARK, SERVER_MARK
from ..versions import installed_sglang, qwen_vl_processor_modules

logger = logging.getLogger(__name__)
SGLANG_VERSION = installed_sglang()

# SGLang's own keys for its sampler and factor-28 resize (preprocess_video), which must not reach the HF
# processor for frames that are already final.  0.5.23 names them QWEN_VIDEO_PREPROCESS_CONFIG_KEYS;
# 0.5.16 has no such constant and forwards them all.
PREPROCESS_KEYS = frozenset({"fps", "nframes", "min_frames", "max_frames", "min_pixels", "max_pixels",
                             "total_pixels", "resized_height", "resized_width"})
# The video config of the current HF call when it serves references (per task/thread: SGLang runs
# several requests at once).  Older SGLang reads ``self.video_config`` inside process_mm_data with no way
# to pass another, so the plugin's ``video_config`` is a property that consults this first.
_CALL_VIDEO_CONFIG: contextvars.ContextVar = contextvars.ContextVar("vidcache_video_config", default=None)


def server_facts() -> str:
    """What this server computes that no SGLang endpoint reports, in the form ``check-server`` reads from a refused
    canary (``request.parse_server_facts``): the external model package its processes were started with (SGLang's
    scheduler is started by the same launcher, with this environment)."""
    return f"[{SERVER_MARK} model_package={os.environ.get(MODEL_PACKAGE_ENV) or '-'}]"


class Counters:
    """Plugin-mode requests by attestation outcome (this server process); logged, and read by tests."""
    lock = threading.Lock()
    attested = 0
    unattested = 0
    rejected = 0
    layout_converted = 0      # requests whose ids the plugin moved into the layout they name

    @classmethod
    def add(cls, name: str) -> int:
        with cls.lock:
            n = getattr(cls, name) + 1
            setattr(cls, name, n)
            return n


class VidcacheVideo:
    """A loaded reference.  Deliberately neither a dict (SGLang's processor_output
    format) nor a ``VideoDecoderWrapper``: ``preprocess_video`` then returns it
    untouched, which is what skips SGLang's fps sampler and its factor-28 resize."""

    __slots__ = ("frames", "metadata", "manifest", "key", "attest", "layout", "tower")

    def __init__(self, frames, manifest, key, attest=None, layout=None, tower=None):
        self.frames, self.manifest, self.key, self.attest, self.layout = frames, manifest, key, attest, layout
        self.tower = tower        # a Tower: serve this video's precomputed embeddings
        self.metadata = video_metadata(manifest, "plugin")

    @property
    def family(self) -> str:
        return self.manifest.family

    def __repr__(self) -> str:  # SGLang logs items on errors; never dump the frames
        return f"VidcacheVideo({self.key}, {tuple(self.frames.shape)})"


class UnloadableRef:
    """A reference that could not be loaded, carried to ``process_mm_data`` to be refused there: SGLang 0.5.16
    turns any exception of an io worker into a RuntimeError (HTTP 500), while a ValueError from the processor is
    a client error (400) on every release, so the request is refused the same way everywhere."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message

    def __repr__(self) -> str:
        return f"UnloadableRef({self.message[:80]!r})"


def load_ref(rec: dict) -> VidcacheVideo:
    """Frames and original metadata of a parsed reference, from *this node's* cache only (``ref.open_ref``)."""
    m, frames = open_ref(rec)
    tower = Tower(**rec["embeddings"]) if rec.get("embeddings") else None
    return VidcacheVideo(frames, m, rec["key"], rec.get("attest"), rec.get("layout"), tower)


def enforce_layout(processor, refs: list[VidcacheVideo], ret) -> None:
    """Put ``ret``'s ids in the token layout the references name, whatever this server's transformers expands
    in (``vidcache.token_layout``): a trainer on transformers 5.25 and a server on 5.19 then see the same ids.
    References without a layout (older clients) keep the server's own."""
    wanted = {v.layout for v in refs}
    if wanted == {None}:
        return
    if len(wanted) > 1:
        raise ValueError(f"vidcache references of one request name different token layouts {sorted(map(str, wanted))}")
    (layout,) = wanted
    ids = ret["input_ids"]
    old = ids[0].tolist()
    new = to_layout(processor, old, [v.manifest for v in refs], "plugin", layout)
    if new != old:
        ret["input_ids"] = torch.tensor([new], dtype=ids.dtype)
        if "attention_mask" in ret:
            ret["attention_mask"] = torch.ones_like(ret["input_ids"])
        if Counters.add("layout_converted") == 1:
            logger.info("vidcache: expanding requests in the %r token layout the trainer sends (this server's "
                        "transformers expands in %r)", layout, layout_of(processor, refs[0].family))


def embedding_rows(refs: list[VidcacheVideo], ret, images, width) -> list | None:
    """Each reference's precomputed rows for the decoder (``rollout.embeddings.decoder_rows``), read through this
    server's lookup and checked against the processor output ``ret`` and the model's row width (``width()``, asked
    only then); None when no reference asks for them.  Raises ``ValueError`` (a 400) for anything SGLang could not
    be handed exactly: rows of
    another width would fail inside the scheduler (``srt/managers/mm_utils.py:429-444``), not as a refusal."""
    towers = [v.tower for v in refs]
    if all(t is None for t in towers):
        return None
    if any(t is None for t in towers):
        raise ValueError("vidcache references of one request must all ask for precomputed embeddings, or none: "
                         "SGLang 0.5.23 embeds a request's videos either all from precomputed rows or all through "
                         "its tower (srt/managers/mm_schedule.py:120-123)")
    width = width()
    if images:
        raise ValueError("vidcache cannot serve precomputed video embeddings beside images in one request: the plugin "
                         "hands SGLang one video item for the request's processor output")
    grids = torch.as_tensor(ret["video_grid_thw"]).reshape(-1, 3).tolist()
    rows, key = [], refs[0].key
    try:
        lookup = server_lookup()
        for v, grid in zip(refs, grids):
            key, want = v.key, v.tower.key(v.key)
            rec = lookup(want)
            if rec.key != want:        # a lookup must never answer for another key (another tower's rows)
                raise EmbeddingsMismatchError(f"the lookup returned a record for {rec.key.as_dict()}, asked for "
                                              f"{want.as_dict()}")
            check_grid(rec, grid, v.family)
            r = decoder_rows(rec)
            if r.shape[-1] != width:
                raise EmbeddingsMismatchError(f"record rows are {r.shape[-1]} wide, this server's model takes {width}")
            rows.append(r)
    except VidcacheError as e:
        Counters.add("rejected")
        raise ValueError(f"vidcache cannot serve precomputed embeddings for {key}: [{e.kind}] {e}") from None
    return rows


def serve_embeddings(ret, rows: list):
    """``ret`` with the videos' precomputed rows in place of their pixels: SGLang's collector
    (``collect_mm_items_from_processor_output``) turns ``precomputed_embeddings`` into the item's rows when the output
    names its modality (else it would file them as an image); only what the video item and M-RoPE need is kept."""
    from sglang.srt.managers.schedule_batch import Modality as M
    keep = {k: ret[k] for k in ("input_ids", "video_grid_thw", "second_per_grid_ts") if k in ret}
    return type(ret)({**keep, "precomputed_embeddings": torch.cat(rows), "modality": M.VIDEO})


def check_attestations(refs: list[VidcacheVideo], ret, embeddings: list | None = None) -> None:
    """Compare the HF output for ``refs`` (one call, in order) with each reference's attestation;
    raise ``ValueError`` (SGLang answers 400) naming the key and the field on any difference."""
    if all(v.attest is None for v in refs):
        n = Counters.add("unattested")
        if n == 1 or n % 1000 == 0:
            logger.warning("vidcache: %d plugin-mode request(s) without attestation served unchecked "
                           "(prepare(..., attest=False) or an older client)", n)
        return
    if any(v.attest is None for v in refs):
        # Attested or not, a request is one or the other: one attested video must not make the rest look checked.
        Counters.add("rejected")
        raise ValueError(f"{ATTESTATION_MARK}: {sum(v.attest is None for v in refs)} of {len(refs)} vidcache "
                         "references of this request carry no attestation; send all with one (prepare(...)) or none")
    tensors = model_tensors(ret)
    got = attest(tensors)
    for g, e in zip(got, embeddings or []):
        g["embeddings"] = embeddings_digest(e)
    rows = tensors["pixel_values_videos"]
    start = 0
    problems = []
    for i, (v, g) in enumerate(zip(refs, got)):
        t, h, w = g["video_grid_thw"]
        n = t * h * w
        pos = v.attest.get("position")
        if pos is not None and pos != [i, len(refs)]:
            problems.append(f"{v.key}: sent as video {i + 1} of {len(refs)}, attested as video {pos[0] + 1} of "
                            f"{pos[1]}")
        problems += [f"{v.key}: {d}" for d in compare(v.attest, g, rows[start:start + n])]
        start += n
    if problems:
        Counters.add("rejected")
        raise ValueError(f"{ATTESTATION_MARK}: SGLang {SGLANG_VERSION}'s processor output differs from the "
                         "trainer's for " + "; ".join(problems) + ". The server's processor, transformers or "
                         "checkpoint revision differs from the trainer's. " + server_facts())
    Counters.add("attested")


class VidcachePluginMixin:
    """What the plugin adds to an SGLang Qwen-VL processor class (see ``plugin_classes``)."""

    @property
    def video_config(self):
        override = _CALL_VIDEO_CONFIG.get()
        return override if override is not None else self.__dict__.get("_vidcache_video_config", {})

    @video_config.setter
    def video_config(self, value):
        self.__dict__["_vidcache_video_config"] = value

    @classmethod
    def _load_single_item(cls, data, modality, *args, **kwargs):
        if modality == Modality.VIDEO:
            uri = getattr(data, "url", data)          # VideoData wraps the URI
            if isinstance(uri, str):
                try:
                    rec = parse_ref(uri)
                    if rec is not None:
                        return load_ref(rec)
                except VidcacheError as e:
                    # A bad or unknown reference is the client's problem (a 400, like an undecodable
                    # video), and must never fall through to stock decoding (UnloadableRef).
                    return UnloadableRef(f"cannot load vidcache reference {uri[:100]}: [{e.kind}] {e}")
        return super()._load_single_item(data, modality, *args, **kwargs)

    def process_mm_data(self, input_text, images=None, videos=None, audios=None, **kwargs):
        bad = [v.message for v in (videos or []) if isinstance(v, UnloadableRef)]
        if bad:
            raise ValueError("; ".join(bad))
        refs = [v for v in (videos or []) if isinstance(v, VidcacheVideo)]
        if not refs:
            return super().process_mm_data(input_text, images=images, videos=videos, audios=audios, **kwargs)
        if len(refs) != len(videos):
            # One HF call takes one do_resize/do_sample_frames setting for all videos, and a
            # decoded video needs them on; the trainer could not reproduce such a request.
            raise ValueError("vidcache references cannot be mixed with other videos in one request; "
                             "prewarm every video into the cache, or send none as a reference")
        want = getattr(getattr(self._processor, "video_processor", None), "patch_size", None)
        for v in refs:
            if want is not None and FAMILIES[v.family].patch != want:
                raise ValueError(f"vidcache entry {v.key} was built for {v.family} (patch "
                                 f"{FAMILIES[v.family].patch}) but this server's model uses patch {want}; "
                                 "prewarm with VideoOptions(family=<this model's family>)")
        # Frames are final: the HF processor must neither sample nor resize, only
        # normalise and patchify; the metadata carries the original timeline.
        kwargs["video_metadata"] = [v.metadata for v in refs]
        kwargs["do_sample_frames"] = False
        config = {k: v for k, v in self.video_config.items() if k not in PREPROCESS_KEYS}
        config["do_resize"] = False
        if self._vidcache_pass_config:        # SGLang >= 0.5.2x takes the HF call's video config as an argument
            kwargs["processor_video_config"] = config
        token = _CALL_VIDEO_CONFIG.set(config)
        try:
            ret = super().process_mm_data(input_text, images=images, videos=[v.frames for v in refs],
                                          audios=audios, **kwargs)
        finally:
            _CALL_VIDEO_CONFIG.reset(token)
        enforce_layout(self._processor, refs, ret)
        rows = embedding_rows(refs, ret, images, lambda: decoder_width(self.hf_config))
        check_attestations(refs, ret, rows)
        return ret if rows is None else serve_embeddings(ret, rows)


def _qwen_vl_bases() -> list[type]:
    """Every SGLang processor class that serves a Qwen-VL architecture, defined in a Qwen-VL processor
    module of this SGLang (``qwen_vl.py``; a separate Qwen3-VL module too, if upstream adds one)."""
    out = []
    for name in qwen_vl_processor_modules() or ["sglang.srt.multimodal.processors.qwen_vl"]:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:          # a module for another model family may need what is not installed
            logger.warning("vidcache: cannot import %s: %s", name, e)
            continue
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if (cls.__module__ == name and issubclass(cls, BaseMultimodalProcessor)
                    and any(a.__name__.startswith("Qwen") and "VL" in a.__name__ for a in getattr(cls, "models", []))):
                out.append(cls)
    return out


def plugin_classes() -> dict[str, type]:
    """One plugin class per SGLang Qwen-VL processor class, taking over all of its architectures
    (``import_processors`` matches architectures by class name)."""
    out = {}
    for base in _qwen_vl_bases():
        name = "VidcacheQwenVLProcessor" if base.__name__ == "QwenVLImageProcessor" else "Vidcache" + base.__name__
        ns = {"models": list(base.models), "__module__": __name__, "__doc__": f"vidcache's plugin over {base.__name__}",
              "_vidcache_pass_config": "processor_video_config" in inspect.signature(base.process_mm_data).parameters}
        out[name] = type(name, (VidcachePluginMixin, base), ns)
    if "VidcacheQwenVLProcessor" not in out:
        raise ImportError(f"SGLang {SGLANG_VERSION} has no QwenVLImageProcessor: vidcache's plugin cannot serve it")
    return out


# import_processors registers every class defined in this module: one per SGLang Qwen-VL processor class.
globals().update(plugin_classes())
