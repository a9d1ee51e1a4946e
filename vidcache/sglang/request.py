"""``prepare``: everything a rollout client sends SGLang for one prompt, and the divergence guard."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import torch

from ..attest import attest as attest_tensors
from ..errors import OptionsError, ParityError
from ..positions import mm_token_type_ids
from ..processing import model_tensors, processor_kwargs, request_layout, to_layout
from ..rollout.embeddings import Tower, check_grid, decoder_rows, embeddings_digest, records_for
from ..rollout.prompt import image_prompt, video_prompt
from ..serving import URL_EXPIRY_S
from ..token_layout import layout_difference
from .transport import video_uri

# The plugin's rejection of a request whose tensors differ from the trainer's (SGLang answers 400 with it).
ATTESTATION_MARK = "vidcache attestation failed"
# ... which ends with what the server computes that no endpoint reports: ``[vidcache-server key=value ...]``.
SERVER_MARK = "vidcache-server"


def parse_server_facts(message: str) -> dict[str, str] | None:
    """The ``key=value`` facts a plugin put into a refusal (``plugin.qwen_vl.server_facts``); None: an older plugin
    that reports none.  ``-`` stands for unset."""
    start = message.rfind("[" + SERVER_MARK + " ")
    end = message.find("]", start)
    if start < 0 or end < 0:
        return None
    pairs = (p.partition("=") for p in message[start + len(SERVER_MARK) + 2:end].split())
    return {k: (None if v == "-" else v) for k, _, v in pairs if k}


def check_prompt_ids(expected_ids: list[int], response: dict) -> None:
    """The divergence guard: SGLang's view of the prompt must equal ``expected_ids``.

    ``response`` is SGLang's ``/generate`` response or its ``meta_info``.  SGLang 0.5.23 returns
    ``prompt_token_ids`` at the top level (send ``return_prompt_token_ids: true``); without them
    only ``meta_info.prompt_tokens`` is compared.  An error response that carries the plugin's
    attestation failure raises ``ParityError`` with the plugin's message.

    What this covers: the expanded ids (every video's token count, and Qwen3-VL's timestamp text)
    everywhere; in plugin mode the plugin also compared each video's ``pixel_values_videos``,
    ``video_grid_thw`` and ``second_per_grid_ts`` with the trainer's before answering (attestation), so a
    200 from an attesting plugin covers the pixels and the M-RoPE inputs too.  In stock mode nothing checks
    the pixels or Qwen2.5-VL's ``second_per_grid_ts`` per request (see docs/sglang.md).
    """
    err = response.get("error") if isinstance(response, dict) else None
    if err is not None:
        msg = err.get("message", "") if isinstance(err, dict) else str(err)
        if ATTESTATION_MARK in msg:
            raise ParityError(f"SGLang's processor output differs from the trainer's: {msg}")
        raise ParityError(f"SGLang refused the request: {msg[:500]}")
    meta = dict(response.get("meta_info") or {}) if "meta_info" in response else dict(response)
    if "prompt_token_ids" in response and "prompt_token_ids" not in meta:
        meta["prompt_token_ids"] = response["prompt_token_ids"]
    ids = meta.get("prompt_token_ids")
    if ids is not None:
        ids = list(ids[0] if ids and isinstance(ids[0], list) else ids)
        if ids != list(expected_ids):
            first = next((i for i, (a, b) in enumerate(zip(ids, expected_ids)) if a != b),
                         min(len(ids), len(expected_ids)))
            layout = layout_difference(expected_ids, ids)
            cause = (f"{layout}. Fix: plugin mode (the plugin expands in the request's layout), or give the trainer "
                     "the server's layout (token_layout= / $VIDCACHE_TOKEN_LAYOUT; `vidcache check-server` names it)"
                     if layout else "Check that the server runs with `vidcache sglang-config` for this mode")
            raise ParityError(f"SGLang expanded the prompt differently from the trainer: {len(ids)} vs "
                              f"{len(expected_ids)} ids, first difference at position {first}. {cause}.")
    n = meta.get("prompt_tokens")
    if n is not None and n != len(expected_ids):
        raise ParityError(f"SGLang counted {n} prompt tokens, the trainer has {len(expected_ids)}. "
                          "The server's video processing differs from the cache "
                          "(run SGLang with the flags from `vidcache sglang-config`).")
    if ids is None and n is None:
        raise ParityError("meta_info has neither prompt_token_ids nor prompt_tokens; cannot check divergence")


@dataclass
class PreparedRequest:
    """Everything a rollout client needs for one prompt; built from the cache, without decoding."""
    compact_ids: list[int]           # for SGLang: one placeholder run per video
    expanded_ids: list[int]          # for training: the processor's expansion
    video_data: list[str]            # frozen-frames URIs or plugin references, one per video
    train_inputs: dict[str, torch.Tensor]
    mode: str
    extra: dict = field(default_factory=dict)
    token_layout: str | None = None  # the layout expanded_ids are in (vidcache.token_layout); None: no video

    def check(self, response: dict) -> None:
        """Divergence guard (``check_prompt_ids``) against this request's expanded ids."""
        check_prompt_ids(self.expanded_ids, response)


