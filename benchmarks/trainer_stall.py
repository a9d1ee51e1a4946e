"""Trainer stall on a fresh node, with and without read-ahead (issue 31), in one run.

    .venv/bin/python benchmarks/trainer_stall.py [--clips 128] [--batch 2] [--depth 8] [--step-factor 1.5] [--thread-moto]
        [--step sleep|busy] [--head-start S] [--in-process]

A node A prewarms ``--clips`` clips (the camera-like 1280x720 H.264 clips of ``camera_clips.py`` and the
generated test clips, Qwen2.5-VL at 2 fps) into an S3 tier: moto on loopback in a process of its own, as a
real endpoint is.  Then a trainer loop on a *fresh* node directory consumes one batch of ``--batch`` samples per
step: it reads each sample's frames (``h.frames()``, what ``train_inputs`` reads), then "trains" for ``step_s``
(a sleep: the GPU's time, when the host's cores are free).  The wait is the time from the start of a step until
its batch's frames are in hand.

``step_s`` is set where the stall without read-ahead is large: ``--step-factor`` times the mean time a batch's
first reads take on a fresh node (measured first, on a node of its own), so that without read-ahead about
1 / (1 + factor) of the wall time is spent waiting (40% at 1.5).  Both loops then run, each on a fresh node:

* without: every first read pulls from S3 (download + decode of the compact object) when the trainer asks;
* with: ``vidcache.read_ahead(samples, depth=--depth)`` pulls the next samples' entries in the background.

Prints, per loop, the wait per step (p50 / p99) and the fraction of the wall time spent waiting, over every step
(the headline: the first step is counted) and over the steps after the first (the steady state).  Read-ahead is
built ``--head-start`` seconds before the first step (default 2 s), as a trainer builds its data
source before it loads its model (Miles' data source starts reading ahead when it is built, before the first
rollout; ``LazyVideoDataset.read_ahead`` when it is called); that setup is not in the wall time.  The last line
reads ``stall: X% with read-ahead, Y% without``.  The row "the floor" is what read-ahead cannot remove: the same
batches read on a node that holds them (each read copies the frames out of LMDB's map and checks their digest),
as a share of the run with read-ahead.
Never asserts on time.

``--step busy`` (issue 50): the step is a pure-Python loop holding the GIL for ``step_s`` (the worst case for a
thread of the trainer's interpreter: it runs only at the switch interval).  Read-ahead's pulls run in a worker
process (``vidcache.pullworker``); ``--in-process`` puts them back in threads of the trainer, for comparison.

A real step instead of the sleep (issue 43):

    .venv/bin/python benchmarks/trainer_stall.py --gpu            # = --device cuda
    .venv/bin/python benchmarks/trainer_stall.py --device cpu [--clips 32] [--camera-clips 0]

Each step then hydrates its batch with ``train_inputs_batch(device=...)`` (the cache read, then HF's processor,
on the GPU where it is exact) and runs a real training step of a small Qwen2.5-VL built from transformers' own
classes (``vidcache.testing.kl.tiny_model``: 2 layers, hidden size 64, the real patch layout; the toy
processor's tokenizer): forward with the batch's videos and a short prompt and answer around each, the
language-model loss on the answer tokens, backward, one AdamW update.  The wait is the time until the batch's
tensors are on the device.  The step's length is set as the sleep's was: ``--step-factor`` times a batch's
first read-and-hydrate time on a fresh node, reached with ``k`` forward/backward passes per update (gradient
accumulation; ``k`` from one pass's measured time), so without read-ahead the same share of the time waits.
Read-ahead pulls entries, not tensors: what is left with it is at least the processor's time on local entries
(printed in the row "the floor").  On the CPU the step takes the host's cores from read-ahead's pulls; on a GPU it
leaves them free but for the launch work.  So a third loop (issue 50; ``--inputs-ahead N``, default 1, 0: none)
also makes the next batch's tensors while the step runs (``vidcache.train_inputs_ahead``, a thread), and with a
trainer the headline ``stall:`` line is that loop's; the entries-only figure is printed on the line before it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# this checkout's vidcache, before an installed one (the venv may hold another checkout's, editable)
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _common import clips as test_clips, report  # noqa: E402
from camera_clips import make as camera_clips  # noqa: E402
from shared_tier_read import moto_s3  # noqa: E402

import vidcache  # noqa: E402
import vidcache.readahead  # noqa: E402
from vidcache import VideoCache, VideoOptions  # noqa: E402

OPTS = VideoOptions(family="qwen2_5_vl", fps=2.0)
# Seconds between building read-ahead and step 1: a trainer's setup after its data source is built.  Loading the
# model alone is longer than this for any real one (a 1B-parameter bf16 checkpoint is 2 GB read and copied to the
# device; Miles' first rollout comes before the first training step).  Issue 50: with read-ahead built with the
# loop (0) the first step waits for the pull worker's start and the first window's pulls, most of a run's wait.
HEAD_START = 2.0
PROMPT = "Describe what the camera sees: "
ANSWER = " A slow pan over a textured scene with coloured discs."


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


class Trainer:
    """A real training step on ``device``: a small Qwen2.5-VL (transformers' classes), AdamW, and the batch's
    tensors from ``train_inputs_batch``.  ``micro``: forward/backward passes per update (gradient accumulation)."""

    def __init__(self, device: str, seed: int = 0, decoder: str = "tiny") -> None:
        import torch

        from vidcache.testing.kl import tiny_model
        from vidcache.testing.processors import toy_processor
        self.torch = torch
        self.device = torch.device(device)
        self.proc = toy_processor("qwen2_5_vl")
        if decoder == "tiny":
            self.model = tiny_model("qwen2_5_vl", self.proc, seed=seed).to(self.device).train()
        else:
            self.model = decoder_model(self.proc, DECODERS[decoder], seed).to(self.device).train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        tok = self.proc.tokenizer
        cfg = self.model.config
        self.prompt = tok(PROMPT, add_special_tokens=False)["input_ids"]
        self.answer = tok(ANSWER, add_special_tokens=False)["input_ids"]
        self.video = (cfg.vision_start_token_id, cfg.video_token_id, cfg.vision_end_token_id)
        self.merge = cfg.vision_config.spatial_merge_size
        self.micro = 1
        self.losses: list[float] = []
        self.step_times: list[float] = []

    def hydrate(self, handles) -> list[dict]:
        """Each sample's model tensors on the device (one video per sample; memo off: every read is a first)."""
        from vidcache.handle import train_inputs_batch
        return train_inputs_batch(self.proc, [[h] for h in handles], **self.hydrate_kwargs)

    @property
    def hydrate_kwargs(self) -> dict:
        return {"memo": False, "device": self.device, "mode": "plugin"}

    def batch(self, inputs: list[dict]) -> dict:
        """Model kwargs for one padded batch: per sample, prompt + the video's tokens + answer; loss on the answer."""
        from vidcache.processing import join_videos
        torch = self.torch
        start, pad, end = self.video
        rows, labels = [], []
        for x in inputs:
            n = int(x["video_grid_thw"].prod(-1).sum()) // self.merge ** 2
            ids = self.prompt + [start] + [pad] * n + [end] + self.answer
            rows.append(ids)
            labels.append([-100] * (len(ids) - len(self.answer)) + self.answer)
        width = max(map(len, rows))
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        lab = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, (r, l) in enumerate(zip(rows, labels)):
            ids[i, :len(r)] = torch.tensor(r)
            lab[i, :len(l)] = torch.tensor(l)
            mask[i, :len(r)] = 1
        mm = torch.tensor(self.proc.create_mm_token_type_ids(ids.tolist()), dtype=torch.int32) * mask
        d = self.device
        return {"input_ids": ids.to(d), "attention_mask": mask.to(d), "labels": lab.to(d),
                "mm_token_type_ids": mm.to(d), "use_cache": False, **join_videos(inputs)}

    def step(self, inputs: list[dict]) -> float:
        """``micro`` forward/backward passes and one update; returns its seconds (the loss read back, as a
        trainer that logs it does, so the GPU's queue is drained inside the step)."""
        t = time.perf_counter()
        kw = self.batch(inputs)
        self.opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(self.micro):
            loss = self.model(**kw).loss / self.micro
            loss.backward()
            total += float(loss.detach())
        self.opt.step()
        self.losses.append(total)
        dt = time.perf_counter() - t
        self.step_times.append(dt)
        return dt


# Production-size steps (issue 50): Qwen2.5-VL with its text decoder at these sizes, bf16, random weights (nothing
# to download; the step's cost is the shapes', not the weights').  "1.2b": 16 layers of Qwen2.5-VL-3B's width
# class (hidden 2048, MLP 11008, 16 heads, 2 KV heads): 1.24B decoder parameters.  "small": the same code path at a
# size a CPU runs (a check of the option, not a figure).
DECODERS = {"1.2b": {"hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 16,
                     "num_attention_heads": 16, "num_key_value_heads": 2},
            "small": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                      "num_attention_heads": 4, "num_key_value_heads": 2}}


