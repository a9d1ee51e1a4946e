"""What each rollout/trainer mismatch costs, in the field's unit: KL(rollout || trainer) per response token.

    .venv/bin/python benchmarks/kl_table.py [--families qwen2_5_vl,qwen3_vl] [--clips all] [--per-clip]

CPU only, no downloads.  The model is transformers' own ``Qwen2_5_VLForConditionalGeneration`` /
``Qwen3VLForConditionalGeneration``, tiny and with fixed random weights (``vidcache.testing.kl``), fp32, eval.  Each
row builds a rollout side and a trainer side (``tests/support/kl_paths.py`` says how, row by row), scores the same
fixed K-token response on both, and reports over every clip of the test suite (``tests/support/media.py``'s VIDEOS):

  mean KL     mean over all response tokens of all clips of KL(rollout || trainer), nats
  max KL      the largest single token's
  argmax      the share of tokens whose argmax differs
  equal       clips whose K x vocab logits are ``torch.equal`` on both sides

Rows 1-2 ("vidcache stock", "vidcache plugin") must be exactly 0.0 with ``torch.equal`` logits on every clip: the
script asserts it.  Rows 1-7 score both sides at the model's own M-RoPE positions: they isolate the inputs.  The
last row scores the rollout at SGLang's positions (what the engine computes) and the trainer at transformers' own
(what a trainer that is not given ``vidcache.rope_positions`` computes), with identical inputs: it is 0 on clips
whose grid is wider than long, and not on long clips (h264_long) for Qwen2.5-VL.  The other rows are whatever they are.  Rows that cannot be built on this CPU machine are
printed with the reason.  The magnitudes are this tiny random model's: they show which paths differ and how
their costs rank, not what a trained 7B model loses (verl#7802's figures are that reference).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

STOCK, PLUGIN = "vidcache stock", "vidcache plugin"
NAIVE = "naive: SGLang decodes the source"
QVU_TC = "trainer: qwen-vl-utils torchcodec"
QVU_DECORD = "trainer: qwen-vl-utils decord, its thread default"
LAYOUT = "Qwen3-VL ids: 5.24 wrapped vs 5.25 collapsed"
OFFSET = "one-frame offset in sampling"
POSITIONS = "trainer: transformers' own M-RoPE positions (rollout: SGLang's rule)"
ROWS = [STOCK, PLUGIN, NAIVE, QVU_TC, QVU_DECORD, LAYOUT, OFFSET, POSITIONS]

# Rows this machine cannot build, and why (printed under every table).
NOT_BUILT = [
    ("SGLang's GPU decode of the frozen file (stock mode)",
     "SGLang asks torchcodec for CUDA (NVDEC) decoding; this VM has no GPU, so SGLang falls back to the CPU decode "
     "rows 1 and 3 use. docs/sglang.md: torchcodec 0.17.0 on an H200 changes frozen frames by up to 2 (53% of "
     "values), 0.16.0 is exact: that row needs the GPU host"),
    ("SGLang's GPU decode of the source (naive)", "the same: no CUDA here; row 3 is SGLang's CPU fallback decode"),
    ("trainer: qwen-vl-utils torchvision", "torchvision 0.29.1 has no io.read_video (removed), which qwen-vl-utils "
     "0.0.14's torchvision reader calls"),
    ("SGLang's model kernels vs the trainer's", "both sides are scored with the same HF model on the CPU: this table "
     "isolates the inputs; kernel and precision differences add to every row on a GPU"),
]


def make_clips(directory: str, names: list[str]) -> dict[str, str]:
    """support.media.VIDEOS' clips, generated exactly as the suite's ``videos`` fixture does (same seeds)."""
    from support.media import VIDEOS

    from vidcache.testing.videos import make_video, suffix_for
    os.makedirs(directory, exist_ok=True)
    out = {}
    for i, (name, (codec, w, h, fps, n)) in enumerate(VIDEOS.items()):
        if name in names:
            out[name] = make_video(os.path.join(directory, name + suffix_for(codec)), codec=codec, width=w,
                                   height=h, fps=fps, n_frames=n, seed=i)
    return out


def make_codec_clips(directory: str) -> tuple[dict[str, str], list[str]]:
    """``--codec-clips``: the codec matrix of tests/scenarios/test_codecs.py (ffmpeg-made, 16 frames of 160x120 at
    25 fps), made as its ``clips`` fixture makes them; those vidcache refuses and those this ffmpeg cannot encode
    are left out, and named."""
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "scenarios"))
    import test_codecs as tc

    from vidcache.testing.videos import ffmpeg_clip, ffmpeg_remux
    os.makedirs(directory, exist_ok=True)
    out, left = {}, []
    for name, c in tc.CLIPS.items():
        missing = [e for e in c.encoders if e not in tc.ENCODERS]
        if name in tc.REFUSED or missing:
            left.append(f"{name} ({'vidcache refuses it' if name in tc.REFUSED else 'no ' + ', '.join(missing)})")
            continue
        path = ffmpeg_clip(os.path.join(directory, name + c.suffix), c.args, **c.clip_kw)
        if c.remux:
            cover = os.path.join(directory, "cover.png")
            if c.cover and not os.path.exists(cover):
                import subprocess
                subprocess.run(["ffmpeg", "-y", "-v", "error", "-f", "lavfi", "-i", "color=c=blue:size=96x96",
                                "-frames:v", "1", cover], check=True)
            path = ffmpeg_remux(path, os.path.join(directory, f"remuxed_{name}{c.suffix}"), list(c.remux),
                                (cover,) if c.cover else ())
        out["codec:" + name] = path
    return out, left


def build_pairs(kp, peers, proc, family: str, source: str, cache) -> dict:
    """row -> (rollout Side, trainer Side) for one clip; a row that fails on this clip -> the error text."""
    from vidcache.processing import layout_of

    hs, hp = kp.get(source, family, "stock", cache), kp.get(source, family, "plugin", cache)
    plugin_rollout = kp.sglang_vidcache(peers, proc, hp, "plugin")
    plugin_trainer = kp.trainer(proc, hp, "plugin")
    pairs = {STOCK: (kp.sglang_vidcache(peers, proc, hs, "stock"), kp.trainer(proc, hs, "stock")),
             PLUGIN: (plugin_rollout, plugin_trainer)}
    others = {
        NAIVE: lambda: (kp.sglang_naive(peers, family, source), kp.native_trainer(proc, hp)),
        QVU_TC: lambda: (plugin_rollout, kp.qvu_trainer(proc, hp, "torchcodec")),
        QVU_DECORD: lambda: (plugin_rollout, kp.qvu_trainer(proc, hp, "decord")),
        OFFSET: lambda: (kp.offset_rollout(proc, hp), plugin_trainer),
        POSITIONS: lambda: (kp.engine_positions(plugin_rollout, "sglang"), plugin_trainer),
    }
    if family == "qwen3_vl":
        assert layout_of(proc, family) == "wrapped", "this row expects transformers 5.10-5.24 in the venv"
        others[LAYOUT] = lambda: (kp.layout_rollout(proc, hp), plugin_trainer)
    for name, fn in others.items():
        try:
            pairs[name] = fn()
        except Exception as e:  # noqa: BLE001 -- a path that fails on one clip is a finding, printed per clip
            pairs[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return pairs


def score(kl, kp, model, proc, family, resp, rollout, trainer_side) -> dict:
    a = kl.response_logits(model, proc, rollout.ids, resp, rollout.tensors,
                           kp.position_ids(proc, family, rollout, resp))
    b = kl.response_logits(model, proc, trainer_side.ids, resp, trainer_side.tensors,
                           kp.position_ids(proc, family, trainer_side, resp))
    return kl.kl_stats(a, b)


def summarise(per_clip: list[tuple[str, dict]]) -> dict:
    ok = [s for _, s in per_clip if isinstance(s, dict)]
    if not ok:
        return {}
    k = sum(s["k"] for s in ok)
    return {"mean_kl": sum(s["mean_kl"] * s["k"] for s in ok) / k, "max_kl": max(s["max_kl"] for s in ok),
            "argmax_diff": sum(s["argmax_diff"] * s["k"] for s in ok) / k,
            "equal": sum(s["equal"] for s in ok), "clips": len(ok),
            "ids_differ": sum(s["ids_differ"] for s in ok), "frames_differ": sum(bool(s["frames"]) for s in ok),
            "entropy": sum(s["entropy"] for s in ok) / len(ok)}


def print_table(family: str, rows: dict, clips: list[str], k: int) -> None:
    print(f"\n### {family}: KL(rollout || trainer) per token, {len(clips)} clips x {k} response tokens\n")
    print("| path | mean KL/token (nats) | max KL/token | argmax differs | logits torch.equal | "
          "frames differ | prompt ids differ |")
    print("|---|---|---|---|---|---|---|")
    for name in ROWS:
        if name not in rows:
            if name == LAYOUT:
                print(f"| {name} | n/a | | | | | Qwen2.5-VL has one layout (plain) in every release |")
            continue
        s = summarise(rows[name])
        if not s:
            print(f"| {name} | not built | | | | | {rows[name][0][1]} |")
            continue
        failed = [c for c, v in rows[name] if not isinstance(v, dict)]
        clipped = f" ({s['clips']} of {len(clips)} clips)" if failed else ""
        print(f"| {name} | {s['mean_kl']:.3g} | {s['max_kl']:.3g} | {s['argmax_diff'] * 100:.1f}% | "
              f"{s['equal']}/{s['clips']}{clipped} | {s['frames_differ']}/{s['clips']} | "
              f"{s['ids_differ']}/{s['clips']} |")
    print(f"\ntrainer-side mean entropy {summarise(rows[PLUGIN])['entropy']:.2f} nats "
          f"(uniform over the vocabulary: {rows[PLUGIN][0][1]['max_entropy']:.2f})")
    for name in ROWS:
        for clip, v in rows.get(name, []):
            if not isinstance(v, dict):
                print(f"  {name} failed on {clip}: {v}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="qwen2_5_vl,qwen3_vl")
    ap.add_argument("--clips", default="all", help="comma-separated support.media.VIDEOS names, or all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-clip", action="store_true", help="print every clip's figures too")
    ap.add_argument("--codec-clips", action="store_true",
                    help="also the ffmpeg codec matrix of tests/scenarios/test_codecs.py (about 25 more clips)")
    ap.add_argument("--work", help="directory for the clips and the cache (default: a new temporary one)")
    a = ap.parse_args(argv)

    from support.media import VIDEOS
    from support import kl_paths as kp
    from support import sglang_peer as sp
    from support.toy_processors import build_processor

    import vidcache.testing.kl as kl
    from vidcache.node import open_cache
    from vidcache.errors import VidcacheError

    sp.require_peer()
    t0 = time.time()
    work = a.work or tempfile.mkdtemp(prefix="vc-kl-")
    # The plugin resolves references through this node's cache ($VIDCACHE_DIR), as on a server.
    os.environ["VIDCACHE_DIR"] = os.path.join(work, "cache")
    os.environ.pop("VIDCACHE_SHARED", None)
    cache = open_cache()
    names = list(VIDEOS) if a.clips == "all" else a.clips.split(",")
    clips = make_clips(os.path.join(work, "clips"), names)
    if a.codec_clips:
        extra, left = make_codec_clips(os.path.join(work, "codecs"))
        clips.update(extra)
        if left:
            print("codec clips left out: " + "; ".join(left))
    peers = kp.Peers()
    import importlib.metadata as md
    import torch
    print(f"torch {torch.__version__}, transformers {md.version('transformers')}, SGLang {md.version('sglang')}, "
          f"qwen-vl-utils {md.version('qwen-vl-utils')}, decord {md.version('decord')}, "
          f"torchcodec {md.version('torchcodec')}; CPU, {os.cpu_count()} cores; model seed {a.seed}")
    print(f"clips: {', '.join(clips)}; options fps 2, pixels [3136, 50176] per frame "
          "(Qwen3-VL stock: the 224 grid, [50176, 100352])")
    for family in a.families.split(","):
        proc = build_processor(family)
        model = kl.tiny_model(family, proc, seed=a.seed)
        resp = kp.response_ids(proc)
        rows: dict[str, list] = {}
        skipped = []
        for clip, src in clips.items():
            try:
                pairs = build_pairs(kp, peers, proc, family, src, cache)
            except VidcacheError as e:     # vidcache refuses the entry (or stock mode refuses to serve it): named
                skipped.append(f"{clip}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            for name, pair in pairs.items():
                if isinstance(pair, str):
                    rows.setdefault(name, []).append((clip, pair))
                    continue
                rollout, tr = pair
                s = score(kl, kp, model, proc, family, resp, rollout, tr)
                s["frames"] = kp.frames_differ(rollout.frames, tr.frames)
                s["ids_differ"] = rollout.ids != tr.ids
                rows.setdefault(name, []).append((clip, s))
                if a.per_clip:
                    print(f"  {family} {clip:14s} {name:48s} mean {s['mean_kl']:.3g} max {s['max_kl']:.3g} "
                          f"argmax {s['argmax_diff'] * 100:.0f}% equal {s['equal']} ids-differ {s['ids_differ']} "
                          f"frames: {s['frames'] or 'equal'} {rollout.note}")
        print_table(family, rows, [c for c in clips if not any(x.startswith(c + ":") for x in skipped)], len(resp))
        for x in skipped:
            print(f"  clip left out of the {family} table: {x}")
        # Rows 1-2: exactly zero, and the logits themselves bitwise equal, on every clip.
        for name in (STOCK, PLUGIN):
            for clip, s in rows[name]:
                assert s["equal"] and s["mean_kl"] == 0.0 and s["max_kl"] == 0.0, (family, name, clip, s)
        built = len(clips) - len(skipped)
        print(f"\nrows 1-2 ({family}): logits torch.equal on {len(rows[STOCK])}/{built} clips (stock) and "
              f"{len(rows[PLUGIN])}/{built} (plugin); mean KL exactly 0.0: asserted")
    print("\nnot built on this machine:")
    for name, why in NOT_BUILT:
        print(f"  {name}: {why}")
    print(f"\n{time.time() - t0:.0f} s")


if __name__ == "__main__":
    logging.disable(logging.WARNING)            # SGLang's CPU-fallback notice on every decode
    warnings.filterwarnings("ignore")           # transformers' and SGLang's CPU notices
    main()
