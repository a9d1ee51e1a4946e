"""Requests for vLLM built from the cache: the counterpart of ``vidcache.prepare`` (SGLang).

Two shapes, one source of truth (the handles):

* ``prepare_vllm`` -> ``VllmRequest.prompt``: a ``TokensPrompt``-shaped dict for ``LLM.generate`` / ``AsyncLLM``
  (in-process engines: verl, NeMo-RL, OpenRLHF), carrying the cached uint8 frames themselves with the original
  video's metadata; no loader, no decode.
* ``chat_request``: an OpenAI ``/v1/chat/completions`` body whose videos are vidcache references, resolved inside
  the server by ``vidcache.vllm.loader``.

``multi_modal_uuids`` (token prompts only) is the entry's cache key.  vLLM's multimodal processor cache trusts a
uuid and never hashes the pixels behind it: a cached uuid with other frames comes back as the cached tensors
(shown on the real engine, tests/vllm_engine/test_real_offline.py).  In-process that is sound, since only the
trainer's code builds requests and a vidcache key names these exact frames.  A chat request carries NO ``uuid``:
on a server any client may send any uuid, and one that sent a vidcache key with other pixels would poison that key
for every later request (issue 41); without one, vLLM hashes the frames the loader returned.

Token layout (``vidcache.token_layout``).  vLLM 0.34.0 with transformers 5.10-5.22 (its pin is < 5.23) expands only
the bare ``<|video_pad|>`` of a Qwen3-VL prompt and keeps the prompt's own ``<|vision_start|>...<|vision_end|>``
around it (``_expands_only_video_token``): a chat-templated prompt comes out ``wrapped``.  For token prompts the
builder puts the ids in the request's layout (by default the model's own, ``collapsed``): it drops that outer pair
from the compact ids where vLLM would keep it, so vLLM expands straight into ``collapsed``.  A chat request cannot do
that (the server applies the chat template), so its ids are vLLM's ``wrapped``: give the trainer
``token_layout="wrapped"`` (``check-server --engine vllm`` names it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ParityError, TokenLayoutError
from ..families import FAMILIES
from ..processing import VIDEO_PLACEHOLDER, expanded_ids, request_layout, video_metadata
from ..rollout.prompt import video_prompt
from ..rollout.ref import ref_uri
from ..token_layout import layout_difference
from .config import MM_PROCESSOR_KWARGS


def vllm_metadata(manifest) -> dict:
    """The metadata vLLM's Qwen processors get with a cached video: the original video's timeline (plugin mode:
    source fps, the sampled frame indices, total frames) and ``do_sample_frames: False`` (the frames are final)."""
    meta = dict(video_metadata(manifest, "plugin"))
    meta["do_sample_frames"] = False
    return meta


def expands_bare_video_token(processor) -> bool:
    """vLLM 0.34's own test (qwen3_vl.py, ``_expands_only_video_token``): does vLLM replace only ``<|video_pad|>``
    (transformers >= 5.10, whose processors override ``replace_video_token``), keeping the outer pair?"""
    from transformers import ProcessorMixin
    own = getattr(type(processor), "replace_video_token", None)
    return own is not None and own is not getattr(ProcessorMixin, "replace_video_token", None)


def _unwrap(ids: list[int], pad: int, start: int, end: int) -> list[int]:
    """``ids`` without the ``start pad end`` triples' outer pair (each becomes a bare ``pad``)."""
    out, i = [], 0
    while i < len(ids):
        if ids[i] == start and ids[i + 1:i + 3] == [pad, end]:
            out.append(pad)
            i += 3
        else:
            out.append(ids[i])
            i += 1
    return out


@dataclass
class VllmRequest:
    """One prompt for vLLM, built from the cache without decoding (``prepare_vllm``)."""
    prompt: dict                      # TokensPrompt: prompt_token_ids, multi_modal_data, multi_modal_uuids,
                                      # mm_processor_kwargs
    expanded_ids: list[int]           # the trainer's ids; vLLM's RequestOutput.prompt_token_ids must equal them
    keys: list[str]
    token_layout: str | None = None
    extra: dict = field(default_factory=dict)

    def check(self, output) -> None:
        """The divergence guard: vLLM's view of the prompt (``RequestOutput.prompt_token_ids``, a dict with
        ``prompt_token_ids``, or the list) must equal ``expanded_ids``; raises ``ParityError`` naming the cause."""
        check_prompt_ids(self.expanded_ids, output)