def decoder_model(proc, text: dict, seed: int):
    """transformers' Qwen2.5-VL with its text decoder of ``text``'s shape, bf16; the vision tower stays the tiny
    one (its output projected to the decoder's width), so the step's time is the decoder's."""
    import torch
    from transformers import Qwen2_5_VLForConditionalGeneration

    from vidcache.testing.kl import tiny_config
    cfg = tiny_config("qwen2_5_vl", proc)
    tc = cfg.text_config
    for k, v in text.items():
        setattr(tc, k, v)
    if getattr(tc, "layer_types", None) is not None:     # one per layer, made at the config's init
        tc.layer_types = [tc.layer_types[0]] * text["num_hidden_layers"]
    tc.initializer_range = cfg.vision_config.initializer_range = 0.02
    half = text["hidden_size"] // text["num_attention_heads"] // 2       # M-RoPE sections sum to head_dim / 2
    section = [half // 4, half * 3 // 8, half - half // 4 - half * 3 // 8]     # 16/24/24 at head_dim 128, as 7B
    tc.rope_parameters = {**tc.rope_parameters, "mrope_section": section}
    cfg.vision_config.out_hidden_size = text["hidden_size"]
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Qwen2_5_VLForConditionalGeneration(cfg).to(torch.bfloat16)


def busy(seconds: float) -> None:
    """A step that holds the GIL for ``seconds``: pure Python, no I/O, no C call that lets go of it (the worst
    case for a thread of this interpreter, which gets the GIL back only at the interpreter's switch interval)."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1


def run_loop(node: str, shared: str, s3: dict, ekeys: list[str], batch: int, step_s: float, ahead: bool,
             depth: int = 0, trainer: "Trainer | None" = None, step: str = "sleep", head_start: float = 0.0,
             inputs_ahead: int = 0) -> dict:
    """One epoch on a fresh node.  Without ``trainer``: read the frames, then the step: sleep ``step_s`` (the GPU's
    time), or hold the GIL for it (``step="busy"``).  With it: hydrate the batch on its device and run its step
    (``step_s`` unused; 0 for a calibration loop without steps).  ``head_start``: seconds between building
    read-ahead and the first step (a trainer builds its data source before it loads its model; that setup is
    not counted in the wall time), spent as the step is (asleep, or holding the GIL).  ``inputs_ahead`` (with a
    trainer): the batches are hydrated by ``vidcache.train_inputs_ahead``, that many ahead of the step, in a thread
    built when the loop starts (after the head start: the first batch's hydration is waited for)."""
    c = VideoCache(node, shared=shared, shared_storage_options=s3)
    samples = [[vidcache.from_key(k, c)] for k in ekeys]
    ra = vidcache.read_ahead(samples, depth=depth) if ahead else None
    if ra is not None and head_start > 0:
        busy(head_start) if step == "busy" else time.sleep(head_start)
    source = iter(ra) if ra is not None else iter(samples)
    waits = []
    first_step = step_s
    t_start = time.perf_counter()
    made = None
    if trainer is not None and inputs_ahead:
        made = vidcache.train_inputs_ahead(
            trainer.proc, ([next(source) for _ in range(min(batch, len(samples) - i))]
                           for i in range(0, len(samples), batch)),
            ahead=inputs_ahead, **trainer.hydrate_kwargs)
    for i in range(0, len(samples), batch):
        t = time.perf_counter()
        if made is not None:
            inputs = next(made)
        elif trainer is None:
            for _ in range(min(batch, len(samples) - i)):
                (h,) = next(source)
                h.frames()
        else:
            handles = [next(source)[0] for _ in range(min(batch, len(samples) - i))]
            inputs = trainer.hydrate(handles)
        waits.append(time.perf_counter() - t)
        if trainer is None:
            busy(step_s) if step == "busy" else time.sleep(step_s)     # the training step
        elif step_s:
            dt = trainer.step(inputs)               # the training step, for real
            if i == 0:
                first_step = dt
    wall = time.perf_counter() - t_start
    if made is not None:
        made.close()
    counts = dict(ra.counts) if ra is not None else None
    if ra is not None:
        ra.close()
    c.close()
    return {"waits": waits, "wall": wall, "stall": sum(waits) / wall, "counts": counts,
            "steady": sum(waits[1:]) / (wall - waits[0] - first_step) if len(waits) > 1 else float("nan")}


def calibrate_trainer(trainer: Trainer, node: str, shared: str, s3: dict, ekeys: list[str], batch: int,
                      target_s: float) -> dict:
    """On the calibration node (its entries now local): one forward/backward pass, and the passes per update that
    make a step last ``target_s`` (a batch's hydration alone is the floor's loop, over every batch)."""
    c = VideoCache(node, shared=shared, shared_storage_options=s3)
    trainer.micro = 1
    try:
        passes = []
        for i in range(0, min(len(ekeys), 3 * batch), batch):
            inputs = trainer.hydrate([vidcache.from_key(k, c) for k in ekeys[i:i + batch]])
            if i == 0:
                trainer.step(inputs)                # a first pass warms the kernels and the allocator: not timed
            passes.append(trainer.step(inputs))
    finally:
        c.close()
    one = statistics.median(passes)
    trainer.micro = max(1, round(target_s / one))
    trainer.losses.clear()
    trainer.step_times.clear()
    return {"pass": one}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clips", type=int, default=128, help="entries in the tier (and samples in the epoch)")
    ap.add_argument("--camera-clips", type=int, default=4,
                    help="of which camera-like 720p/1080p clips (at most 4; the rest are small generated clips)")
    ap.add_argument("--depth", type=int, default=8, help="samples read ahead (default: four batches of 2)")
    ap.add_argument("--batch", type=int, default=2, help="samples per step")
    ap.add_argument("--step-factor", type=float, default=1.5,
                    help="step time / a batch's first-read time without read-ahead")
    ap.add_argument("--device", choices=("cpu", "cuda"),
                    help="a real step (hydrate with train_inputs on DEVICE, forward/backward/update of a small "
                         "Qwen2.5-VL) instead of the sleep")
    ap.add_argument("--gpu", action="store_const", const="cuda", dest="device", help="the same as --device cuda")
    ap.add_argument("--decoder", choices=("tiny", *DECODERS), default="tiny",
                    help="with --device: the model of the step: the tiny Qwen2.5-VL (fp32, launch-bound), or one "
                         "whose text decoder has 1.24B parameters (bf16, GPU-bound; '1.2b')")
    ap.add_argument("--step", choices=("sleep", "busy"), default="sleep",
                    help="the simulated step: asleep (the GPU's time, the host free) or a pure-Python busy loop "
                         "holding the GIL for the step time (the worst case for threads)")
    ap.add_argument("--head-start", type=float, default=HEAD_START,
                    help="seconds read-ahead runs before the first step (a trainer's setup: the data source is "
                         f"built before the model is loaded); default {HEAD_START:g}; 0: built with the loop")
    ap.add_argument("--in-process", action="store_true",
                    help="read-ahead's pulls in threads of this process (before issue 50) instead of its worker")
    ap.add_argument("--also-in-process", action="store_true",
                    help="a third loop in the same run: read-ahead with its pulls in threads of the trainer")
    ap.add_argument("--inputs-ahead", type=int, default=1, metavar="BATCHES",
                    help="with --device: a third loop whose batches vidcache.train_inputs_ahead hydrates this many "
                         "ahead of the step, in a thread (the headline's figure); 0: none")
    ap.add_argument("--thread-moto", action="store_true", help="moto in a thread of this process instead")
    ap.add_argument("--work", help="working directory (default: a temporary one, removed)")
    args = ap.parse_args()
    vidcache.readahead.IN_WORKER = not args.in_process
    trainer = None
    if args.device is not None:
        import torch
        if args.device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("trainer_stall.py --gpu: torch sees no CUDA device (torch "
                             f"{torch.__version__}); run it on a GPU machine or use --device cpu")
        trainer = Trainer(args.device, decoder=args.decoder)
    work = args.work or tempfile.mkdtemp(prefix="vidcache-stall-")
    try:
        cams = camera_clips(os.path.join(work, "camera"))[:args.camera_clips] if args.camera_clips > 0 else []
        n_small = max(0, args.clips - len(cams))
        sources = (cams + test_clips(os.path.join(work, "clips"), n_small))[:args.clips]
        with moto_s3(process=not args.thread_moto) as (shared, s3):
            a = VideoCache(os.path.join(work, "node-a"), shared=shared, shared_storage_options=s3)
            # Node A's prewarm on every core (as `vidcache prewarm --workers` runs it), then the keys (hits)
            vidcache.prewarm([{"prompt": "<video>", "videos": [p]} for p in sources], a, OPTS,
                             workers=os.cpu_count() or 1, progress=False, media_roots=[work])
            ekeys = [a.ensure(p, OPTS).key for p in sources]
            nbytes = sum(a.manifest(k).frames.nbytes for k in ekeys)
            a.close()
            # Spread the big clips over the epoch, as a shuffled sampler would (one in every len/4 samples).
            big, small = ekeys[:len(cams)], ekeys[len(cams):]
            every = max(1, len(ekeys) // max(1, len(big)))
            order = []
            for i in range(len(ekeys)):
                src = big if (i % every == 0 and big) or not small else small
                order.append(src.pop(0))
            ekeys = order
            # Calibrate: a batch's first reads (and, with a trainer, its hydration) on a fresh node, no step.
            cal = run_loop(os.path.join(work, "node-cal"), shared, s3, ekeys, args.batch, 0.0, ahead=False,
                           trainer=trainer)
            step_s = args.step_factor * statistics.mean(cal["waits"])
            # The floor read-ahead leaves: a batch's reads once its entries are local (the copy out of LMDB's
            # map and the digest check of every read; with a trainer, HF's processor too), on the calibration
            # node, whose entries the loop above made local.
            floor = run_loop(os.path.join(work, "node-cal"), shared, s3, ekeys, args.batch, 0.0, ahead=False,
                             trainer=trainer)
            if trainer is not None:
                tcal = calibrate_trainer(trainer, os.path.join(work, "node-cal"), shared, s3, ekeys, args.batch,
                                         step_s)
            out = {}
            loops = [("without", False), ("with", True)] + ([("in-process", True)] if args.also_in_process else [])
            if trainer is not None and args.inputs_ahead > 0:
                loops.append(("inputs-ahead", True))
            for name, ahead in loops:
                vidcache.readahead.IN_WORKER = not args.in_process and name != "in-process"
                if trainer is not None:
                    trainer.step_times.clear()
                head = args.head_start
                out[name] = run_loop(os.path.join(work, f"node-{name}"), shared, s3, ekeys, args.batch, step_s, ahead,
                                     args.depth, trainer=trainer, step=args.step, head_start=head,
                                     inputs_ahead=args.inputs_ahead if name == "inputs-ahead" else 0)
                if trainer is not None:
                    out[name]["step_times"] = list(trainer.step_times)
        rows = [("entries / frame bytes", f"{len(ekeys)} / {nbytes / 1e6:.0f} MB (S3 on moto, "
                 f"{'a thread' if args.thread_moto else 'its own process'})"),
                ("batch / steps / read-ahead depth", f"{args.batch} / {len(out['with']['waits'])} / {args.depth}")]
        if trainer is None:
            rows += [("a batch's first reads (calibration, mean)", f"{statistics.mean(cal['waits']) * 1e3:.0f} ms"),
                     ("step time (simulated training)", f"{step_s * 1e3:.0f} ms, "
                      + ("a busy loop holding the GIL" if args.step == "busy" else "asleep"))]
        else:
            import torch
            dev = (torch.cuda.get_device_name(trainer.device) if trainer.device.type == "cuda"
                   else f"cpu, {torch.get_num_threads()} threads")
            steps = [t for r in out.values() for t in r["step_times"]]
            rows += [("training step", f"{args.decoder} Qwen2.5-VL ({sum(p.numel() for p in trainer.model.parameters())} "
                      f"parameters, {next(trainer.model.parameters()).dtype}) on {dev}; torch {torch.__version__}"),
                     ("a batch's first read + hydration (calibration)",
                      f"{statistics.mean(cal['waits']) * 1e3:.0f} ms"),
                     ("one forward/backward pass / passes per step", f"{tcal['pass'] * 1e3:.0f} ms / {trainer.micro}"
                      + (" (one pass is longer than the target step)" if tcal["pass"] > step_s else "")),
                     ("step time: target / measured p50 (p99)",
                      f"{step_s * 1e3:.0f} / {pct(steps, .5) * 1e3:.0f} ({pct(steps, .99) * 1e3:.0f}) ms"),
                     ("loss: first step / last step", f"{trainer.losses[0]:.4f} / {trainer.losses[-1]:.4f}")]
        rows.append(("read-ahead's head start before step 1", f"{head * 1e3:.0f} ms (its pulls run in "
                     + ("threads of the trainer" if args.in_process else "a worker process") + ")"))
        labels = {"without": "without read-ahead", "with": "with read-ahead", "in-process": "in-process read-ahead",
                  "inputs-ahead": f"read-ahead + inputs {args.inputs_ahead} ahead"}
        for name in out:
            r, label = out[name], labels[name]
            rows += [(f"{label}: wait per step p50 / p99",
                      f"{pct(r['waits'], .5) * 1e3:.1f} / {pct(r['waits'], .99) * 1e3:.1f} ms"),
                     (f"{label}: wall time spent waiting", f"{100 * r['stall']:.1f}% of {r['wall']:.1f} s"),
                     (f"{label}: the same after the first step", f"{100 * r['steady']:.1f}%")]
            if "step_times" in r:
                rows.append((f"{label}: step time p50 (p99)",
                             f"{pct(r['step_times'], .5) * 1e3:.0f} ({pct(r['step_times'], .99) * 1e3:.0f}) ms"))
        rows.append(("read-ahead's pulls", str(out["with"]["counts"])))
        rows.append(("the floor: a batch's reads of local entries" + (" and hydration" if trainer else "")
                     + ", mean (p99)",
                     f"{statistics.mean(floor['waits']) * 1e3:.1f} ({pct(floor['waits'], .99) * 1e3:.1f}) ms, "
                     f"{100 * sum(floor['waits']) / out['with']['wall']:.1f}% of the run with read-ahead"))
        kind = "a real step" if trainer is not None else f"a simulated step ({args.step})"
        report(f"trainer stall on a fresh node, {kind} ({os.cpu_count()} cores)", rows)
        if "in-process" in out:
            print(f"stall with read-ahead's pulls in threads of the trainer (--in-process): "
                  f"{100 * out['in-process']['stall']:.1f}% (after step 1: {100 * out['in-process']['steady']:.1f}%)")
        best = out["with"]
        if "inputs-ahead" in out:      # the headline is what a trainer gets using both; the entries' alone first
            print(f"stall with read-ahead of the entries only (each batch hydrated on the step's path): "
                  f"{100 * best['stall']:.1f}% (after step 1: {100 * best['steady']:.1f}%)")
            best = out["inputs-ahead"]
        print(f"stall: {100 * best['stall']:.1f}% with read-ahead, {100 * out['without']['stall']:.1f}% without")
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
