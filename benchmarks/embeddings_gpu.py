"""The embedding tier against the real-size vision tower, on a GPU (issue 49, item 5), in one run.

    python benchmarks/embeddings_gpu.py [--families qwen2_5_vl,qwen3_vl] [--seconds 10,30,60] [--repeat 3]

Towers: transformers' own Qwen2.5-VL-7B and Qwen3-VL-8B vision towers at their published sizes (random weights,
bf16, SDPA, on ``cuda``), inside a model whose decoder is one layer of the published width (only the tower runs).
Videos: 448x448 at 2 fps, 10 / 30 / 60 s (the grids of a real entry; random pixels: the tower's cost does not depend
on them).  Per video, best of ``--repeat``:

* ``tower``: ``get_video_features`` on the trainer's tensors, GPU time (synchronized);
* ``local read``: the record from node A's local tier (LMDB; digest check, safetensors parse) onto the GPU;
* ``first read``: node B (a fresh node directory on the same shared tier): pull from the shared tier (a
  directory), check, keep a local copy, onto the GPU;
* the record's bytes, and ``torch.equal`` of what was read with what the tower computed (the tier is exact).

Never asserts on time.  Prints the machine (``torch.cuda.get_device_name``) and the versions it ran.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from vidcache import VideoCache  # noqa: E402
from vidcache.embeddings import EmbeddingTier, tower_of  # noqa: E402
from vidcache.embeddings.compute import compute  # noqa: E402

# The published vision configs (config.json "vision_config") and decoder widths.
REAL = {
    "qwen2_5_vl": ("Qwen2.5-VL-7B", dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                                         in_channels=3, patch_size=14, temporal_patch_size=2, spatial_merge_size=2,
                                         window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
                                         out_hidden_size=3584, tokens_per_second=2, hidden_act="silu"), 3584),
    "qwen3_vl": ("Qwen3-VL-8B", dict(depth=27, hidden_size=1152, intermediate_size=4304, num_heads=16,
                                     in_channels=3, patch_size=16, temporal_patch_size=2, spatial_merge_size=2,
                                     out_hidden_size=4096, num_position_embeddings=2304,
                                     deepstack_visual_indexes=[8, 16, 24], hidden_act="gelu_pytorch_tanh"), 4096),
}


def build(family: str):
    import transformers
    name, vision, width = REAL[family]
    text = dict(hidden_size=width, intermediate_size=256, num_hidden_layers=1, num_attention_heads=8,
                num_key_value_heads=8, vocab_size=1024, max_position_embeddings=32768,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})
    if family == "qwen2_5_vl":
        cfg = transformers.Qwen2_5_VLConfig(vision_config=vision, text_config=text)
        cls = transformers.Qwen2_5_VLForConditionalGeneration
    else:
        text.update(head_dim=128, rope_parameters={**text["rope_parameters"], "mrope_interleaved": True})
        cfg = transformers.Qwen3VLConfig(vision_config=vision, text_config=text)
        cls = transformers.Qwen3VLForConditionalGeneration
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = cls(cfg)
    return name, model.to(torch.bfloat16).eval()


def sync_time(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="qwen2_5_vl,qwen3_vl")
    ap.add_argument("--seconds", default="10,30,60")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("embeddings_gpu.py: torch sees no CUDA device")
    import transformers
    print(f"machine: {torch.cuda.get_device_name()}; torch {torch.__version__}, transformers "
          f"{transformers.__version__}; bf16, SDPA, random weights")
    work = tempfile.mkdtemp(prefix="vidcache-emb-gpu-")
    rows = []
    # each row as it is measured (flushed): a run cut short by a time limit keeps what it measured
    print("| tower | video (448x448, 2 fps) | grid | tokens | tower | local read | first read (shared) | "
          "tower / local | tower / first | record | exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    try:
        shared = os.path.join(work, "tier")
        a = VideoCache(os.path.join(work, "a"), shared=shared)
        tier_a = EmbeddingTier(a)
        for family in args.families.split(","):
            name, model = build(family)
            tower = tower_of(model)
            params = sum(p.numel() for p in model.model.visual.parameters())
            patch = REAL[family][1]["patch_size"]
            side = 448 // patch
            for n, s in enumerate(int(x) for x in args.seconds.split(",")):
                t = s                                       # 2 fps, temporal patch 2: one grid row per second
                grid = torch.tensor([[t, side, side]])
                pixels = torch.randn(t * side * side, 3 * 2 * patch * patch, device="cuda", dtype=torch.bfloat16)
                entry = f"{n:032x}.{s}.{'ab' * 16}"
                tensors = {"pixel_values_videos": pixels, "video_grid_thw": grid}
                compute(tower, tensors, entry)             # warm-up (kernels, allocator)
                tower_s = min(sync_time(lambda: compute(tower, tensors, entry))[0] for _ in range(args.repeat))
                emb = compute(tower, tensors, entry)
                nbytes = tier_a.put(emb)

                def read(tier):
                    got = tier.get(emb.key)
                    return got.embeds.to("cuda"), tuple(d.to("cuda") for d in got.deepstack)
                local_s = min(sync_time(lambda: read(tier_a))[0] for _ in range(args.repeat))
                b = VideoCache(os.path.join(work, f"b{family}{n}"), shared=shared)
                first_s, (embeds, deep) = sync_time(lambda: read(EmbeddingTier(b)))
                b.close()
                exact = torch.equal(embeds, emb.embeds) and all(torch.equal(x, y) for x, y in zip(deep, emb.deepstack))
                rows.append((name, params, f"{s} s", tuple(grid[0].tolist()), emb.embeds.shape[0], tower_s, local_s,
                             first_s, nbytes, exact))
                print(row(*rows[-1]), flush=True)
            del model
            torch.cuda.empty_cache()
        a.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r[-1] for r in rows) else 1


def row(name, params, vid, grid, tokens, tw, lr, fr, nb, ex) -> str:
    return (f"| {name} ({params / 1e6:.1f} M) | {vid} | {'x'.join(map(str, grid))} | {tokens:,} | "
            f"{tw * 1e3:.0f} ms | {lr * 1e3:.1f} ms | {fr * 1e3:.1f} ms | {tw / lr:.0f}x | {tw / fr:.1f}x | "
            f"{nb / 1e6:.1f} MB | {ex} |")


if __name__ == "__main__":
    sys.exit(main())
