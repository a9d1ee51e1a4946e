"""The floors of ``vidcache check-computation`` on a GPU: how far apart two correct implementations of the same model
are, per family and dtype, on the computation check's canary shapes (docs/benchmarks.md, "Computation check floors").

The engines' CUDA builds are not installed where this runs (no SGLang / vLLM wheel for the device machine), so the
two implementations are transformers' own attention implementations, ``sdpa`` (what the trainer loads) against
``eager``, on the tests' tiny random-weight checkpoints (``tests/support/tiny_checkpoint.tiny_config``, seed 0),
in fp32 and in bf16; plus bf16 against fp32 (a bf16 engine against an fp32 trainer).  Inputs are synthetic (random
pixels and text ids, the canaries' grids), positions one arange for both sides: the figures are the noise of the
arithmetic, not of the inputs.  KL(a || b) per token, nats; the device's name is printed.

    python benchmarks/computation_floors.py [--device cuda] [--out floors.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace as NS

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

VOCAB = 263
SPECIAL = {"<|image_pad|>": 259, "<|video_pad|>": 260, "<|vision_start|>": 261, "<|vision_end|>": 262}
PATCH = {"qwen2_5_vl": 14, "qwen3_vl": 16}
# canary -> temporal x height x width patch grid per video (a merge of 2 x 2: h, w even)
CANARIES = {"text": [], "video 1 patch": [(1, 4, 4)], "video 4 patches": [(4, 4, 4)],
            "two videos": [(4, 4, 4), (1, 4, 4)]}


def processor(family: str):
    tok = type("Tok", (), {"__len__": lambda self: VOCAB, "convert_tokens_to_ids": staticmethod(SPECIAL.__getitem__),
                           "eos_token_id": 258})()
    return NS(tokenizer=tok, video_processor=NS(patch_size=PATCH[family], temporal_patch_size=2, merge_size=2))


def inputs(family: str, grids, gen: torch.Generator) -> dict:
    text = lambda n: torch.randint(0, 250, (n,), generator=gen).tolist()      # noqa: E731
    ids = text(12)
    for t, h, w in grids:
        ids += [SPECIAL["<|vision_start|>"]] + [SPECIAL["<|video_pad|>"]] * (t * h * w // 4) + \
               [SPECIAL["<|vision_end|>"]] + text(4)
    ids += text(40)
    kw = {"input_ids": torch.tensor([ids])}
    if grids:
        p = PATCH[family]
        n = sum(t * h * w for t, h, w in grids)
        kw["pixel_values_videos"] = torch.randn(n, 3 * 2 * p * p, generator=gen)
        kw["video_grid_thw"] = torch.tensor(grids)
        if family == "qwen2_5_vl":
            kw["second_per_grid_ts"] = torch.ones(len(grids))
    pos = torch.arange(len(ids))
    kw["position_ids"] = pos[None, None, :].expand(3, 1, -1).clone()
    return kw


def logprobs(model, kw, device, dtype) -> torch.Tensor:
    args = {k: (v.to(device, dtype) if k == "pixel_values_videos" else v.to(device)) for k, v in kw.items()}
    with torch.no_grad():
        out = model(**args, attention_mask=torch.ones_like(args["input_ids"]), use_cache=False)
    return torch.log_softmax(out.logits[0].float(), -1).double().cpu()


def kl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.exp() * (a - b)).sum(-1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out")
    args = ap.parse_args()
    import transformers

    from support.tiny_checkpoint import tiny_config
    dev = torch.device(args.device)
    card = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(f"device: {card}; torch {torch.__version__}, transformers {transformers.__version__}")
    classes = {"qwen2_5_vl": transformers.Qwen2_5_VLForConditionalGeneration,
               "qwen3_vl": transformers.Qwen3VLForConditionalGeneration}
    rows = []
    for family, cls in classes.items():
        cfg = tiny_config(family, processor(family))
        torch.manual_seed(0)
        ref = cls(cfg).eval()
        state = ref.state_dict()
        models = {}
        for dtype in (torch.float32, torch.bfloat16):
            for attn in ("sdpa", "eager"):
                c = tiny_config(family, processor(family))
                c._attn_implementation = attn
                for sub in (c.vision_config, c.text_config):
                    sub._attn_implementation = attn
                m = cls(c).eval()
                m.load_state_dict(state)
                models[dtype, attn] = m.to(dev, dtype)
        gen = torch.Generator().manual_seed(1)
        for canary, grids in CANARIES.items():
            kw = inputs(family, grids, gen)
            lp = {k: logprobs(m, kw, dev, k[0]) for k, m in models.items()}
            for name, a, b in (("fp32 sdpa vs eager", (torch.float32, "sdpa"), (torch.float32, "eager")),
                               ("bf16 sdpa vs eager", (torch.bfloat16, "sdpa"), (torch.bfloat16, "eager")),
                               ("bf16 sdpa vs fp32 sdpa", (torch.bfloat16, "sdpa"), (torch.float32, "sdpa"))):
                k = kl(lp[a], lp[b])
                agree = float((lp[a].argmax(-1) == lp[b].argmax(-1)).double().mean())
                rows.append({"family": family, "canary": canary, "pair": name, "mean_kl": float(k.mean()),
                             "max_kl": float(k.max()), "argmax_agree": agree, "tokens": len(k)})
                print(f"{family:11s} {canary:16s} {name:24s} mean KL {k.mean():.2e}  max {k.max():.2e}  "
                      f"argmax {100 * agree:5.1f}%", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": card, "torch": torch.__version__, "transformers": transformers.__version__,
                       "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