def check_prompt_ids(expected: list[int], output) -> None:
    if isinstance(output, dict):
        ids = output.get("prompt_token_ids")
    elif isinstance(output, (list, tuple)):
        ids = output
    else:
        ids = getattr(output, "prompt_token_ids", None)
    if ids is None:
        raise ParityError("vLLM's output has no prompt_token_ids (chat requests: send return_token_ids: true)")
    ids, expected = list(ids), list(expected)
    if ids == expected:
        return
    first = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), min(len(ids), len(expected)))
    layout = layout_difference(expected, ids)
    cause = (f"{layout}. Fix: give the trainer vLLM's layout (token_layout=, $VIDCACHE_TOKEN_LAYOUT)" if layout else
             "vLLM's video processing differs from the cache (run it with vidcache.vllm.config.ENGINE_KWARGS and "
             "the request's mm_processor_kwargs)")
    raise ParityError(f"vLLM expanded the prompt differently from the trainer: {len(ids)} vs {len(expected)} ids, "
                      f"first difference at position {first}. {cause}.")


def embeds_item(processor, manifest, rec, tokens_per_second: float = 2.0) -> dict:
    """One video's ``multi_modal_data`` item for vLLM 0.34's precomputed path (the engine started with
    ``enable_mm_embeds=True``): ``video_embeds`` as its tower outputs them (``rollout.embeddings.decoder_rows``:
    Qwen3-VL's deepstack levels side by side) and ``video_grid_thw``; Qwen3-VL adds ``timestamps``, which its prompt replacement
    writes as each frame group's ``<t seconds>`` (vLLM ``model_executor/models/qwen3_vl.py:912-921``): the processor's
    own, from the original timeline, as the trainer's ids have them.

    Qwen2.5-VL: vLLM 0.34 drops ``second_per_grid_ts`` from an embeddings item (its data parser uses Qwen2-VL's field
    factory, ``qwen2_vl.py:761-796``, and ``MultiModalKwargsItems.from_hf_inputs`` skips fields it has no config for,
    ``multimodal/inputs.py:937``), and M-RoPE then takes 1.0 s per grid (``qwen2_5_vl.py:1356``).  An entry whose
    frame groups the trainer's value puts at other positions is refused (``OptionsError``), never served there
    (1.001 s, an NTSC source sampled at 2 fps, moves none of 14 groups; 2 s moves all but the first).
    ``tokens_per_second``: the checkpoint's ``vision_config.tokens_per_second`` (2 in released Qwen2.5-VL)."""
    import torch
    from transformers.video_utils import VideoMetadata

    from ..errors import OptionsError
    from ..rollout.embeddings import check_grid, decoder_rows
    grid = list(manifest.tokens.video_grid_thw)
    check_grid(rec, grid, manifest.family)
    item = {"video_embeds": decoder_rows(rec), "video_grid_thw": torch.tensor([grid])}
    meta = VideoMetadata(**video_metadata(manifest, "plugin"))
    tps = processor.video_processor.temporal_patch_size
    if FAMILIES[manifest.family].scaled_time:
        # vLLM's rule (float64 indices times seconds x tokens_per_second, floored) with the trainer's seconds and with
        # the 1.0 it uses for embeddings: refused only where a frame group's position would move
        spg = float(torch.tensor(tps / meta.sampled_fps, dtype=torch.float32))
        idx = torch.arange(grid[0], dtype=torch.float64)
        if not torch.equal((idx * (spg * tokens_per_second)).long(), (idx * tokens_per_second).long()):
            raise OptionsError(f"entry {manifest.key}: vLLM 0.34 positions Qwen2.5-VL video embeddings at 1 s per "
                               f"temporal patch (it drops second_per_grid_ts from an embeddings item); the trainer's "
                               f"{spg:g} s puts some of this video's {grid[0]} frame groups elsewhere: sample at {tps} "
                               "fps for this path, or send frames")
    elif FAMILIES[manifest.family].per_frame:
        item["timestamps"] = torch.tensor([processor._calculate_timestamps(list(meta.frames_indices), meta.fps, tps)],
                                          dtype=torch.float64)
    return item


