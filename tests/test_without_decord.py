"""Issue 51 item 9: decord 0.6.0 has no aarch64 wheel (GH200/GB200 nodes), so vidcache installs and runs without it:
the default decoder is then PyAV, whose frames equal decord's on 8-bit streams (same key, same bytes).  Here decord
is hidden from a child process (``sys.modules["decord"] = None``: neither found nor importable), as on such a node."""
import json

import torch

from support.cli import run_cli
from vidcache import VideoCache, VideoOptions

HIDE = "import sys; sys.modules['decord'] = None\n"


def test_without_decord_pyav_is_the_default_and_gives_decords_frames(tmp_path, videos):
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n"
                          for n in ("h264_30", "mpeg4_25_odd")))
    code = (HIDE + "from vidcache.options import DEFAULT_DECODER; print(DEFAULT_DECODER)\n"
            "from vidcache.cli import main; sys.exit(main(sys.argv[1:]))")
    r = run_cli(["prewarm", str(ds), "--workers", "2", "--no-progress"], tmp_path / "arm", code=code, timeout=600)
    assert r.returncode == 0 and r.stdout.startswith("pyav\n") and "2 new" in r.stdout, r.stdout + r.stderr
    arm = VideoCache(tmp_path / "arm", read_only=True)
    x86 = VideoCache(tmp_path / "x86")                     # this process has decord: the default decoder
    for n in ("h264_30", "mpeg4_25_odd"):
        built = x86.ensure(videos[n], VideoOptions())
        key = arm.find(videos[n], VideoOptions())
        assert key == built.key and arm.manifest(key).provenance["decoder"] == "pyav"
        assert x86.manifest(key).provenance["decoder"] == "decord"
        assert torch.equal(arm.frames(key), x86.frames(key))
    doc = run_cli(["doctor", "--fast"], tmp_path / "arm", code=HIDE + "from vidcache.cli import main; "
                  "import platform; platform.machine = lambda: 'aarch64'; sys.exit(main(sys.argv[1:]))")
    assert "decoder decord" in doc.stdout and "PyAV is the default decoder here" in doc.stdout, doc.stdout
    assert "FAIL decoder decord" not in doc.stdout and "FAIL decord" not in doc.stdout, doc.stdout


def test_without_decord_a_shared_tier_in_the_compact_layout_is_written_and_read(tmp_path, videos):
    """The compact layout checks each object it writes by decoding it with every decoder the node has; a node
    without decord checks with the others instead of failing every write (it raised ModuleNotFoundError)."""
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["h264_30"]]}) + "\n")
    shared = tmp_path / "shared"
    code = HIDE + ("from vidcache.frozen_file import available_decoders; print(','.join(available_decoders()))\n"
                   "from vidcache.cli import main; sys.exit(main(sys.argv[1:]))")
    r = run_cli(["prewarm", str(ds), "--no-progress"], tmp_path / "arm", shared, code=code, timeout=600)
    assert r.returncode == 0 and "1 new" in r.stdout, r.stdout + r.stderr
    assert "decord" not in r.stdout.splitlines()[0] and "pyav" in r.stdout.splitlines()[0]
    arm = VideoCache(tmp_path / "arm", shared=str(shared), read_only=True)
    key = arm.find(videos["h264_30"], VideoOptions())
    assert arm.config.shared_layout == "compact" and any(k.startswith("frozen/") for k in arm.shared.keys())
    fresh = VideoCache(tmp_path / "x86", shared=str(shared))              # decord here: reads the compact object
    assert torch.equal(fresh.frames(key), arm.frames(key))
