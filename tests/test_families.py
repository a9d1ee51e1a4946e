"""A model family is one record (``vidcache.families``): every table keyed by family covers every family, no module
outside the records tests a family's name, and a family added at test time is handled with no other edit.

The newcomer's change (issue 52, item 6): a fictitious family ``toy_vl`` with its own patch size (10, so its grid is
20 where the real families have 28 and 32) and Qwen2-VL's temporal rule is registered by adding its ``Family`` and
``ModelType`` records and its rows in the engine tables that ``ENGINE_TABLES`` names; options, frame building,
token counts, positions and both config commands then handle it.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vidcache import families
from vidcache.families import FAMILIES, MODEL_TYPES, Family, ModelType

ROOT = Path(__file__).resolve().parents[1]


def engine_tables() -> dict[str, dict]:
    """The per-family tables that stay with their engine (or with the test processors): each must cover every
    family.  A new family adds a row to each of these, and nothing else outside ``vidcache/families.py``."""
    from vidcache import sglang_facts
    from vidcache.testing import processors
    from vidcache.vllm import config as vllm_config
    return {"sglang_facts.HF_REFUSED_VIDEO_KEYS": sglang_facts.HF_REFUSED_VIDEO_KEYS,
            "vllm.config.OWN_LOADER": vllm_config.OWN_LOADER,
            "testing.processors.HUB_VIDEO_KWARGS": processors.HUB_VIDEO_KWARGS}


def test_every_engine_table_covers_every_family():
    for name, table in engine_tables().items():
        assert set(table) == set(FAMILIES), f"{name} covers {sorted(table)}, the families are {sorted(FAMILIES)}"
    from vidcache.sglang_facts import VISION_ACROSS_FRAMES
    assert set(VISION_ACROSS_FRAMES) <= set(FAMILIES)      # a subset by design: the families SGLang computes otherwise


def test_every_model_type_points_at_a_family_with_its_trainer_classes():
    for m in MODEL_TYPES.values():
        assert m.family in FAMILIES, m.name
        assert all(m.trainer_classes), f"{m.name} has no transformers classes for the trainer's position check"
        assert m.geometry == (m.fam.patch, m.fam.merge, m.fam.temporal_patch)
    for f in FAMILIES.values():
        assert f.temporal in families._TEMPORAL_RULES and f.model_layout in f.layouts, f.name


# A family's name compared with a literal: what the records replace.  testing/ builds transformers' own classes
# per family (the tiny models' configs), which is what a record cannot say.
_NAME_TEST = re.compile(r"""family\s*[!=]=\s*["']qwen|["']qwen[0-9_a-z]*["']\s*[!=]=\s*\w*family""")


def test_no_module_tests_a_family_by_name():
    found = []
    for path in [*(ROOT / "vidcache").rglob("*.py"), *(ROOT / "miles_integration").rglob("*.py")]:
        rel = path.relative_to(ROOT).as_posix()
        if rel in ("vidcache/families.py",) or rel.startswith("vidcache/testing/"):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _NAME_TEST.search(line):
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "ask the family's record for a trait instead:\n" + "\n".join(found)


# --- the newcomer's change --------------------------------------------------------------------------------------
TOY = Family("toy_vl", patch=10, merge=2, temporal_patch=2, temporal="index", layouts=("plain",),
             model_layout="plain")
TOY_TYPE = ModelType("toy_vl", "toy_vl", ("ToyVLForConditionalGeneration",), "ToyVLProcessor",
                     "ToyVLVideoProcessor", (151652, 151653, 151655, 151656), 152064, ("5.24.0",),
                     trainer_classes=("Qwen2VLConfig", "Qwen2VLModel"))


@pytest.fixture
def toy_family(monkeypatch):
    """Register ``toy_vl`` the way a contributor adds a family: its records, and a row in each engine table."""
    monkeypatch.setitem(FAMILIES, TOY.name, TOY)
    monkeypatch.setitem(MODEL_TYPES, TOY_TYPE.name, TOY_TYPE)
    rows = {"sglang_facts.HF_REFUSED_VIDEO_KEYS": ("total_pixels",), "vllm.config.OWN_LOADER": "qwen2_vl",
            "testing.processors.HUB_VIDEO_KWARGS": {"size": {"shortest_edge": 3136, "longest_edge": 12845056}}}
    tables = engine_tables()
    assert set(rows) == set(tables), "a table this test does not fill: add its toy_vl row here"
    for name, row in rows.items():
        monkeypatch.setitem(tables[name], TOY.name, row)
    return TOY


def test_a_new_family_is_handled_everywhere_it_is_asked(toy_family, videos, cache):
    from vidcache.manifest import grid_thw, pad_tokens
    from vidcache.options import VideoOptions
    from vidcache.sglang.config import sglang_config
    from vidcache.sglang_facts import default_mode, stock_grid, stock_sglang_problems
    from vidcache.vllm.config import engine_kwargs

    # Options: its grid is patch x merge, and every default follows from it.
    opts = VideoOptions(family="toy_vl", nframes=4)
    assert opts.factor == 20 and opts.resolved().size_factor == 20
    assert opts.resolved().min_pixels == VideoOptions(family="qwen2_vl").resolved().min_pixels // 28 ** 2 * 20 ** 2

    # Frames: a real clip decoded, sampled and resized onto its own 20-pixel grid; token counts from its geometry.
    m = cache.manifest(cache.ensure(next(iter(videos.values())), opts).key)
    t, _, height, width = m.frames.shape
    assert height % 20 == 0 and width % 20 == 0 and m.family == "toy_vl"
    assert tuple(m.tokens.video_grid_thw) == grid_thw(opts, t, height, width) == (t // 2, height // 10, width // 10)
    assert m.tokens.video_pad_tokens == pad_tokens(m.tokens.video_grid_thw, opts) == t // 2 * height * width // 400

    # Positions: its temporal rule is Qwen2-VL's ("index"), so its positions are Qwen2-VL's on the same ids.
    from vidcache.mrope import positions
    grid = [[2, 4, 6]]
    ids = [1, 2, 151652] + [151656] * (2 * 4 * 6 // 4) + [151653, 3]
    kw = dict(rule="sglang", merge=2, image_token_id=151655, video_token_id=151656, video_grid_thw=grid)
    assert torch.equal(positions(ids, family="toy_vl", **kw), positions(ids, family="qwen2_vl", **kw))

    # SGLang's config: stock SGLang resizes to 28, so toy_vl's frames only survive on lcm(28, 20) = 140 or through
    # the plugin, which is then its default mode; the stock check says so.
    assert stock_grid("toy_vl") == 140 and default_mode("toy_vl") == "plugin"
    assert sglang_config("toy_vl")["mode"] == "plugin"
    assert any("140" in p for p in stock_sglang_problems("toy_vl", 20))
    assert VideoOptions.for_stock_sglang("toy_vl").size_factor == 140
    # vLLM's config: its own loader row.
    assert engine_kwargs("toy_vl")["media_io_kwargs"]["video"]
    # The CLI's family argument knows it, from the records.
    from vidcache.cli.common import family_arg
    assert family_arg("toy_vl") == "toy_vl"


def test_a_family_without_its_engine_rows_is_caught(monkeypatch):
    """Half-adding a family (the records but no engine rows) fails the covering test, not a user's run."""
    monkeypatch.setitem(FAMILIES, TOY.name, TOY)
    with pytest.raises(AssertionError, match="toy_vl"):
        test_every_engine_table_covers_every_family()


# --- an engine is one record too -----------------------------------------------------------------------------
def test_every_engine_record_has_its_adapter_and_rule():
    from vidcache.engines import ENGINES
    from vidcache.mrope import RULES
    for e in ENGINES.values():
        assert callable(e.adapter("check").check_server), e.name
        assert callable(e.adapter("computation").check_computation), e.name
        assert e.name in RULES and e.verified, e.name


def test_the_cli_offers_the_engines_of_the_records():
    """``--engine``'s choices come from the records: the parser refuses a name no record has, naming the ones
    there are."""
    from support.cli import run_cli
    from vidcache.engines import ENGINES
    out = run_cli(["check-trainer", "--engine", "nosuch"])
    assert out.returncode == 2
    for name in ENGINES:
        assert name in out.stderr
    for e in ENGINES.values():                      # each record's config command is one the CLI has
        assert run_cli([e.config_command, "--help"]).returncode == 0, e.config_command
