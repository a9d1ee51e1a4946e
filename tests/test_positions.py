"""M-RoPE positions (vidcache.mrope, vidcache.positions): each rule equals its component's own function.

The components' functions run in their own environments (tests/support/rope_peer.py): SGLang 0.5.23 (the venv's
test peer) and 0.5.16 (.overlays/sglang-0.5.16), vLLM 0.34.0 (.overlays/vllm-0.34.0), and transformers 5.24.0 (the
venv), 5.19.0, 5.25.0 (overlays), 5.12.1 (SGLang 0.5.16's overlay).  Every case is a whole sequence: prompt,
video(s), images, response and later turns, with grids where time dominates and where space does.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pytest
import torch

from vidcache import mrope

from support.cli import EVERYTHING, run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "tests", "support", "rope_peer.py")
OVERLAYS = os.path.join(ROOT, ".overlays")
IDS = {"image_token_id": 151655, "video_token_id": 151656, "vision_start_token_id": 151652,
       "vision_end_token_id": 151653}
MERGE = 2
TPS = 2      # Qwen2.5-VL's published tokens_per_second

# (T, H, W) patch grids.  Time dominates: T=24 (Qwen2.5-VL at 2 fps, 1 s per grid: the last group at 46) over a
# 10 x 10 merged frame; space dominates: 2 groups over 14 x 20.
TIME = (24, 20, 20)
SPACE = (2, 28, 40)
SHORT = (4, 10, 12)


def _text(rng, n):
    return [rng.randrange(1000, 150000) for _ in range(n)]


def _video_ids(family, grid, rng, wrapped=False):
    t, h, w = grid
    per = h * w // (MERGE * MERGE)
    if family != "qwen3_vl":
        return [IDS["vision_start_token_id"]] + [IDS["video_token_id"]] * (t * per) + [IDS["vision_end_token_id"]]
    out = [IDS["vision_start_token_id"]] if wrapped else []
    for _ in range(t):       # Qwen3-VL: each group behind its "<t seconds>" text
        out += _text(rng, 3) + [IDS["vision_start_token_id"]] + [IDS["video_token_id"]] * per \
            + [IDS["vision_end_token_id"]]
    return out + ([IDS["vision_end_token_id"]] if wrapped else [])


def _image_ids(grid):
    t, h, w = grid
    return [IDS["vision_start_token_id"]] + [IDS["image_token_id"]] * (t * h * w // 4) + [IDS["vision_end_token_id"]]


def case(family, parts, seed=0, spg=None, wrapped=False):
    """A whole sequence from parts: ("text", n) | ("video", grid) | ("image", grid)."""
    rng = random.Random(seed)
    ids, vg, ig = [], [], []
    for kind, arg in parts:
        if kind == "text":
            ids += _text(rng, arg)
        elif kind == "video":
            ids += _video_ids(family, arg, rng, wrapped)
            vg.append(list(arg))
        else:
            ids += _image_ids(arg)
            ig.append(list(arg))
    c = {"family": family, "ids": ids, "merge": MERGE, "tokens_per_second": TPS, **IDS,
         "video_grid_thw": vg or None, "image_grid_thw": ig or None}
    if family == "qwen2_5_vl" and vg:
        c["second_per_grid_ts"] = [float(torch.tensor(s, dtype=torch.float32)) for s in (spg or [1.0] * len(vg))]
    return c


def cases():
    out = []
    for fam in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        out += [
            case(fam, [("text", 7), ("video", TIME), ("text", 40)]),                       # time dominates
            case(fam, [("text", 5), ("video", SPACE), ("text", 30)]),                      # space dominates
            case(fam, [("text", 3), ("video", TIME), ("text", 4), ("video", SHORT), ("text", 20)], seed=1),
            case(fam, [("text", 4), ("image", (1, 8, 12)), ("text", 2), ("video", TIME), ("text", 9),
                       ("image", (1, 14, 6)), ("text", 12)], seed=2),                       # images beside videos
            # multi-turn: a response, a second user turn with another video, a second response
            case(fam, [("text", 6), ("video", SHORT), ("text", 25), ("text", 8), ("video", TIME), ("text", 30)],
                 seed=3),
            case(fam, [("video", TIME)], seed=4),                                          # nothing after
        ]
    out += [  # Qwen2.5-VL's seconds per grid: 29.97 fps sources, stock mode's 2/24, a slow clip
        case("qwen2_5_vl", [("text", 5), ("video", TIME), ("text", 10)], spg=[2 / 1.998]),
        case("qwen2_5_vl", [("text", 5), ("video", TIME), ("text", 10)], spg=[2 / 24]),
        case("qwen2_5_vl", [("text", 5), ("video", (10, 8, 8)), ("text", 5), ("video", TIME), ("text", 10)],
             spg=[4.0, 1.001]),
        case("qwen3_vl", [("text", 5), ("video", TIME), ("text", 10)], wrapped=True),
    ]
    return out


def ours(c, rule, transformers_version=None):
    return mrope.positions(c["ids"], rule=rule, family=c["family"], merge=c["merge"],
                           transformers_version=transformers_version, tokens_per_second=c["tokens_per_second"], image_token_id=c["image_token_id"],
                           video_token_id=c["video_token_id"], image_grid_thw=c["image_grid_thw"],
                           video_grid_thw=c["video_grid_thw"],
                           second_per_grid_ts=None if c.get("second_per_grid_ts") is None
                           else torch.tensor(c["second_per_grid_ts"], dtype=torch.float32))


def run_peer(engine, overlay=None, cs=None):
    env = dict(os.environ)
    if overlay is not None:
        path = os.path.join(OVERLAYS, overlay)
        assert os.path.isdir(path), f"{overlay} overlay missing: scripts/install.sh --test installs it"
        env["PYTHONPATH"] = os.pathsep.join([path, ROOT])
    p = subprocess.run([sys.executable, PEER, engine], input=json.dumps(cs or cases()), capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


# Each row: the rule, the component's environment, the versions it must report (nothing unverified passes).
PEERS = [
    ("sglang", None, {"sglang": "0.5.23"}),
    ("sglang", "sglang-0.5.16", {"sglang": "0.5.16", "transformers": "5.12.1"}),
    ("vllm", "vllm-0.34.0", {"vllm": "0.34.0", "transformers": "5.22.2"}),
    ("transformers", "vllm-0.34.0", {"transformers": "5.22.2"}),
    ("transformers", None, {"transformers": "5.24.0"}),
    ("transformers", "transformers-5.19.0", {"transformers": "5.19.0"}),
    ("transformers", "transformers-5.25.0", {"transformers": "5.25.0"}),
    ("transformers", "sglang-0.5.16", {"transformers": "5.12.1"}),
]


@pytest.mark.parametrize("rule,overlay,want", PEERS, ids=[f"{r}-{o or 'venv'}" for r, o, _ in PEERS])
def test_each_rule_equals_its_components_own_function(rule, overlay, want):
    got = run_peer(rule, overlay)
    for k, v in want.items():
        assert got["versions"][k] == v, got["versions"]
    for c, theirs in zip(cases(), got["positions"]):
        mine = ours(c, rule, got["versions"]["transformers"] if rule == "transformers" else None)
        assert torch.equal(mine, torch.tensor(theirs, dtype=torch.long)), (c["family"], rule, overlay)


def test_the_rules_differ_after_a_long_video_and_only_there():
    """Before vidcache's positions: transformers' rule against the engines' for a time-dominated grid."""
    for fam in ("qwen2_vl", "qwen2_5_vl"):
        long = case(fam, [("text", 7), ("video", TIME), ("text", 40)])
        t, s = ours(long, "transformers"), ours(long, "sglang")
        n_text = 40 + 1          # <|vision_end|> is text
        assert torch.equal(t[:, :-n_text], s[:, :-n_text])          # prompt and video agree
        assert (t[:, -n_text:] != s[:, -n_text:]).all()             # every later token moves
        assert mrope.rules_differ(TIME, family=fam)
        wide = case(fam, [("text", 5), ("video", SPACE), ("text", 30)])
        assert torch.equal(ours(wide, "transformers"), ours(wide, "sglang"))
        assert not mrope.rules_differ(SPACE, family=fam)
    for c in cases():
        if c["family"] == "qwen3_vl":      # one item per frame group: never
            assert torch.equal(ours(c, "transformers"), ours(c, "sglang"))
        assert torch.equal(ours(c, "sglang"), ours(c, "vllm"))


