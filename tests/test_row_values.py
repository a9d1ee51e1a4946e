"""Every JSON value anywhere in a row is that row's fate (issue 18, D16).

``NaN``, ``Infinity`` and ``1e400`` are valid JSON for Python's ``json``; a per-video option holding one
used to reach the key's digest (``allow_nan=False``) and crash the whole prewarm.
"""
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vidcache import VideoOptions
from vidcache.dataset import ITEM_KEYS, video_items
from vidcache.errors import BadRowError, OptionsError
from vidcache.options import CONTENT_ITEM_KEYS
from vidcache.planning import plan

from support.cli import SHELL, run_cli

# Each raw line as a user's file may hold it (Python's json writes NaN/Infinity unquoted, and reads 1e400 as inf).
NON_FINITE_ROWS = [
    '{"prompt": "<video>", "videos": [{"video": "%s", "fps": NaN}]}',
    '{"prompt": "<video>", "videos": [{"video": "%s", "fps": Infinity}]}',
    '{"prompt": "<video>", "videos": [{"video": "%s", "fps": 1e400}]}',
    '{"prompt": "<video>", "videos": [{"video": "%s", "video_start": NaN}]}',
    '{"prompt": "<video>", "videos": [{"video": "%s", "video_end": Infinity}]}',
    '{"prompt": "<video>", "videos": [{"video": "%s", "total_pixels": -Infinity}]}',
    '{"prompt": [{"role": "user", "content": [{"type": "video", "video": "%s", "fps": NaN}]}]}',
    '{"prompt": "<video>", "videos": [{"video": "%s", "nframes": 1' + "0" * 5000 + '}]}',
    '{"prompt": "<video>", "videos": [{"video": "%s", "size_factor": 56}]}',      # not a per-video key
    '{"prompt": "<video>", "videos": [{"video": "%s", "max_pixel": 50000}]}',     # misspelt
]


def test_non_finite_and_unknown_per_video_values_cost_only_their_rows(tmp_path, videos):
    good = [videos["ffv1_10_small"], videos["mjpeg_24"]]
    lines = [json.dumps({"prompt": "<video>", "videos": [good[0]]})]
    lines += [row % good[1] for row in NON_FINITE_ROWS]
    lines += [json.dumps({"prompt": "<video>", "videos": [{"video": good[1], "fps": 1.0}]})]
    ds = tmp_path / "d.jsonl"
    ds.write_text("\n".join(lines) + "\n")
    fails = tmp_path / "failures.jsonl"
    # what a user's shell has: the two vidcache settings, and enough to start Python
    r = run_cli(["prewarm", str(ds), "--no-progress", "--failures", str(fails), "--allow-failures"],
                tmp_path / "node", tmp_path / "shared", inherit=SHELL, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert "2 new" in r.stdout and f"{len(NON_FINITE_ROWS)} failed" in r.stdout, r.stdout
    got = {rec["row"]: rec for rec in map(json.loads, fails.read_text().splitlines())}
    assert sorted(got) == list(range(1, 1 + len(NON_FINITE_ROWS)))
    assert {rec["kind"] for rec in got.values()} == {"bad_row"}
    assert all(len(rec["error"]) < 2000 for rec in got.values())       # a 5000-digit number is not echoed
    assert "unknown per-video key" in got[9]["error"] and "size_factor" in got[9]["error"]
    assert "max_pixel" in got[10]["error"]
    r = run_cli(["verify", "--shared"], tmp_path / "node", tmp_path / "shared", inherit=SHELL)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10 ** 400, 2 ** 53 + 1, "1", None])
@pytest.mark.parametrize("name", ["fps", "video_start", "video_end", "total_pixels", "nframes", "max_pixels"])
def test_options_refuse_values_with_no_key(name, value):
    if value is None:
        assert getattr(VideoOptions(**{name: None}), name) is None
        return
    if name in ("fps", "video_start", "video_end", "total_pixels") and value == 2 ** 53 + 1:
        VideoOptions(**{name: value}).digest          # a finite number is fine for a float option
        return
    with pytest.raises(OptionsError):
        VideoOptions(**{name: value})


# --- arbitrary JSON anywhere in a row ----------------------------------------------------------------
json_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                         st.sampled_from([10 ** 400, 0, 1, 2, 8, 28, 56, 2 ** 53, 2 ** 53 + 1]),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)
item_key = st.one_of(st.sampled_from(sorted(ITEM_KEYS | {"size_factor", "family", "image"})), st.text(max_size=6))
video_item = st.one_of(
    json_values,
    st.fixed_dictionaries({"video": st.one_of(st.just("a.mp4"), json_values)},
                          optional={"type": st.sampled_from(["video", "text"]) | json_values}).flatmap(
        lambda d: st.dictionaries(item_key, json_values, max_size=3).map(lambda extra: {**extra, **d})),
    st.dictionaries(st.sampled_from(CONTENT_ITEM_KEYS), json_values, max_size=3).map(
        lambda d: {"video": "a.mp4", **d}),
)
rows = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={
        "prompt": st.one_of(st.just("<video>"), json_values,
                            st.lists(st.fixed_dictionaries({"role": st.just("user"), "content": st.one_of(
                                json_values, st.lists(video_item.map(lambda d: {"type": "video", **d}
                                                                     if isinstance(d, dict) else d),
                                                      max_size=2))}), max_size=2)),
        "videos": st.one_of(json_values, st.lists(st.one_of(st.just("a.mp4"), video_item), max_size=3)),
        "label": json_values}),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(row=rows)
def test_any_json_row_is_accepted_or_its_own_bad_row(tmp_path, row):
    """``video_items`` either accepts a row (every option has a digest) or refuses it with ``BadRowError``;
    and the prewarm planner around it never loses the good rows beside it."""
    try:
        items = video_items(row, VideoOptions(), base_dir=str(tmp_path))
    except BadRowError:
        accepted = False
    else:
        accepted = True
        for src, opts in items:
            assert isinstance(src, str) and src
            assert len(opts.digest) == 32
    good = json.dumps({"prompt": "<video>", "videos": ["good.mp4"]})
    ds = tmp_path / "d.jsonl"
    with open(ds, "w") as f:        # json.dumps writes NaN/Infinity as Python's json reads them back
        f.write("\n".join([good, json.dumps(row, allow_nan=True), good]) + "\n")
    tasks, bad = plan(str(ds), VideoOptions())
    assert [b["kind"] for b in bad] == ([] if accepted else ["bad_row"])
    assert all(b["row"] == 1 for b in bad)
    good_rows = sorted(r for t in tasks if t.source == str(tmp_path / "good.mp4") for r in t.rows)
    assert good_rows == [0, 2]
