"""The CLI says which SGLang path the options allow, and what the manifest says about distortion."""
import json

from vidcache import VideoCache, VideoOptions
from vidcache.cli import main as cli
from vidcache.loader.resize import aspect_distortion


def _ds(tmp_path, video):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "<video>", "videos": [video]}) + "\n")
    return str(p)


def test_prewarm_says_qwen3_defaults_need_the_plugin(tmp_path, videos, capsys):
    ds = _ds(tmp_path, videos["ffv1_10_small"])
    assert cli(["prewarm", ds, "--cache", str(tmp_path / "c"), "--family", "qwen3_vl", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "plugin mode only" in err and "32-pixel grid" in err
    assert cli(["prewarm", ds, "--cache", str(tmp_path / "c"), "--family", "qwen3_vl", "--size-factor", "224",
                "--no-progress"]) == 0
    assert "stock and plugin modes" in capsys.readouterr().err


def test_sglang_config_names_the_qwen3_stock_limit(capsys):
    assert cli(["sglang-config", "--family", "qwen3_vl", "--mode", "stock"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["mode"] == "stock" and "224 grid" in out.err and "--mode plugin" in out.err
    assert cli(["sglang-config", "--family", "qwen3_vl", "--mode", "plugin"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["env"]["SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE"] == "vidcache.sglang.plugin"
    assert "VIDCACHE_SHARED" in cfg["env"] and "VIDCACHE_DIR" in cfg["env"]


def test_sglang_config_lifts_the_url_cap_for_big_frozen_files(tmp_path, videos, capsys):
    from vidcache.sglang.config import SGLANG_URL_CAP, url_cap_args
    assert url_cap_args(SGLANG_URL_CAP) == []
    assert url_cap_args(SGLANG_URL_CAP + 1) == ["--media-url-max-file-size-mb", "66"]
    c = VideoCache(tmp_path / "c")
    c.ensure(videos["ffv1_10_small"], VideoOptions())
    assert cli(["sglang-config", "--family", "qwen2_5_vl", "--cache", str(tmp_path / "c")]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert "--media-url-max-file-size-mb" not in cfg["server_args"] and cfg["cache"]["identity"] == c.identity


def test_inspect_shows_source_vs_stored_aspect(tmp_path, videos, capsys):
    c = VideoCache(tmp_path / "c")
    key = c.ensure(videos["mpeg4_25_odd"], VideoOptions(family="qwen3_vl")).key
    assert cli(["inspect", key, "--cache", str(tmp_path / "c")]) == 0
    out = json.loads(capsys.readouterr().out)
    m = c.manifest(key)
    want = aspect_distortion(m.source.width_from_decoder, m.source.height_from_decoder, m.width, m.height)
    assert out["aspect"]["distortion"] == round(want, 4) and m.aspect_distortion == want
    assert out["aspect"]["source"].startswith("426x238")