def test_a_continued_rollout_keeps_the_positions_of_its_prefix():
    """A partial rollout continued later: the positions of the prefix are the prefix of the whole's."""
    for fam in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        c = case(fam, [("text", 6), ("video", TIME), ("text", 25), ("text", 8), ("video", SHORT), ("text", 30)])
        whole = ours(c, "sglang")
        cut = len(c["ids"]) - 30 - len(_video_ids(fam, SHORT, random.Random(9))) - 8 + 5
        prefix = dict(c, ids=c["ids"][:cut], video_grid_thw=c["video_grid_thw"][:1],
                      second_per_grid_ts=(c.get("second_per_grid_ts") or [None])[:1]
                      if c.get("second_per_grid_ts") else None)
        assert torch.equal(ours(prefix, "sglang"), whole[:, :cut])


def test_ids_and_grids_that_do_not_belong_together_are_refused():
    c = case("qwen2_5_vl", [("text", 3), ("video", TIME), ("text", 3)])
    with pytest.raises(ValueError, match="ids and grids do not belong together"):
        ours(dict(c, video_grid_thw=[[24, 20, 24]]), "sglang")
    with pytest.raises(ValueError, match="more grids"):
        ours(dict(c, video_grid_thw=[list(TIME), list(SHORT)], second_per_grid_ts=[1.0, 1.0]), "sglang")
    with pytest.raises(ValueError, match="rule must be one of"):
        ours(c, "megatron")


