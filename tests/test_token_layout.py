"""Token layouts (``vidcache.token_layout``, ``processing.layout_of`` / ``request_layout`` / ``to_layout``).

The golden tests spell out, byte by byte with the toy tokenizer (every byte one id, specials after), the exact
ids around one video in each family's layouts: wrapper tokens, the ``<t seconds>`` text and the pad counts.  A
flipped wrapper rule, a detection that reads the wrong layout, or a conversion that moves anything else fails
them.  They run under the main venv's transformers and again under each overlay (tests/test_transformers_matrix.py),
so every verified release is held to the same goldens.
"""
from types import SimpleNamespace

import pytest
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

from support.toy_processors import TOKEN_IDS, build_processor, token_ids

from vidcache.errors import ParityError, TokenLayoutError
from vidcache.processing import VIDEO_PLACEHOLDER, expanded_ids, layout_of, request_layout
from vidcache.sglang.request import check_prompt_ids
from vidcache.families import FAMILIES
from vidcache.token_layout import (ENV_LAYOUT, VERIFIED_TRANSFORMERS, convert, env_layout,
                                   implied_layout, layout_difference)

VS, VE, PAD = TOKEN_IDS["<|vision_start|>"], TOKEN_IDS["<|vision_end|>"], TOKEN_IDS["<|video_pad|>"]
IM_START = TOKEN_IDS["<|im_start|>"]
PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Hi"


def entry(family, grid, fps=1.0, indices=(0, 2, 4, 6)):
    """The manifest fields the id path reads: a video of 4 frames sampled at 0, 2, 4, 6 s (1 fps source)."""
    return SimpleNamespace(family=family, num_frames=len(indices),
                           tokens=SimpleNamespace(video_grid_thw=grid),
                           source=SimpleNamespace(average_fps_from_decoder=fps),
                           sampling=SimpleNamespace(frame_indices=list(indices), total_num_frames=8))


def b(text: str) -> list[int]:
    return list(text.encode())


# Qwen3-VL, grid (2, 4, 4): 2 temporal groups of 4x4 patches, merge 2 -> 4 pads each; each group's time is the
# mean of its two frames' (0 and 2 s -> 1.0; 4 and 6 s -> 5.0).
GROUPS = b("<1.0 seconds>") + [VS] + [PAD] * 4 + [VE] + b("<5.0 seconds>") + [VS] + [PAD] * 4 + [VE]
GOLDEN = {
    ("qwen3_vl", "collapsed"): [IM_START] + b("user\n") + GROUPS + b("Hi"),
    ("qwen3_vl", "wrapped"): [IM_START] + b("user\n") + [VS] + GROUPS + [VE] + b("Hi"),
    # Qwen2.5-VL, grid (2, 4, 4): 2 * 4 * 4 / 4 = 8 pads inside the template's own pair, no text.
    ("qwen2_5_vl", "plain"): [IM_START] + b("user\n") + [VS] + [PAD] * 8 + [VE] + b("Hi"),
    ("qwen2_vl", "plain"): [IM_START] + b("user\n") + [VS] + [PAD] * 8 + [VE] + b("Hi"),
}


@pytest.mark.parametrize("family,layout", sorted(GOLDEN))
def test_golden_ids_around_a_video(family, layout):
    proc = build_processor(family)
    got = expanded_ids(proc, PROMPT, [entry(family, (2, 4, 4))], mode="plugin", token_layout=layout)
    assert got == GOLDEN[family, layout]


def test_the_golden_layouts_differ_by_the_wrapper_pair_only():
    c, w = GOLDEN["qwen3_vl", "collapsed"], GOLDEN["qwen3_vl", "wrapped"]
    assert len(w) - len(c) == 2 and w.count(VS) == c.count(VS) + 1 == 3 and w.count(VE) == 3
    assert c[:1 + 5] == [IM_START] + b("user\n") and c[6:6 + 13] == b("<1.0 seconds>")   # starts <t seconds>
    assert w[6] == VS and w[7:7 + 13] == b("<1.0 seconds>")


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_the_processor_expands_in_the_layout_it_is_probed_to(family):
    """The probe reads the processor's own call, and the processor's own ids for the golden entry are the golden
    of that layout: so the probe, the goldens and this transformers release agree."""
    proc = build_processor(family)
    native = layout_of(proc, family)
    e = entry(family, (2, 4, 4))
    from vidcache.processing import video_replacements
    text = proc.get_text_with_replacements([PROMPT], videos_replacements=video_replacements(proc, [e], "plugin"))[0][0]
    assert list(proc.tokenizer(text, add_special_tokens=False)["input_ids"]) == GOLDEN[family, native]
    if transformers.__version__ in VERIFIED_TRANSFORMERS:      # the release table says the same for the verified ones
        assert implied_layout(family, transformers.__version__) == native


# Qwen3.5 / 3.6 / 3.8 (their own model types, Qwen3-VL's processor): the goldens above with the real ids of the
# published checkpoints (families' table: vision_start 248053, vision_end 248054, video_pad 248057).
MODEL_TYPES = ("qwen3_5", "qwen3_5_moe", "qwen4_exp")


