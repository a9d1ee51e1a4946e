import json
import os

import numpy as np
import pytest
import torch
from PIL import Image

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.cli import main as cli

from support.damage import flip_seen_by_decoder, flip_stored


def test_stats_inspect_and_contact_sheet(tmp_path, videos, capsys):
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["h264_ntsc"]]}) + "\n")
    c = str(tmp_path / "cache")
    assert cli(["prewarm", str(ds), "--cache", c, "--no-progress", "--family", "qwen3_vl"]) == 0
    capsys.readouterr()
    assert cli(["stats", "--json", "--cache", c]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["entries"] == 1 and st["blobs"] == 1 and st["sources"] == 1 and st["quarantined"] == 0
    assert st["identity"].startswith("local-") and st["path"] == c
    png = tmp_path / "sheet.png"
    assert cli(["inspect", videos["h264_ntsc"], "--cache", c, "--family", "qwen3_vl", "--contact-sheet", str(png),
                "--json"]) == 0
    out = capsys.readouterr().out
    meta = json.loads(out[: out.rindex("}") + 1])
    # The typed manifest, as JSON: provenance-carrying field names.
    assert meta["source"]["fps_from_header"] == "30000/1001" and meta["options"]["family"] == "qwen3_vl"
    assert meta["options"]["size_factor"] == 32 and meta["schema"] == 3                    # qwen3's own grid
    assert (meta["source"]["width_from_decoder"], meta["source"]["height_from_decoder"]) == (320, 240)
    t, _, h, w = meta["frames"]["shape"]
    assert meta["tokens"]["video_grid_thw"] == [t // 2, h // 16, w // 16]
    assert meta["sampling"]["frame_indices"][-1] == "..." or len(meta["sampling"]["frame_indices"]) == t
    # ...plus the aspect ratios, source and stored, and their distortion.
    aspect = meta["aspect"]
    assert aspect["source"] == "320x240 (1.333:1)" and aspect["stored"] == f"{w}x{h} ({w / h:.3f}:1)"
    assert aspect["distortion"] == round((w / h) / (320 / 240), 4) == round(meta["aspect_distortion"], 4)
    img = Image.open(png)
    assert img.size[0] > 0 and len(np.unique(np.asarray(img.convert("L")))) > 10      # real pixels, not blank
    assert cli(["inspect", meta["key"], "--cache", c, "--json"]) == 0                       # by key as well
    assert json.loads(capsys.readouterr().out.strip())["key"] == meta["key"]
    assert cli(["inspect", videos["h264_ntsc"], "--cache", c]) == 1               # other options: not cached...
    assert "it is cached under: --family qwen3_vl\n" in capsys.readouterr().err      # ...but under these
    assert cli(["inspect", str(ds), "--cache", c]) == 1                             # never prewarmed
    assert "prewarm it first" in capsys.readouterr().err


def test_prewarm_says_which_sglang_path_the_options_allow(tmp_path, videos, capsys):
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["mjpeg_24"]]}) + "\n")
    c = str(tmp_path / "cache")
    assert cli(["prewarm", str(ds), "--cache", c, "--no-progress", "--family", "qwen3_vl"]) == 0
    assert "plugin mode only" in capsys.readouterr().err
    assert cli(["prewarm", str(ds), "--cache", c, "--no-progress", "--family", "qwen3_vl", "--size-factor", "224"]) == 0
    assert "stock and plugin" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [["stats"], ["inspect", "0" * 32 + ".1." + "0" * 32], ["verify"]])
def test_read_only_commands_create_nothing(tmp_path, cmd, capsys):
    where = tmp_path / "nothing-here"
    assert cli(cmd + ["--cache", str(where)]) == 1
    err = capsys.readouterr().err
    assert "[config]" in err and "no vidcache cache at" in err and str(where) in err
    assert not where.exists()


