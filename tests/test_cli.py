import json

from PIL import Image

from vidcache.cli import main as cli


def test_stats_inspect_and_contact_sheet(tmp_path, videos, capsys):
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["h264_ntsc"]]}) + "\n")
    c = str(tmp_path / "cache")
    assert cli(["prewarm", str(ds), "--cache", c, "--no-progress", "--family", "qwen3_vl"]) == 0
    capsys.readouterr()
    assert cli(["stats", "--cache", c]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["entries"] == 1 and st["blobs"] == 1 and st["sources"] == 1
    png = tmp_path / "sheet.png"
    assert cli(["inspect", videos["h264_ntsc"], "--cache", c, "--family", "qwen3_vl", "--contact-sheet", str(png)]) == 0
    out = capsys.readouterr().out
    meta = json.loads(out[: out.rindex("}") + 1])
    assert meta["video"]["fps_rational"] == "30000/1001" and meta["options"]["family"] == "qwen3_vl"
    img = Image.open(png)
    assert img.size[0] > 0 and len(set(img.convert("L").getdata())) > 10      # real pixels, not blank
    assert cli(["inspect", meta["key"], "--cache", c]) == 0                       # by key as well
    assert cli(["inspect", videos["h264_ntsc"], "--cache", c]) == 1               # other options: not cached


def test_sglang_config_json(capsys):
    for fam in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        for mode in ("stock", "plugin"):
            assert cli(["sglang-config", "--family", fam, "--mode", mode]) == 0
            cfg = json.loads(capsys.readouterr().out)
            v = cfg["mm_process_config"]["video"]
            assert v["fps"] == 2.0 and v["do_resize"] is False
            assert cfg["server_args"][0] == "--mm-process-config"
            assert json.loads(cfg["server_args"][1]) == cfg["mm_process_config"]
            assert ("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE" in cfg["env"]) == (mode == "plugin")


def test_demo_dataset_prewarms(tmp_path, capsys):
    assert cli(["demo", "--dir", str(tmp_path / "demo"), "--videos", "3", "--rows", "6"]) == 0
    assert cli(["prewarm", str(tmp_path / "demo" / "dataset.jsonl"), "--cache", str(tmp_path / "c"),
                "--no-progress"]) == 0
    assert "failed" in capsys.readouterr().out


def test_verify_finds_a_corrupted_blob(tmp_path, videos, capsys):
    from vidcache import VideoCache, VideoOptions
    c = VideoCache(tmp_path / "cache")
    good = c.ensure(videos["ffv1_10_small"], VideoOptions()).key
    bad = c.ensure(videos["mjpeg_24"], VideoOptions()).key
    assert cli(["verify", "--cache", c.path]) == 0
    assert "2 ok, 0 bad" in capsys.readouterr().out
    blob = "cas/" + c.manifest(bad)["frames"]["blob"]
    raw = bytearray(c.store.get(blob))
    raw[7] ^= 1
    c.store.set_many({blob: bytes(raw)})
    c.close()
    assert cli(["verify", "--cache", c.path]) == 1
    out = capsys.readouterr().out
    assert "1 ok, 1 bad" in out and f"BAD {bad}" in out and good not in out