def real_golden(model_type: str, layout: str) -> list[int]:
    ids = token_ids(model_type)
    vs, ve, pad = ids["<|vision_start|>"], ids["<|vision_end|>"], ids["<|video_pad|>"]
    table = {VS: vs, VE: ve, PAD: pad, IM_START: vs - 8}       # <|im_start|> sits 8 below vision_start (Qwen's order)
    return [table.get(t, t) for t in GOLDEN["qwen3_vl", layout]]


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_qwen3_5_model_types_have_qwen3_vl_layouts_with_their_own_ids(model_type):
    """Both layouts, id for id, with the real special ids; the processor's own expansion is the layout the probe
    reads, and (a verified release) the one the release table implies: 5.25 collapses these models too."""
    assert [token_ids(model_type)[t] for t in ("<|vision_start|>", "<|vision_end|>", "<|video_pad|>")] == \
        [248053, 248054, 248057]
    proc = build_processor(model_type)
    e = entry("qwen3_vl", (2, 4, 4))
    for layout in FAMILIES["qwen3_vl"].layouts:
        got = expanded_ids(proc, PROMPT, [e], mode="plugin", token_layout=layout)
        assert got == real_golden(model_type, layout) and max(got) == 248057
    native = layout_of(proc, "qwen3_vl")
    from vidcache.processing import video_replacements
    text = proc.get_text_with_replacements([PROMPT], videos_replacements=video_replacements(proc, [e], "plugin"))[0][0]
    assert list(proc.tokenizer(text, add_special_tokens=False)["input_ids"]) == real_golden(model_type, native)
    if transformers.__version__ in VERIFIED_TRANSFORMERS:
        assert implied_layout("qwen3_vl", transformers.__version__) == native


def test_request_layout_defaults(monkeypatch):
    monkeypatch.delenv(ENV_LAYOUT, raising=False)
    proc = build_processor("qwen3_vl")
    assert request_layout(proc, "qwen3_vl", "plugin") == FAMILIES["qwen3_vl"].model_layout == "collapsed"
    assert request_layout(proc, "qwen3_vl", "stock") == layout_of(proc, "qwen3_vl")
    assert request_layout(proc, "qwen3_vl", "stock", "wrapped") == "wrapped"
    monkeypatch.setenv(ENV_LAYOUT, "qwen3_vl:wrapped")
    assert request_layout(proc, "qwen3_vl", "plugin") == "wrapped"
    assert request_layout(build_processor("qwen2_5_vl"), "qwen2_5_vl", "plugin") == "plain"
    monkeypatch.setenv(ENV_LAYOUT, "wrapped")                    # a bare name: every family that has it
    assert env_layout("qwen3_vl") == "wrapped" and env_layout("qwen2_5_vl") is None
    monkeypatch.setenv(ENV_LAYOUT, "qwen3_vl:plain")
    with pytest.raises(TokenLayoutError, match="qwen3_vl has no token layout 'plain'"):
        request_layout(proc, "qwen3_vl", "plugin")
    with pytest.raises(TokenLayoutError, match="no token layout 'sideways'"):
        request_layout(proc, "qwen3_vl", "plugin", "sideways")


def test_implied_layouts_by_release():
    assert [implied_layout("qwen3_vl", v) for v in ("4.57.6", "5.12.1", "5.19.0", "5.24.0", "5.25.0", "5.26.1")] == \
        ["collapsed", "wrapped", "wrapped", "wrapped", "collapsed", "collapsed"]
    assert implied_layout("qwen3_vl", "4.50.0") is None and implied_layout("qwen3_vl", None) is None
    assert implied_layout("qwen2_5_vl", "5.25.0") == "plain"


def test_convert_refuses_ids_not_in_the_layout_they_are_said_to_be_in():
    rep = GROUPS
    with pytest.raises(TokenLayoutError, match="not wrapped"):
        convert(GOLDEN["qwen3_vl", "collapsed"], [rep], "wrapped", "collapsed", VS, VE)
    with pytest.raises(TokenLayoutError, match="already wrapped"):
        convert(GOLDEN["qwen3_vl", "wrapped"], [rep], "collapsed", "wrapped", VS, VE)
    with pytest.raises(TokenLayoutError, match="not in the prompt's ids"):
        convert(GOLDEN["qwen3_vl", "wrapped"], [rep + [PAD]], "wrapped", "collapsed", VS, VE)
    with pytest.raises(TokenLayoutError, match="no conversion"):
        convert([], [], "plain", "wrapped", VS, VE)


text_ids = st.lists(st.integers(0, 255), max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(text_ids, st.integers(1, 4), st.integers(1, 5)), min_size=1, max_size=3), text_ids)
def test_convert_round_trips_and_moves_only_the_pair(videos, tail):
    """Any prompt of text and videos (each: text before it, its groups, pads per group): collapsed -> wrapped
    adds exactly one pair per video and back gives the same ids."""
    collapsed, wrapped, reps = [], [], []
    for before, groups, pads in videos:
        rep = []
        for g in range(groups):
            rep += b(f"<{g}.5 seconds>") + [VS] + [PAD] * pads + [VE]
        reps.append(rep)
        collapsed += before + rep
        wrapped += before + [VS] + rep + [VE]
    collapsed, wrapped = collapsed + tail, wrapped + tail
    assert convert(collapsed, reps, "collapsed", "wrapped", VS, VE) == wrapped
    assert convert(wrapped, reps, "wrapped", "collapsed", VS, VE) == collapsed
    assert layout_difference(wrapped, collapsed).startswith("token layout: the trainer's ids carry")


def test_the_id_guard_names_the_token_layout():
    c, w = GOLDEN["qwen3_vl", "collapsed"], GOLDEN["qwen3_vl", "wrapped"]
    with pytest.raises(ParityError, match=r"token layout: the server's ids carry 1 extra pair.*Fix: plugin mode"):
        check_prompt_ids(c, {"prompt_token_ids": w})
    with pytest.raises(ParityError, match="Check that the server runs with") as e:
        check_prompt_ids(c, {"prompt_token_ids": c[:-1] + [c[-1] + 1]})      # another difference: not a layout
    assert "token layout" not in str(e.value)
    assert all(f.model_layout in f.layouts for f in FAMILIES.values())