@pytest.mark.parametrize("overlay,version", [(None, "5.24.0"), ("sglang-0.5.16", "5.12.1")])
def test_check_trainer_flags_transformers_rule_naming_the_component_and_the_fix(overlay, version):
    """``vidcache check-trainer``, as a user runs it: this environment's transformers (the venv's 5.24.0, and Miles'
    production 5.12.1) computes Qwen2-VL's and Qwen2.5-VL's positions by another rule than SGLang and vLLM."""
    for engine in ("sglang", "vllm"):
        p = run_cli(["check-trainer", "--engine", engine], inherit=EVERYTHING,
                    pythonpath=[os.path.join(OVERLAYS, overlay)] if overlay else [])
        assert p.returncode == 1, p.stdout + p.stderr
        lines = p.stdout.splitlines()
        for fam, cls in (("qwen2_vl", "Qwen2VLModel"), ("qwen2_5_vl", "Qwen2_5_VLModel")):
            (line,) = [ln for ln in lines if ln.startswith(f"FAIL [positions] {fam}:")]
            assert f"transformers {version} {cls}.get_rope_index" in line and f"than {engine}" in line
            assert f"vidcache.rope_positions(processor, ids, request=req, engine='{engine}')" in line
        for mt in ("qwen3_vl", "qwen3_5", "qwen3_5_moe"):     # one item per frame group: the same positions
            assert f"OK   {mt}: transformers' own positions are {engine}'s" in lines


def test_a_trainer_that_computes_the_engines_rule_passes(monkeypatch):
    """The check can pass: a model whose get_rope_index is SGLang's own rule (through use_engine_positions), or
    the Qwen3-VL family's own."""
    from vidcache.positions import patchable, trainer_rule_problem, use_engine_positions
    import importlib
    for module, name in patchable().values():
        cls = getattr(importlib.import_module(module), name)
        monkeypatch.setattr(cls, "get_rope_index", cls.get_rope_index)      # restored after the test
    assert trainer_rule_problem("qwen2_5_vl", "sglang") is not None
    use_engine_positions("sglang")
    for fam in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        assert trainer_rule_problem(fam, "sglang") is None and trainer_rule_problem(fam, "vllm") is None


def test_a_patched_model_scores_as_a_model_given_the_engines_positions(monkeypatch):
    """transformers' own Qwen2.5-VL (tiny, random weights): with use_engine_positions, its forward (positions
    computed inside, as Megatron-Bridge's model computes them) gives the logits of the unpatched model given
    ``vidcache.mrope``'s SGLang positions, bit for bit; without, they differ."""
    import importlib

    from support.toy_processors import build_processor

    from vidcache.positions import patchable, use_engine_positions
    from vidcache.testing import kl
    for module, name in patchable().values():
        cls = getattr(importlib.import_module(module), name)
        monkeypatch.setattr(cls, "get_rope_index", cls.get_rope_index)
    proc = build_processor("qwen2_5_vl")
    model = kl.tiny_model("qwen2_5_vl", proc)
    tok = proc.tokenizer.convert_tokens_to_ids
    grid = [12, 4, 4]                 # 12 groups over 2 x 2 merged patches: time dominates
    ids = [10, 11, tok("<|vision_start|>")] + [tok("<|video_pad|>")] * 48 + [tok("<|vision_end|>")] + list(range(20, 40))
    torch.manual_seed(0)
    tensors = {"pixel_values_videos": torch.randn(12 * 16, 1176), "video_grid_thw": torch.tensor([grid]),
               "second_per_grid_ts": torch.tensor([1.0])}
    pos = mrope.positions(ids, rule="sglang", family="qwen2_5_vl", merge=2, tokens_per_second=2,
                          image_token_id=tok("<|image_pad|>"), video_token_id=tok("<|video_pad|>"),
                          video_grid_thw=[grid], second_per_grid_ts=torch.tensor([1.0]))
    given = kl.response_logits(model, proc, ids[:-10], ids[-10:], tensors, pos)
    own = kl.response_logits(model, proc, ids[:-10], ids[-10:], tensors)
    assert not torch.equal(given, own)
    use_engine_positions("sglang")
    assert torch.equal(kl.response_logits(model, proc, ids[:-10], ids[-10:], tensors), given)