def prepare_vllm(processor, prompt: str, handles, token_layout: str | None = None, embeddings=None,
                 tower=None, tokens_per_second: float = 2.0) -> VllmRequest:
    """The ``TokensPrompt`` for ``prompt`` (one ``<|vision_start|><|video_pad|><|vision_end|>`` or ``<video>`` per
    handle, in order; apply the chat template first) and the trainer's expanded ids, from the manifests and the
    cached frames.  ``processor``: the checkpoint's HF processor (it tokenises and gives the trainer's ids; vLLM
    in the same process uses the same transformers).  Train tensors: ``vidcache.train_inputs(processor, handles)``
    on the same handles.

    ``embeddings``: send the videos' precomputed vision embeddings instead of their frames (``embeds_item``; the engine
    needs ``enable_mm_embeds=True``): the records (one ``VisionEmbeddings`` per handle) or a ``lookup(EmbeddingKey)``
    with ``tower`` (``vidcache.rollout.embeddings``).  A record for another key is refused.  The records are in
    ``extra["embeddings"]``, for the trainer to feed its decoder the same ones.  One video per prompt: vLLM 0.34 takes
    an embeddings item per video, but several were not run here.
    """
    handles = list(handles)
    prompt = video_prompt(prompt, len(handles))
    tok = processor.tokenizer
    compact = list(tok(prompt, add_special_tokens=False)["input_ids"])
    if not handles:
        return VllmRequest({"prompt_token_ids": compact}, compact, [])
    manifests = [h.manifest for h in handles]
    family = manifests[0].family
    layout = request_layout(processor, family, "plugin", token_layout)
    expected = expanded_ids(processor, prompt, manifests, "plugin", layout)
    if FAMILIES[family].per_frame:         # one vision_start/vision_end pair per temporal group
        pad, start, end = (tok.convert_tokens_to_ids(t)
                           for t in ("<|video_pad|>", "<|vision_start|>", "<|vision_end|>"))
        bare = expands_bare_video_token(processor)
        if bare and layout == "collapsed":
            compact = _unwrap(compact, pad, start, end)
        elif not bare and layout == "wrapped":
            raise TokenLayoutError("this transformers' Qwen3-VL processor makes vLLM expand the whole "
                                   f"{VIDEO_PLACEHOLDER} (collapsed ids); vLLM cannot produce 'wrapped' ids with it")
    keys = [h.resolve() for h in handles]
    if embeddings is not None:
        from ..rollout.embeddings import records_for
        recs = records_for(keys, embeddings, tower)
        if len(recs) != 1:
            raise ValueError("vidcache sends vLLM precomputed embeddings for one video per prompt (not run with more)")
        # no uuid: vLLM's processor cache would then key these rows by the entry alone, not by the tower
        item = embeds_item(processor, manifests[0], recs[0], tokens_per_second)
        req = {"prompt_token_ids": compact, "multi_modal_data": {"video": item}}
        return VllmRequest(req, expected, keys, layout, {"embeddings": recs})
    frames = [h.frames() for h in handles]          # uint8 T x 3 x H x W: vLLM takes vidcache's layout as it is
    mm = {"video": [(f, vllm_metadata(m)) for f, m in zip(frames, manifests)]}
    req = {"prompt_token_ids": compact, "multi_modal_data": mm, "multi_modal_uuids": {"video": keys},
           "mm_processor_kwargs": dict(MM_PROCESSOR_KWARGS)}
    return VllmRequest(req, expected, keys, layout)


def chat_request(model: str, text: str, handles, max_tokens: int = 0) -> dict:
    """An OpenAI ``/v1/chat/completions`` body: one user message, the handles' references (their cache's identity
    and key, resolved inside the server by ``vidcache.vllm.loader``) then ``text``; no ``uuid`` (another client's
    uuid could name other pixels: the module's docstring); ``return_token_ids`` so the guard can compare
    ``prompt_token_ids``; the frames-are-final processor kwargs."""
    parts = []
    for h in handles:
        parts.append({"type": "video_url", "video_url": {"url": ref_uri(h.identity, h.resolve())}})
    parts.append({"type": "text", "text": text})
    return {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens,
            "temperature": 0, "return_token_ids": True, "mm_processor_kwargs": dict(MM_PROCESSOR_KWARGS)}


def chat_expected_ids(processor, text: str, handles, token_layout: str | None = None) -> list[int]:
    """The trainer's ids for ``chat_request(..., text, handles)``: the checkpoint's chat template on the same message
    (HF's ``{"type": "video"}`` parts), then ``expanded_ids``."""
    msg = [{"role": "user", "content": [{"type": "video"} for _ in handles] + [{"type": "text", "text": text}]}]
    prompt = processor.apply_chat_template(msg, tokenize=False, add_generation_prompt=True)
    return expanded_ids(processor, prompt, [h.manifest for h in handles], "plugin", token_layout)
