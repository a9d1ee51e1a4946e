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
    assert cli(["inspect", key, "--cache", str(tmp_path / "c"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    m = c.manifest(key)
    want = aspect_distortion(m.source.width_from_decoder, m.source.height_from_decoder, m.width, m.height)
    assert out["aspect"]["distortion"] == round(want, 4) and m.aspect_distortion == want
    assert out["aspect"]["source"].startswith("426x238")


def test_prewarm_names_an_unverified_transformers_once(tmp_path, videos):
    """CLI only, on a fresh node: a transformers release the layout tests did not run (a distribution record of
    5.99.0 first on the path, as an image with another release has) draws one warning for Qwen3-VL, naming the
    verified releases, and none for Qwen2.5-VL (one layout in every release)."""
    from support.cli import run_cli
    from vidcache.token_layout import VERIFIED_TRANSFORMERS
    fake = tmp_path / "site" / "transformers-5.99.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 5.99.0\n")
    ds = _ds(tmp_path, videos["ffv1_10_small"])
    for family, warned in (("qwen3_vl", True), ("qwen2_5_vl", False)):
        r = run_cli(["prewarm", ds, "--family", family, "--no-progress"], tmp_path / "node",
                    inherit=("PATH", "HOME", "LANG"), pythonpath=tmp_path / "site", timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = [ln for ln in r.stderr.splitlines() if "unverified" in ln]
        assert len(lines) == int(warned), r.stderr
        if warned:
            assert "transformers 5.99.0" in lines[0] and ", ".join(VERIFIED_TRANSFORMERS) in lines[0]


def test_doctor_names_a_pin_vidcache_would_fight(tmp_path):
    """Issue 33, CLI only: inside an image whose transformers is below vidcache's floor (a distribution record of
    5.10.0 first on the path), doctor fails that line, naming the floor and that installing would replace the pin;
    Miles' own image (transformers 5.12.1, scripts/setup_sglang_overlay.sh) draws no such line."""
    from pathlib import Path

    import pytest

    from support.cli import run_cli
    fake = tmp_path / "site" / "transformers-5.10.0.dist-info"
    fake.mkdir(parents=True)
    (fake / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 5.10.0\n")
    shell = ("PATH", "HOME", "LANG")
    r = run_cli(["doctor", "--fast"], tmp_path / "node", inherit=shell, pythonpath=tmp_path / "site")
    line = next(ln for ln in r.stdout.splitlines() if " transformers " in ln)
    assert r.returncode == 1 and line.startswith("FAIL") and "5.10.0" in line and ">=5.12.1" in line, r.stdout
    assert "replace this image's pin" in line
    miles = Path(__file__).resolve().parent.parent / ".overlays" / "sglang-0.5.16"
    if not miles.parent.is_dir():
        pytest.skip("no overlays (.overlays/): run scripts/install.sh --test for the Miles-image half")
    r = run_cli(["doctor", "--fast"], tmp_path / "node", inherit=shell, pythonpath=miles)
    line = next(ln for ln in r.stdout.splitlines() if " transformers " in ln)
    assert line.startswith("OK") and "5.12.1" in line and "UNVERIFIED" not in line, r.stdout


def test_tier_id_and_doctor_open_the_tier_as_a_cache_does(tmp_path, monkeypatch, capsys):
    """``tier-id`` and ``doctor`` open the shared tier through ``vidcache.config.open_shared_tier``, the one way
    every command opens it: the same storage options and object-size cap as the tier of the node's cache."""
    import vidcache.config as config
    node, tier = str(tmp_path / "node"), str(tmp_path / "tier")
    (tmp_path / "tier").mkdir()
    opened = []

    def spy(url, **kw):
        opened.append(store := real(url, **kw))
        return store
    real = config.open_shared_tier
    monkeypatch.setattr(config, "open_shared_tier", spy)
    assert cli(["tier-id", "--init", "--cache", node, "--shared", tier]) == 0
    ident = capsys.readouterr().out.strip()
    assert cli(["tier-id", "--cache", node, "--shared", tier]) == 0
    assert capsys.readouterr().out.strip() == ident
    cli(["doctor", "--fast", "--cache", node, "--shared", tier])
    assert f"{tier}: reachable, identity {ident}" in capsys.readouterr().out
    assert len(opened) == 3
    monkeypatch.setattr(config, "open_shared_tier", real)
    want = VideoCache(node, shared=tier, read_only=True).config.shared_store()
    for store in opened:
        assert (store.max_object_bytes, store.storage_options) == (want.max_object_bytes, want.storage_options)