def test_sglang_config_json(capsys):
    for fam in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        for mode in ("stock", "plugin"):
            assert cli(["sglang-config", "--family", fam, "--mode", mode]) == 0
            captured = capsys.readouterr()
            cfg = json.loads(captured.out)
            v = cfg["mm_process_config"]["video"]
            assert v["fps"] == 2.0 and v["do_resize"] is False
            assert cfg["server_args"][0] == "--mm-process-config"
            assert json.loads(cfg["server_args"][1]) == cfg["mm_process_config"]
            assert ("SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE" in cfg["env"]) == (mode == "plugin")
            if mode == "plugin":      # the plugin resolves references through the node's own settings
                assert {"VIDCACHE_DIR", "VIDCACHE_SHARED"} <= set(cfg["env"])
            assert ("224 grid" in captured.err) == (fam == "qwen3_vl" and mode == "stock")


def test_demo_dataset_prewarms(tmp_path, capsys):
    assert cli(["demo", "--dir", str(tmp_path / "demo"), "--videos", "3", "--rows", "6"]) == 0
    assert cli(["prewarm", str(tmp_path / "demo" / "dataset.jsonl"), "--cache", str(tmp_path / "c"),
                "--no-progress"]) == 0
    assert "failed" in capsys.readouterr().out


def _verify_lines(out: str) -> dict[str, str]:
    return {ln[4:].split(":")[0]: ln[:3].strip() for ln in out.splitlines() if ln[:4] in ("OK  ", "BAD ")}


def test_verify_finds_a_corrupted_blob_and_repairs_it(tmp_path, videos, capsys):
    c = VideoCache(tmp_path / "cache")
    good = c.ensure(videos["ffv1_10_small"], VideoOptions()).key
    bad = c.ensure(videos["mjpeg_24"], VideoOptions()).key
    frames = c.frames(bad).clone()
    assert cli(["verify", "--cache", c.path]) == 0
    out = capsys.readouterr().out
    assert "verify: 2 ok, 0 bad" in out and _verify_lines(out) == {good: "OK", bad: "OK"}
    flip_stored(c.store, K.cas(c.manifest(bad).frames.blob), at=7, bit=1)
    c.close()
    assert cli(["verify", "--cache", c.path]) == 1
    out = capsys.readouterr().out
    assert "verify: 1 ok, 1 bad" in out and _verify_lines(out) == {good: "OK", bad: "BAD"}
    assert "does not hash" in next(ln for ln in out.splitlines() if ln.startswith(f"BAD {bad}"))
    assert cli(["verify", bad, "--cache", c.path]) == 1                   # one key at a time, read-only:
    assert "verify: 0 ok, 1 bad" in capsys.readouterr().out              # still bad, nothing changed
    assert cli(["verify", "--repair", "--cache", c.path]) == 1            # it was bad: rc 1, but repaired
    out = capsys.readouterr().out
    assert f"BAD {bad}" in out and "-> repaired" in out
    assert cli(["verify", "--cache", c.path]) == 0
    assert "verify: 2 ok, 0 bad" in capsys.readouterr().out
    again = VideoCache(c.path)
    assert torch_equal(again.frames(bad), frames)                          # rebuilt bit-identically
    assert again.stats()["quarantined"] == 1


def torch_equal(a, b) -> bool:
    import torch
    return torch.equal(a, b)


def test_verify_walks_the_shared_tier_and_repairs_it_from_the_local_copy(tmp_path, videos, capsys):
    shared = str(tmp_path / "shared")
    c = VideoCache(tmp_path / "cache", shared=shared)
    key = c.ensure(videos["ffv1_10_small"], VideoOptions()).key
    args = ["--cache", c.path, "--shared", shared]
    assert cli(["verify"] + args) == 0
    out = capsys.readouterr().out
    assert _verify_lines(out) == {key: "OK"} and "verify: 1 ok, 0 bad" in out
    obj = c.compact.key(key)                            # the shared tier's one (compact) copy of the entry
    raw = flip_seen_by_decoder(c.shared.get(obj), c.manifest(key))
    c.shared.set_many({obj: raw})                       # only the shared copy is damaged
    good = c.frames(key).clone()
    c.close()
    assert cli(["verify"] + args) == 1
    out = capsys.readouterr().out
    assert _verify_lines(out) == {key: "BAD"}
    assert "shared: compact object" in out and "local:" not in out
    assert cli(["verify", "--repair"] + args) == 1
    assert "-> repaired" in capsys.readouterr().out
    assert cli(["verify"] + args) == 0
    fixed = VideoCache(tmp_path / "fresh", shared=shared)     # a node that holds nothing reads the repaired copy
    assert torch.equal(fixed.frames(key), good)


