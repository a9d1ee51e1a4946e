"""D61: a checkpoint whose config files hold a field of the wrong type is refused by `--model DIR` commands with a
`[model_type]` error naming the file, the field and its type, never a traceback; `"patch_size": "16"` no longer
reads as "16/2/2 (expected 16/2/2)"."""
import json

import pytest

from support.cli import SHELL, run_cli
from support.toy_processors import save_checkpoint


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One saved Qwen3.5 checkpoint; each case copies its files and changes one field."""
    d = tmp_path_factory.mktemp("ckpt") / "qwen3_5"
    save_checkpoint("qwen3_5", d)
    return {p.name: p.read_text() for p in d.iterdir()}


def _top(cfg, **kw):
    cfg.update(kw)


def _video(cfg, **kw):
    cfg["video_processor"].update(kw)


def _vision(cfg, **kw):
    cfg["vision_config"].update(kw)


CASES = [   # (file, edit, the field as the error names it, its type)
    ("config.json", lambda c: _top(c, model_type=["qwen3_5"]), "config.json: model_type", "list"),
    ("config.json", lambda c: _top(c, model_type={"name": "qwen3_5"}), "config.json: model_type", "dict"),
    ("processor_config.json", lambda c: _top(c, processor_class=["Qwen3VLProcessor"]),
     "processor_config.json: processor_class", "list"),
    ("processor_config.json", lambda c: _video(c, video_processor_type=["Qwen3VLVideoProcessor"]),
     "processor_config.json video_processor: video_processor_type", "list"),
    ("processor_config.json", lambda c: _video(c, video_processor_type=7),
     "processor_config.json video_processor: video_processor_type", "int"),
    ("config.json", lambda c: _vision(c, patch_size="16"), "config.json vision_config: patch_size", "str"),
    ("processor_config.json", lambda c: _video(c, merge_size=2.0),
     "processor_config.json video_processor: merge_size", "float"),
]


def _write(tmp_path, saved, name: str, text: str):
    d = tmp_path / "ckpt"
    d.mkdir()
    for n, t in saved.items():
        (d / n).write_text(text if n == name else t)
    return d


def _sglang_config(tmp_path, d):
    return run_cli(["sglang-config", "--model", str(d)], tmp_path / "node", inherit=SHELL,
                   env={"HF_HUB_OFFLINE": "1"}, timeout=300)


@pytest.mark.parametrize("name, edit, field, typ", CASES, ids=[f"{c[2].split(': ')[1]}-{c[3]}" for c in CASES])
def test_cli_refuses_a_config_field_of_the_wrong_type_naming_it(tmp_path, saved, name, edit, field, typ):
    """Before: TypeError tracebacks (a list or dict model_type, a list processor_class, a list or int
    video_processor_type) and, for "16", a refusal reading "16/2/2 (expected 16/2/2)"."""
    cfg = json.loads(saved[name])
    edit(cfg)
    d = _write(tmp_path, saved, name, json.dumps(cfg))
    r = _sglang_config(tmp_path, d)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith("vidcache: error: [model_type] "), r.stderr
    assert f"{d}/{field} is a {typ} (" in r.stderr, r.stderr
    want = "an integer" if "size" in field else "a string"
    assert f"expected {want}" in r.stderr, r.stderr


def test_cli_refuses_a_config_nested_too_deeply(tmp_path, saved):
    """Before: a 100k-deep config.json raised RecursionError (a traceback)."""
    d = _write(tmp_path, saved, "config.json", "[" * 100_000 + "]" * 100_000)
    r = _sglang_config(tmp_path, d)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.startswith(f"vidcache: error: [model_type] cannot read {d}/config.json: "), r.stderr
    assert "nested too deeply" in r.stderr, r.stderr


def test_a_sound_copy_still_derives(tmp_path, saved):
    """The same files unchanged: the checks above refuse the field, not the checkpoint."""
    r = _sglang_config(tmp_path, _write(tmp_path, saved, "", ""))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)