def prompt_text(processor, prompt, n_videos: int, n_images: int = 0) -> str:
    """The text ``prepare`` tokenizes: a message list (Miles' and the OpenAI chat form, video and image items
    included) rendered by the processor's chat template, as SGLang's chat endpoint and Miles' data source do;
    then a row's own ``<image>`` / ``<video>`` markers replaced by the model's placeholders."""
    if isinstance(prompt, (list, tuple)):
        if not (getattr(processor, "chat_template", None) or getattr(processor.tokenizer, "chat_template", None)):
            raise ValueError("prompt is a message list, and this processor has no chat template to render it: load "
                             "the checkpoint's processor (AutoProcessor.from_pretrained), set processor.chat_template, "
                             "or pass the text the template gives (one <|vision_start|><|video_pad|><|vision_end|> "
                             "per video)")
        prompt = processor.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    elif not isinstance(prompt, str):
        raise TypeError(f"prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    return video_prompt(image_prompt(prompt, n_images), n_videos)


def _keys_of(ahead) -> list[str]:
    """Keys of the entries named ahead (keys as given; handles resolved, never built: one not cached is left out)."""
    from ..errors import NotCachedError
    out = []
    for a in ahead or []:
        try:
            out.append(a if isinstance(a, str) else a.resolve(build=False))
        except NotCachedError:
            pass
    return out


@functools.lru_cache(maxsize=8)
def _load_checkpoint_processor(path: str, mtime: float):
    from transformers import AutoProcessor
    return AutoProcessor.from_pretrained(path)


def checkpoint_processor(path):
    """The processor of a checkpoint directory, once its video processing is one vidcache vouches for
    (``families.derive``: an unknown model type or a processor unlike its model type's is refused)."""
    from ..families import derive
    path = os.path.abspath(os.fspath(path))
    derive(path)
    return _load_checkpoint_processor(path, os.path.getmtime(path))


def prepare(processor, prompt: str | list[dict], handles, mode: str = "plugin", transport: str | None = None,
            base_url: str | None = None, frozen_format: str | None = None,
            url_expires_s: float = URL_EXPIRY_S, attest: bool | str = True,
            token_layout: str | None = None, images=None, ahead=None, embeddings=None,
            tower=None) -> PreparedRequest:
    """Build compact ids, expanded ids, video URIs and train tensors for ``prompt``.  ``processor``: an HF
    processor, or a checkpoint directory (``checkpoint_processor``: its family derived and checked first).

    ``prompt`` is the text with one ``<|vision_start|><|video_pad|><|vision_end|>`` per handle, in order
    (the chat template applied, as SGLang's chat endpoint would), a dataset row's prompt with one ``<video>``
    per handle and one ``<image>`` per image (replaced in order), or a list of chat messages, which the
    processor's chat template renders first (``prompt_text``).  ``transport``: see ``vidcache.sglang.transport`` (default: the shared
    tier's URLs when the cache has one).  ``attest`` (plugin mode): put into each reference a digest
    of this video's train tensors, which the plugin checks against its own processor output (on by
    default; ``"values"`` also sends small videos' rows, so a mismatch reports the largest difference).
    ``token_layout``: the layout of the expanded ids (``processing.request_layout``: by default the model's own in
    plugin mode, which each reference records and the plugin expands in; in stock mode the processor's own).
    ``images``: the prompt's images (one ``<|vision_start|><|image_pad|><|vision_end|>`` each), exactly as the
    rollout client sends them to SGLang in ``image_data`` (Miles: the PIL images of its own image path).  They
    go through the processor's own image path with its own settings: the cached-frames settings
    (no resize, no sampling) are given to its video processor only.  The train tensors then hold
    ``pixel_values`` / ``image_grid_thw`` too, and the ids both expansions.
    ``ahead`` (plugin mode): the entries the client will ask for next (handles or keys, e.g. its next batch's),
    named in the first reference; the server's node pulls them into its local tier in the background
    (``vidcache.readahead.pull_soon``), so its next requests' first reads are local.
    ``embeddings`` (plugin mode): serve the videos' precomputed vision embeddings instead of running SGLang's tower:
    the records (one ``VisionEmbeddings`` per handle) or a ``lookup(EmbeddingKey)`` with ``tower``
    (``vidcache.rollout.embeddings``).  Each reference then names its record's key, the plugin reads the record
    through the server's own lookup and hands SGLang a precomputed-embedding item; the attestation adds the rows'
    digest.  The records are in ``extra["embeddings"]``: the trainer feeds the decoder the same ones.
    """
    handles = list(handles)
    if embeddings is not None and mode != "plugin":
        raise OptionsError("precomputed embeddings reach SGLang only in plugin mode: /generate takes JSON, and only "
                           "vidcache's plugin can hand SGLang a precomputed-embedding item (from the server's lookup)")
    if isinstance(processor, (str, os.PathLike)):
        processor = checkpoint_processor(processor)
    images = list(images or [])
    prompt = prompt_text(processor, prompt, len(handles), len(images))
    tok = processor.tokenizer
    compact = tok(prompt, add_special_tokens=False)["input_ids"]
    if handles:
        videos = [h.frames() for h in handles]      # builds a lazy handle's entry first, if it must
        kw = processor_kwargs(processor, [h.manifest for h in handles], mode)
        if images:
            # do_resize=False flat would reach the image processor as well (both take it) and skip the resize
            # SGLang's HF call does for images: scope the cached-frames settings to the videos.
            kw = {"return_tensors": kw.pop("return_tensors"), "videos_kwargs": kw}
        out = processor(text=[prompt], videos=videos, **({"images": images} if images else {}), **kw)
        tensors = model_tensors(out)
    elif images:
        out = processor(text=[prompt], images=images, return_tensors="pt")
        tensors = {}
    else:
        out = tok([prompt], add_special_tokens=False, return_tensors="pt")
        tensors = {}
    expanded = out["input_ids"][0].tolist()
    layout = None
    if handles:
        manifests = [h.manifest for h in handles]
        layout = request_layout(processor, manifests[0].family, mode, token_layout)
        expanded = to_layout(processor, expanded, manifests, mode, layout)
    records = (attest_tensors(tensors, values=attest == "values") if handles and attest and mode == "plugin"
               else [None] * len(handles))     # (video tensors only: the image ones are added below)
    for i, rec in enumerate(records):
        if rec is not None:
            # Where the trainer put this video: a record binds its tensors to the key and to the position, so
            # references reordered on the way (same shapes) are refused, not served to the wrong placeholder.
            rec["position"] = [i, len(records)]
    towers = [None] * len(handles)
    extra = {}
    if embeddings is not None and handles:
        keys = [h.resolve() for h in handles]
        recs = records_for(keys, embeddings, tower)
        family = handles[0].manifest.family
        for i, e in enumerate(recs):
            check_grid(e, tensors["video_grid_thw"][i].tolist(), family)
            if records[i] is not None:
                records[i]["embeddings"] = embeddings_digest(decoder_rows(e))
            towers[i] = Tower.of(e.key).as_dict()
        extra["embeddings"] = recs
    if images:
        tensors = {**tensors, "pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    if handles or images:
        # The prompt's, as the HF processor returns it: transformers 5.2x's Qwen-VL models compute M-RoPE only when
        # given them (or position_ids).  A trainer scoring prompt + response extends it (mm_token_type_ids(ids)).
        tensors["mm_token_type_ids"] = mm_token_type_ids(processor, expanded)
    hint = _keys_of(ahead) if mode == "plugin" else []
    uris = [video_uri(h, mode, transport, base_url, frozen_format, url_expires_s, rec, layout, hint if i == 0 else None,
                      towers[i]) for i, (h, rec) in enumerate(zip(handles, records))]
    return PreparedRequest(list(compact), expanded, uris, tensors, mode, extra, token_layout=layout)