def test_evict_and_gc(tmp_path, videos, capsys):
    c = VideoCache(tmp_path / "cache")
    keys = [c.ensure(videos[n], VideoOptions()).key for n in ("ffv1_10_small", "mjpeg_24", "h264_30")]
    c.close()
    assert cli(["evict", keys[0], "--cache", c.path]) == 0
    assert f"evicted {keys[0]}" in capsys.readouterr().out
    assert cli(["evict", keys[0], "--cache", c.path]) == 0
    assert f"absent  {keys[0]}" in capsys.readouterr().out
    assert cli(["evict", "../../etc/passwd", "--cache", c.path]) == 1
    assert "[invalid_key]" in capsys.readouterr().err
    after = VideoCache(c.path)
    assert after.contains(keys) == [False, True, True]
    assert after.store.get(K.cas(after.manifest(keys[1]).frames.blob)) is not None
    after.close()
    assert cli(["gc", "--max-local-bytes", "1", "--cache", c.path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["evicted"] >= 2 and report["freed_bytes"] > 0
    assert VideoCache(c.path).contains(keys[1:]) == [False, False]


def test_errors_are_one_line_with_their_kind(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("VIDCACHE_DEBUG", raising=False)
    assert cli(["verify", "--shared", str(tmp_path / "s"), "--cache", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("vidcache: error: [store]") and "not an initialised" in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "s") and not os.path.exists(tmp_path / "none")


@pytest.mark.parametrize("mode", ["stock", "plugin"])
def test_the_printed_check_command_is_complete_and_parses(tmp_path, mode, capsys):
    """Issue 33: the check command `sglang-config` prints names every flag `check-server` asks for in that mode
    (stock: the GPU server's torchcodec), and `vidcache check-server` takes it as printed."""
    import shlex

    from vidcache.cli import build_parser
    from vidcache.sglang_facts import STOCK_GPU_TORCHCODEC
    assert cli(["sglang-config", "--family", "qwen2_5_vl", "--mode", mode, "--cache", str(tmp_path / "c")]) == 0
    check = json.loads(capsys.readouterr().out)["check"]
    assert "#" not in check          # issue 40: a command, no shell comment inside the JSON value
    argv = shlex.split(check.replace("<host>:<port>", "127.0.0.1:30000"))
    assert argv[:2] == ["vidcache", "check-server"]
    args = build_parser().parse_args(argv[1:])
    assert args.mode == mode and args.url == "http://127.0.0.1:30000"
    assert (args.server_torchcodec == STOCK_GPU_TORCHCODEC) == (mode == "stock")


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_sglang_config_shell_format_is_what_bash_runs(tmp_path, version):
    """Issue 40: `--format shell` is a bash fragment: sourced, it exports the release's env and gives SGLANG_ARGS,
    the server args with the JSON intact; `--format miles` the same in Miles' spelling (run by bash, not parsed here)."""
    import subprocess
    import sys
    from vidcache.sglang.config import mm_process_config, server_env
    env = {**os.environ, "PYTHONPATH": os.getcwd(), "VIDCACHE_DIR": str(tmp_path / "none")}
    show = ('eval "$(%s -m vidcache.cli sglang-config --family qwen2_5_vl --mode stock --sglang-version %s --format '
            '%s)"; printf "%%s\\n" "$SGLANG_RUST_SERVER" "${VIDEO_MAX_PIXELS:-unset}" "${%s[@]}"')
    out = subprocess.run(["bash", "-c", show % (sys.executable, version, "shell", "SGLANG_ARGS")], env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == "0" and out[1] == server_env(version).get("VIDEO_MAX_PIXELS", "unset")
    assert out[2] == "--mm-process-config" and json.loads(out[3]) == mm_process_config(version, "qwen2_5_vl")
    out = subprocess.run(["bash", "-c", show % (sys.executable, version, "miles", "VIDCACHE_MILES_ARGS")], env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    i = out.index("--sglang-mm-process-config")
    assert json.loads(out[i + 1]) == mm_process_config(version, "qwen2_5_vl")
    assert out[out.index("--vidcache-server-torchcodec") + 1] == "0.16.0" and out[1] == "unset"   # not exported
