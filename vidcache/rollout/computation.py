"""The computation check, engine-neutral half: does the rollout engine compute what the trainer's model computes on
the same inputs?  (``vidcache check-computation``; ``check-server`` attests the inputs only.)

Each *canary* (text only; one image; a video of one temporal patch; a video of several, time-dominated; two videos;
a second turn) is built through vidcache (the node's cache, ``rollout.check.canary_clip``), sent by an engine's own
half (``vidcache.sglang.computation``, ``vidcache.vllm.computation``) with prompt and sample logprobs, and scored
against the trainer's model (transformers' class for the checkpoint, on ``train_inputs`` with M-RoPE positions by
the engine's rule): KL per token, argmax agreement, the first position where the two part.  A failure is attributed
where the canaries tell it apart: text fine but video not (the video path); one temporal patch fine but several not
(the vision tower's temporal attention: for Qwen2.5-VL rescored with transformers attending across the whole video,
as SGLang's own tower does); and rescored at the other position rule (the position rule).

The engine returns top-k logprobs or the full vocabulary; with top-k the KL is that of the two distributions
coarsened to the engine's k tokens plus "the rest" (a true KL, never above the full one: ``kl_per_token``).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import torch

from ..engines import ENGINES
from ..sglang_facts import vision_differs
from .check import Cause

# The pass thresholds, from measured floors (docs/benchmarks.md, "Computation check floors"): (device, dtype) ->
# (bound on the mean KL per token, the measurement it comes from).  The bound on any one token is MAX_FACTOR times it.
# CPU fp32: SGLang 0.5.23's and vLLM 0.32's CPU servers against transformers' SDPA, tiny checkpoints: mean ~1e-8
# nats/token, max ~1e-7; a computation defect gives ~1-5 nats/token.
FLOORS: dict[tuple[str, str], tuple[float, str]] = {
    ("cpu", "float32"): (1e-6, "CPU fp32 floor ~1e-8 nats/token (SGLang 0.5.23 / vLLM 0.32 CPU servers vs "
                               "transformers), bound 100x above it"),
    # transformers' sdpa vs eager in bf16: up to 7.7e-3 mean; bf16 vs fp32: up to 2.9e-2 (benchmarks/
    # computation_floors.py on the CPU).
    ("cpu", "bfloat16"): (1e-1, "CPU bf16 floor up to 2.9e-2 nats/token (transformers sdpa vs eager vs fp32, "
                                "benchmarks/computation_floors.py), bound ~3x above it"),
    # On an NVIDIA H100 (torch 2.11.0+cu130, transformers 5.17.0): sdpa vs eager in bf16 up to 9.1e-3 mean, bf16 vs
    # fp32 up to 2.6e-2; fp32 sdpa vs eager ~1e-8 (benchmarks/computation_floors.py --device cuda).
    ("cuda", "bfloat16"): (1e-1, "GPU bf16 floor up to 2.6e-2 nats/token (NVIDIA H100: transformers sdpa vs eager "
                                 "vs fp32, benchmarks/computation_floors.py --device cuda), bound ~4x above it"),
    ("cuda", "float32"): (1e-6, "GPU fp32 floor ~2e-8 nats/token (NVIDIA H100: transformers sdpa vs eager, "
                                "benchmarks/computation_floors.py --device cuda), bound 50x above it"),
}
MAX_FACTOR = 10
DEFAULT_TOP_K = 20            # vLLM's default --max-logprobs; a 151k vocabulary in full is ~10 MB per position
FULL_VOCAB_UP_TO = 4096       # a vocabulary this small is asked for in full (the tests' toy tokenizer: 263)
NEW_TOKENS = 4                # sampled (greedy) after each prompt: their logprobs are scored too


@dataclass(frozen=True)
class Threshold:
    mean: float
    source: str

    @property
    def max(self) -> float:
        return self.mean * MAX_FACTOR

    def line(self) -> str:
        return f"mean KL <= {self.mean:.0e}, any token <= {self.max:.0e} nats ({self.source})"


def threshold_for(device: str, dtype: str, given: float | None = None) -> Threshold:
    """The pass threshold: ``given`` (the operator's), else the measured floor's for (device, dtype)."""
    from ..errors import ConfigError
    if given is not None:
        if not given > 0:
            raise ConfigError(f"--threshold must be a positive KL in nats/token, got {given}")
        return Threshold(given, "given with --threshold")
    kind = "cuda" if str(device).startswith("cuda") else str(device)
    if (kind, dtype) not in FLOORS:
        known = ", ".join(f"{d} {t}" for d, t in FLOORS)
        raise ConfigError(f"no measured floor for {kind} {dtype} (measured: {known}); pass --threshold X (nats/token)")
    mean, src = FLOORS[kind, dtype]
    return Threshold(mean, src)


# --- the canaries ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Canary:
    name: str
    videos: tuple[int, ...] = ()      # frames per video, each sampled from the canary clip
    images: int = 0
    second_turn: bool = False

    def messages(self, video_part: dict | None = None, image_part: dict | None = None) -> list[dict]:
        """The canary's chat messages; ``video_part`` / ``image_part``: how a video / image is written (default HF's
        ``{"type": "video"}``, what a chat template renders into the model's placeholder)."""
        parts = ([video_part or {"type": "video"} for _ in self.videos] + [image_part or {"type": "image"}] * self.images
                 + [{"type": "text", "text": "Describe what you see."}])
        msgs = [{"role": "user", "content": parts}]
        if self.second_turn:
            msgs += [{"role": "assistant", "content": [{"type": "text", "text": "Coloured noise, changing."}]},
                     {"role": "user", "content": [{"type": "text", "text": "And in the last frame?"}]}]
        return msgs

    def text(self) -> str:
        """The canary as a rendered Qwen chat prompt with ``<video>`` / ``<image>`` markers (for a token endpoint,
        SGLang's ``/generate``, where the client renders the chat; ``prepare`` puts in the placeholders)."""
        turn = "<|im_start|>{}\n{}<|im_end|>\n"
        out = turn.format("user", "<video>" * len(self.videos) + "<image>" * self.images + "Describe what you see.")
        if self.second_turn:
            out += turn.format("assistant", "Coloured noise, changing.") + turn.format("user", "And in the last frame?")
        return out + "<|im_start|>assistant\n"

    @property
    def patches(self) -> int:
        return max((n // 2 for n in self.videos), default=0)     # temporal patch size 2 (every Qwen-VL family)


ONE_PATCH, SEVERAL = 2, 8           # frames: one temporal patch; four, from an 8 s clip (time dominates the grid)
CANARIES = (Canary("text"), Canary("image", images=1), Canary("video 1 patch", (ONE_PATCH,)),
            Canary("video 4 patches", (SEVERAL,)), Canary("two videos", (SEVERAL, ONE_PATCH)),
            Canary("second turn", (SEVERAL,), second_turn=True))
CLIP = ("vidcache-computation", 16, 2)     # the clip (name, frames, fps): 8 s, so sampled frames are 1 s apart


def canary_handle(options, cache=None):
    """A canary video: ``CLIP`` cached with ``options`` through this node's configuration."""
    from .check import canary_clip
    return canary_clip(*CLIP, options, cache)


def canary_image():
    """The image canary: 224 x 224 noise (a multiple of every family's 28 / 32 grid: no engine resizes it)."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(20261202)
    return Image.fromarray(rng.integers(0, 256, (224, 224, 3), dtype=np.uint8), "RGB")


def image_data_uri(image) -> str:
    import base64
    import io
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


# --- what an engine returned, and the trainer's side ---------------------------------------------------------------
class Refused(Exception):
    """The engine refused a canary (its limits, e.g. vLLM's --limit-mm-per-prompt): reported, not scored."""


@dataclass
class Sample:
    """One canary as the engine ran it: ``ids`` (its prompt ids, checked equal to the trainer's, then its output
    ids), ``rows`` (``len(ids) - 1`` x vocab float64 logprobs, row i predicting token i + 1; NaN where the engine
    returned none) and the trainer's tensors (``train_inputs``, images' too)."""
    ids: list[int]
    rows: torch.Tensor
    tensors: dict
    prompt_len: int


def dense_rows(rows, vocab: int) -> torch.Tensor:
    """Per-position ``[(token id, logprob), ...]`` lists as an ``N x vocab`` float64 tensor (NaN where absent)."""
    out = torch.full((len(rows), vocab), float("nan"), dtype=torch.float64)
    for i, row in enumerate(rows):
        for tok, lp in row:
            if 0 <= tok < vocab:
                out[i, tok] = lp
    return out


def load_trainer_model(path: str, device: str = "cpu", dtype: str = "float32", attn: str = "sdpa"):
    """The checkpoint as the trainer loads it: transformers' class for it, ``dtype``, ``attn``, on ``device``."""
    from transformers import AutoModelForImageTextToText
    return AutoModelForImageTextToText.from_pretrained(path, dtype=getattr(torch, dtype),
                                                       attn_implementation=attn).to(device).eval()


def trainer_logprobs(model, ids, tensors: dict, position_ids=None) -> torch.Tensor:
    """transformers' forward on ``ids`` with the trainer's tensors (videos' and images'): fp32 log-softmax,
    ``len(ids) x vocab`` (row i predicts token i + 1), on the CPU.  ``position_ids``: ``[3, len(ids)]`` or
    ``[3, 1, len(ids)]`` M-RoPE positions (None: the model computes its own)."""
    p = next(model.parameters())
    dev, dtype = p.device, p.dtype
    with torch.no_grad():
        input_ids = torch.tensor([list(ids)], device=dev)
        kw = {}
        for pixels, grid in (("pixel_values_videos", "video_grid_thw"), ("pixel_values", "image_grid_thw")):
            if tensors.get(pixels) is not None:
                kw[pixels] = tensors[pixels].to(dev, dtype)
                kw[grid] = torch.as_tensor(tensors[grid]).reshape(-1, 3).to(dev)
        if tensors.get("second_per_grid_ts") is not None:
            kw["second_per_grid_ts"] = torch.as_tensor(tensors["second_per_grid_ts"],
                                                       dtype=torch.float32).reshape(-1).to(dev)
        if position_ids is not None:
            pos = torch.as_tensor(position_ids)
            kw["position_ids"] = (pos[:, None, :] if pos.dim() == 2 else pos).to(dev)
        out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False, **kw)
    return torch.log_softmax(out.logits[0].to(torch.float32), dim=-1).cpu()


@contextlib.contextmanager
def across_video_attention():
    """transformers' Qwen2.5-VL vision tower made to attend across each whole video (its full-attention blocks over
    every temporal patch at once), as SGLang 0.5.23's own Qwen2.5-VL tower does; the model as shipped attends per
    temporal patch.  For attribution only."""
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl as mq
    orig = mq.get_vision_attention_seqlens
    mq.get_vision_attention_seqlens = (lambda grid_thw, config, kwargs=None:
                                       orig(grid_thw, config, merge_temporal=True, kwargs=kwargs))
    try:
        yield
    finally:
        mq.get_vision_attention_seqlens = orig


# --- scoring --------------------------------------------------------------------------------------------------------
def kl_per_token(engine: torch.Tensor, trainer: torch.Tensor) -> torch.Tensor:
    """KL(engine || trainer) per row, nats.  Where the engine returned only some tokens (top-k: NaN elsewhere), the KL
    of both distributions coarsened to those tokens plus one "rest" outcome: a true KL, at most the full one."""
    have = ~torch.isnan(engine)
    lp = torch.where(have, engine, 0.0)
    lq = torch.where(have, trainer.double(), 0.0)
    p = torch.where(have, lp.exp(), 0.0)
    kl = (p * (lp - lq)).sum(-1)
    partial = ~have.all(-1)
    if partial.any():
        rest_p = (1 - p.sum(-1)).clamp(min=0.0)
        rest_q = (1 - torch.where(have, lq.exp(), 0.0).sum(-1)).clamp(min=1e-300)
        rest = torch.where(rest_p > 0, rest_p * (rest_p.clamp(min=1e-300).log() - rest_q.log()), 0.0)
        kl = kl + torch.where(partial, rest, 0.0)
    return kl


@dataclass
class Score:
    mean_kl: float
    max_kl: float
    argmax_agree: float          # share of positions whose most likely token is the same
    first_part: int | None       # the first token position whose KL is above the per-token bound (None: none)
    part_kind: str               # what that token is: text / video / image
    tokens: int

    def passes(self, t: Threshold) -> bool:
        return self.mean_kl <= t.mean and self.max_kl <= t.max


def score(sample: Sample, trainer: torch.Tensor, t: Threshold, kinds: list[str]) -> Score:
    eng, hf = sample.rows, trainer[: len(sample.ids) - 1]
    if hf.shape != eng.shape:
        raise ValueError(f"the engine returned {tuple(eng.shape)} logprobs, the trainer {tuple(hf.shape)}")
    kl = kl_per_token(eng, hf)
    agree = (torch.nan_to_num(eng, nan=-math.inf).argmax(-1) == hf.argmax(-1)).double().mean()
    over = (kl > t.max).nonzero()
    first = int(over[0, 0]) + 1 if len(over) else None        # row i scores token i + 1
    return Score(float(kl.mean()), float(kl.max()), float(agree), first,
                 kinds[first] if first is not None else "", len(kl))


def token_kinds(processor, ids) -> list[str]:
    from ..positions import token_ids
    tid = token_ids(processor)
    names = {tid["video_token_id"]: "video", tid["image_token_id"]: "image"}
    return [names.get(int(i), "text") for i in ids]


# --- the check ------------------------------------------------------------------------------------------------------
@dataclass
class Result:
    canary: Canary
    score: Score | None = None
    refused: str | None = None
    sample: Sample | None = None
    positions: torch.Tensor | None = None


@dataclass
class ComputationCheck:
    url: str
    engine: str                      # SGLang | vLLM
    family: str
    mode: str
    trainer: str                     # what scored the canaries (class, device, dtype, positions rule)
    logprobs: str                    # full vocabulary (N) | top-K
    threshold: Threshold
    results: list[Result] = field(default_factory=list)
    causes: list[Cause] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.causes

    def lines(self) -> list[str]:
        head = (f"{self.url}: {self.engine}, {self.family}, {self.mode} mode; trainer: {self.trainer}; logprobs: "
                f"{self.logprobs}; threshold: {self.threshold.line()}")
        out = [head]
        for r in self.results:
            name = f"  {r.canary.name:16s}"
            if r.score is None:
                out.append(f"{name} not run: {r.refused}")
                continue
            s = r.score
            part = f", parts at token {s.first_part} ({s.part_kind})" if s.first_part is not None else ""
            out.append(f"{name} mean KL {s.mean_kl:.2e}  max KL {s.max_kl:.2e}  argmax agreement "
                       f"{100 * s.argmax_agree:5.1f}%  ({s.tokens} tokens{part})"
                       + ("" if s.passes(self.threshold) else "  ABOVE THE THRESHOLD"))
        out += [f"  note: {n}" for n in self.notes]
        scored = sum(r.score is not None for r in self.results)
        if self.ok:
            out.append(f"OK   computation equal on {scored} canaries (the engine's logprobs are the trainer's model's "
                       "within the threshold)")
        else:
            out += [c.line() for c in self.causes]
        return out


def run_check(res: ComputationCheck, send, model, processor, config, engine_rule: str, trainer_rule: str,
              canaries=CANARIES) -> ComputationCheck:
    """Send every canary (``send(canary) -> Sample``, or ``Refused``), score it against ``model`` at ``trainer_rule``'s
    positions, then attribute the failures (``attribute``)."""
    from ..positions import positions_from_tensors
    for c in canaries:
        try:
            sample = send(c)
        except Refused as e:
            res.results.append(Result(c, refused=str(e)))
            continue
        pos = positions_from_tensors(processor, sample.ids, sample.tensors, res.family, trainer_rule, config=config)
        hf = trainer_logprobs(model, sample.ids, sample.tensors, pos)
        res.results.append(Result(c, score(sample, hf, res.threshold, token_kinds(processor, sample.ids)), None,
                                  sample, pos))
    if not any(r.score for r in res.results):
        res.causes.append(Cause("computation", "the engine refused every canary: nothing was compared"))
        return res
    attribute(res, model, processor, config, engine_rule, trainer_rule)
    return res


def _rescored(res: ComputationCheck, r: Result, model, processor, positions=None) -> Score:
    s = r.sample
    hf = trainer_logprobs(model, s.ids, s.tensors, r.positions if positions is None else positions)
    return score(s, hf, res.threshold, token_kinds(processor, s.ids))


def attribute(res: ComputationCheck, model, processor, config, engine_rule: str, trainer_rule: str) -> None:
    """Name what differs, from which canaries fail and what rescoring them brings back to the floor."""
    from ..positions import positions_from_tensors
    t = res.threshold
    ran = {r.canary.name: r for r in res.results if r.score is not None}
    bad = [r for r in ran.values() if not r.score.passes(t)]
    if not bad:
        return
    names = ", ".join(r.canary.name for r in bad)
    text = ran.get("text")
    if text is not None and not text.score.passes(t):
        res.causes.append(Cause("computation", f"even the text-only canary differs (mean KL {text.score.mean_kl:.2e}):"
                                " the language model's computation (is the server running this checkpoint, in this "
                                "dtype? its attention kernels?); failing canaries: " + names))
        return
    explained: set[str] = set()
    # Positions: the same canary at the other rule (the engine's if the trainer used another, else transformers').
    other = engine_rule if trainer_rule != engine_rule else "transformers"
    back = []
    for r in bad:
        if not r.canary.videos and not r.canary.images:
            continue
        pos = positions_from_tensors(processor, r.sample.ids, r.sample.tensors, res.family, other, config=config)
        if torch.equal(pos, r.positions):
            continue
        s = _rescored(res, r, model, processor, pos)
        res.notes.append(f"{r.canary.name} at {other}'s M-RoPE positions: mean KL {s.mean_kl:.2e}")
        if s.passes(t):
            back.append(r.canary.name)
    if back:
        explained.update(back)
        fix = ("give the trainer the engine's positions: position_ids=vidcache.rope_positions(processor, ids, "
               f"request=req, engine='{engine_rule}')" if trainer_rule != engine_rule else
               "the engine computes transformers' own rule: run it with `vidcache sglang-config` / `vllm-config`")
        res.causes.append(Cause("positions", f"the position rule: {', '.join(back)} differ at the trainer's "
                                f"'{trainer_rule}' M-RoPE positions and are at the floor at '{other}'s; {fix}"))
    # The vision tower's temporal attention: one temporal patch fine, several not.
    one = ran.get("video 1 patch")
    several = [r for r in bad if r.canary.patches > 1 and r.canary.name not in explained]
    if several and one is not None and one.score.passes(t):
        across = ""
        if vision_differs(res.family):      # a family whose tower one engine computes across the video
            with across_video_attention():
                s = _rescored(res, several[0], model, processor)
            res.notes.append(f"{several[0].canary.name} against transformers attending across the whole video: "
                             f"mean KL {s.mean_kl:.2e}")
            if s.passes(t):
                across = (" It matches transformers made to attend across each whole video, as SGLang's own "
                          "Qwen2.5-VL tower does: serve with `vidcache sglang-config` (--vision package or "
                          "transformers; SGLANG_EXTERNAL_MODEL_PACKAGE=vidcache.sglang.models).")
        explained.update(r.canary.name for r in several)
        res.causes.append(Cause("vision", "the vision tower's temporal attention: a video of one temporal patch is at "
                                "the floor, videos of several are not (" + ", ".join(r.canary.name for r in several)
                                + ")." + across))
    rest = [r for r in bad if r.canary.name not in explained]
    if rest:
        what = sorted({"image" if r.canary.images else "video" for r in rest})
        res.causes.append(Cause("computation", f"text-only is at the floor, {', '.join(r.canary.name for r in rest)} "
                                f"not: the {' and '.join(what)} path (the pixels' processing or the vision tower)"))


def vocab_size(model) -> int:
    """The width of the model's logits (a checkpoint may pad its vocabulary past its tokenizer's)."""
    return int(model.get_output_embeddings().weight.shape[0])


def top_k_for(vocab: int, top_k: int | None, cap: int | None = None) -> tuple[int, str]:
    """How many logprobs to ask per position, and how the report says it: the full vocabulary when it is small
    (``FULL_VOCAB_UP_TO``) or asked for, else ``DEFAULT_TOP_K``; never above the engine's ``cap``."""
    k = top_k if top_k is not None else (vocab if vocab <= FULL_VOCAB_UP_TO else DEFAULT_TOP_K)
    k = min(k, vocab, cap or vocab)
    return k, (f"full vocabulary ({vocab})" if k >= vocab else f"top-{k} of {vocab} (KL over those {k} tokens + the "
               "rest)")


def check(url: str, checkpoint: str, engine: str, mode: str, make_send, *, device: str = "cpu",
          dtype: str = "float32", top_k: int | None = None, top_k_cap: int | None = None,
          threshold: float | None = None, trainer_positions: str | None = None, family: str | None = None,
          model=None, canaries=CANARIES) -> ComputationCheck:
    """The whole check against the ``engine`` ("sglang" / "vllm") server at ``url`` serving ``checkpoint``:
    ``make_send(processor, family, vocab, k) -> send`` is the engine's half.  ``trainer_positions``: the M-RoPE rule
    the trainer side scores at (default the engine's, as ``rope_positions`` gives it; "transformers": a trainer
    without it).  ``model``: the trainer's model already loaded (else ``load_trainer_model``)."""
    from transformers import AutoConfig

    from ..errors import ConfigError
    from ..mrope import RULES
    from .check import load_processor
    from ..families import derive
    t = threshold_for(device, dtype, threshold)
    rule = trainer_positions or engine
    if rule not in RULES:
        raise ConfigError(f"trainer positions must be one of {', '.join(RULES)}, got {rule!r}")
    fam = derive(checkpoint, family).family
    processor = load_processor(checkpoint)
    config = AutoConfig.from_pretrained(checkpoint)
    model = model if model is not None else load_trainer_model(checkpoint, device, dtype)
    k, said = top_k_for(vocab_size(model), top_k, top_k_cap)
    p = next(model.parameters())
    trainer = (f"transformers {type(model).__name__} on {p.device} {str(p.dtype).removeprefix('torch.')}, "
               f"{rule} positions")
    res = ComputationCheck(url, ENGINES[engine].display if engine in ENGINES else engine, fam, mode, trainer, said, t)
    return run_check(res, make_send(processor, fam, vocab_size(model), k), model, processor, config, engine, rule,
                     canaries)
