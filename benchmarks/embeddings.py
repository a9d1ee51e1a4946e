"""The frozen-vision embedding tier (issue 49) in one run, on the CPU.

    .venv/bin/python benchmarks/embeddings.py [--clips N] [--seconds 4] [--repeat 3]

Clips: ``_common.clips`` (320x240 to 480x270, 4 s), built with each family's defaults at 2 fps into node A's cache
with a directory shared tier (compact layout).  Towers: transformers' own Qwen2.5-VL and Qwen3-VL classes at
``vidcache.testing.kl``'s tiny size (random weights, fp32, SDPA): a tower this small is the *worst* case for the
tier (the real towers cost ~3/4 of a video prompt's prefill: docs/embeddings.md's table, from an H100).  Per entry:

* the tower (``get_video_features`` from the trainer's tensors) vs a read from node A's local tier (digest
  check + safetensors parse) vs node B's first read (fresh node: pull from the shared tier, check, local copy);
* bytes per entry: the record (sealed, as stored) vs the raw frames vs the entry's compact shared object; and the
  record's size for the real checkpoints' widths (Qwen2.5-VL-7B: 3584 wide; Qwen3-VL-8B: 4096 wide and 3 deepstack
  layers), bf16, from the same token counts: ``tokens x width x 2 bytes x (1 + deepstack layers)``.
Then the read path at a real record's size (``--record-mb``, default 64: a 10 s 448x448 Qwen3-VL-8B entry, four
``[1960, 4096]`` bf16 tensors): the tier's read (the digest checked over LMDB's memory map, each tensor copied out
once) against the read it replaced in the same run (LMDB's copy, the digest twice, ``bytes()``, safetensors'
``load``).  Best of ``--repeat``.  Never asserts on time.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import best_of, clips as test_clips, report  # noqa: E402

from vidcache import VideoCache, VideoOptions, keys  # noqa: E402
from vidcache.compact import CompactLayout  # noqa: E402
from vidcache.embeddings import EmbeddingTier, tower_of  # noqa: E402
from vidcache.embeddings.compute import compute, entry_tensors  # noqa: E402
from vidcache.testing.kl import tiny_model  # noqa: E402
from vidcache.testing.processors import build_processor  # noqa: E402

# (hidden width of the decoder, deepstack layers) of the published checkpoints, for the bytes at real size
REAL = {"qwen2_5_vl": ("Qwen2.5-VL-7B", 3584, 0), "qwen3_vl": ("Qwen3-VL-8B", 4096, 3)}


def run(family: str, sources: list[str], work: str, repeat: int) -> None:
    opts = VideoOptions(family=family, fps=2.0)
    shared = os.path.join(work, f"tier-{family}")
    a = VideoCache(os.path.join(work, f"a-{family}"), shared=shared)
    entries = [a.ensure(s, opts).key for s in sources]
    proc = build_processor(family)
    tower = tower_of(tiny_model(family, proc))
    tier = EmbeddingTier(a)
    t_tower, t_local, t_first, b_rec, b_frames, b_compact, b_real, tokens = [], [], [], [], [], [], [], []
    for i, key in enumerate(entries):
        tensors = entry_tensors(a, proc, key)
        t_tower.append(best_of(lambda: compute(tower, tensors, key), repeat))
        emb = compute(tower, tensors, key)
        b_rec.append(tier.put(emb))
        t_local.append(best_of(lambda: tier.get(tower.key(key)), repeat))
        firsts = []
        for r in range(repeat):      # a fresh node each time: pull, check, local copy
            b = VideoCache(os.path.join(work, f"b-{family}-{i}-{r}"), shared=shared)
            tb = EmbeddingTier(b)
            t = time.perf_counter()
            got = tb.get(tower.key(key))
            firsts.append(time.perf_counter() - t)
            assert got is not None and torch.equal(got.embeds, emb.embeds)
            tb.close()
            b.close()
        t_first.append(min(firsts))
        m = a.manifest(key)
        b_frames.append(m.frames.nbytes)
        b_compact.append(a.shared.size(CompactLayout.key(key)) or 0)
        n = emb.embeds.shape[0]
        tokens.append(n)
        _, width, deep = REAL[family]
        b_real.append(n * width * 2 * (1 + deep))
    k = len(entries)
    avg = lambda xs: sum(xs) / k  # noqa: E731
    name, width, deep = REAL[family]
    report(f"{family}: {k} entries, {avg(tokens):.0f} video tokens each; tiny tower "
           f"({sum(p.numel() for p in tower.model.model.visual.parameters()) / 1e6:.2f} M parameters, fp32, CPU)", [
        ("tower per entry (get_video_features)", f"{avg(t_tower) * 1e3:.2f} ms"),
        ("tier read per entry, local (check + parse)", f"{avg(t_local) * 1e3:.2f} ms"),
        ("  tower / local read", f"{avg(t_tower) / avg(t_local):.1f}x"),
        ("first read on a fresh node (pull + check + local copy)", f"{avg(t_first) * 1e3:.2f} ms"),
        ("  first read / local read", f"{avg(t_first) / avg(t_local):.1f}x"),
        ("record bytes per entry (tiny: fp32, width 256)", f"{avg(b_rec) / 1e3:.1f} kB"),
        ("raw frame bytes per entry", f"{avg(b_frames) / 1e3:.1f} kB"),
        ("compact shared object per entry", f"{avg(b_compact) / 1e3:.1f} kB"),
        (f"record at {name}'s width {width}, bf16" + (f", +{deep} deepstack" if deep else ""),
         f"{avg(b_real) / 1e3:.1f} kB"),
        ("  / raw frames", f"{avg(b_real) / avg(b_frames):.2f}x"),
        ("  / compact shared object", f"{avg(b_real) / avg(b_compact):.2f}x"),
    ])
    tier.close()
    a.close()


def record_read(work: str, record_mb: float, repeat: int) -> None:
    """The tier's read of one real-size record against the read it replaced (same bytes, same run)."""
    from safetensors.torch import load

    from vidcache.embeddings.record import EmbeddingKey, VisionEmbeddings, unseal
    from vidcache.integrity import check_object

    width, deep = 4096, 3
    rows = max(1, int(record_mb * 1e6 / (width * 2 * (1 + deep))))
    key = EmbeddingKey(entry=f"{1:032x}.10.{'ab' * 16}", weights="0" * 32, dtype="bfloat16", code="bench")
    g = torch.Generator().manual_seed(0)
    emb = VisionEmbeddings(key, (10, 28, 28), torch.randn(rows, width, generator=g).bfloat16(),
                           tuple(torch.randn(rows, width, generator=g).bfloat16() for _ in range(deep)))
    a = VideoCache(os.path.join(work, "a-record"))
    tier = EmbeddingTier(a)
    nbytes = tier.put(emb)
    sk = keys.emb(key.id)

    def before():                   # the read as it was: LMDB's copy, check_object's digest, unseal's, two copies
        value = tier.store.get(sk)
        check_object(sk, value)
        raw = unseal(value)
        return load(bytes(raw))

    assert torch.equal(before()["embeds"], tier.get(key).embeds)
    t_new = best_of(lambda: tier.get(key), repeat)
    t_old = best_of(before, repeat)
    report(f"one record of {nbytes / 1e6:.1f} MB ({rows} x {width} bf16, +{deep} deepstack), warm page cache", [
        ("tier read (digest over the memory map, one copy per tensor)", f"{t_new * 1e3:.1f} ms"),
        ("the read it replaced (LMDB copy, two digests, bytes(), safetensors load)", f"{t_old * 1e3:.1f} ms"),
        ("  replaced / tier read", f"{t_old / t_new:.1f}x"),
        ("  tier read throughput", f"{nbytes / t_new / 1e9:.2f} GB/s"),
    ])
    tier.close()
    a.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clips", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--record-mb", type=float, default=64.0, help="the real-size record's size (0: skip)")
    args = ap.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    work = tempfile.mkdtemp(prefix="vidcache-emb-bench-")
    try:
        sources = test_clips(os.path.join(work, "clips"), args.clips, args.seconds)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; clips {args.clips} x {args.seconds} s")
        for family in ("qwen2_5_vl", "qwen3_vl"):
            run(family, sources, work, args.repeat)
        if args.record_mb > 0:
            record_read(work, args.record_mb, max(args.repeat, 5))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
