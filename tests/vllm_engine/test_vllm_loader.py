"""vidcache's vLLM video loader, through vLLM 0.34.0's own media path (``MediaConnector.fetch_video`` with
``media_io_kwargs`` naming it, in the overlay's process): a sound reference gives the cached frames and the original
video's metadata; a forged one is refused with the specific vidcache error, never decoded or opened by path; a real
video file still decodes (vLLM's own loader)."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash

from support import vllm_peer as vp

vp.overlay_or_skip()

import vidcache  # noqa: E402
from vidcache import VideoOptions  # noqa: E402
from vidcache.rollout.ref import MAX_REF_CHARS, REF_PREFIX, ref_uri  # noqa: E402
from vidcache.vllm.request import chat_request, vllm_metadata  # noqa: E402

pytestmark = pytest.mark.vllm


def _raw(rec) -> str:
    text = rec if isinstance(rec, str) else json.dumps(rec)
    return REF_PREFIX + base64.b64encode(text.encode()).decode()


@pytest.fixture(scope="module")
def fetched(tmp_path_factory, videos):
    root = tmp_path_factory.mktemp("vllm-loader")
    node = root / "node"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(node))
        mp.delenv("VIDCACHE_SHARED", raising=False)
        h = vidcache.get(videos["mpeg4_25_odd"],
                         VideoOptions(family="qwen2_5_vl", fps=2.0, min_pixels=3136, max_pixels=50176))
        key, tier = h.resolve(), h.identity
        frames = h.frames()
        good = {"vidcache_ref": 4, "tier": tier, "key": key}
        other_key = "0" * 32 + ".1." + "0" * 32
        urls = {
            "good": chat_request("m", "x", [h])["messages"][0]["content"][0]["video_url"]["url"],
            "other_tier": _raw({**good, "tier": "someone-elses-cache"}),
            "absent_key": _raw({**good, "key": other_key}),
            "path_key": _raw({**good, "key": "../../../../etc/passwd"}),
            "path_field": _raw({**good, "path": "/etc/passwd"}),
            "nested": _raw('{"vidcache_ref": 4, "tier": "t", "key": [[[[[["x"]]]]]]}'),
            "not_json": _raw("{this is not json"),
            "bom": _raw("\ufeff" + json.dumps(good)),   # D54: went to the fallback decoder
            "huge": _raw({**good, "pad": "x" * MAX_REF_CHARS}),
            "attested": ref_uri(tier, key, attest={"pixel_values_videos": "0" * 32}),
            "file": "data:video/mp4;base64," + base64.b64encode(open(videos["mpeg4_25_odd"], "rb").read()).decode(),
        }
        res = vp.run_loader(urls, root / "work", node,
                            media_io_kwargs={"video": {"video_backend": "vidcache", "backend": "torchcodec"}})
        yield res, h, frames


def test_a_reference_gives_the_cached_frames_and_original_metadata(fetched):
    res, h, frames = fetched
    got = res["good"]
    assert "error" not in got, got
    assert got["shape"] == list(frames.permute(0, 2, 3, 1).shape) and got["dtype"] == "uint8"
    assert got["digest"] == xxhash.xxh3_128_hexdigest(frames.permute(0, 2, 3, 1).contiguous().numpy().tobytes())
    want = vllm_metadata(h.manifest)
    assert {k: got["metadata"][k] for k in want} == want
    assert got["metadata"]["do_sample_frames"] is False


@pytest.mark.parametrize("name,error", [
    ("other_tier", "TierMismatchError"), ("absent_key", "NotCachedError"), ("path_key", "InvalidKeyError"),
    ("path_field", "InvalidKeyError"), ("nested", "InvalidKeyError"), ("not_json", "InvalidKeyError"),
    ("huge", "InvalidKeyError"), ("attested", "InvalidKeyError"), ("bom", "InvalidKeyError")])
def test_forged_references_are_refused(fetched, name, error):
    got = fetched[0][name]
    assert got.get("error") == error, got
    assert got["vidcache"] is True
    assert "passwd" not in got["message"] or name in ("path_key", "path_field")   # refused, not opened


def test_a_video_file_still_decodes_with_vllms_own_loader(fetched):
    """Bytes that are not a reference go to VLLM_VIDEO_LOADER_BACKEND (opencv's loader class, here with vLLM's
    torchcodec decoder: this venv has no cv2)."""
    got = fetched[0]["file"]
    assert "error" not in got, got
    assert got["shape"][0] > 0 and got["metadata"]["video_backend"] != "vidcache"


def test_vllms_plugin_loader_registers_the_loader_from_the_entry_point(tmp_path):
    """vLLM's own ``load_general_plugins`` (what ``EngineArgs`` runs in the API server and the engine core runs in its
    process) finds pyproject.toml's entry point and registers the ``vidcache`` loader.  The entry point is installed
    here as a bare dist-info (the venv's vidcache may be an editable install made before the entry point existed)."""
    import tomllib

    from vidcache.vllm.config import LOADER_NAME, PLUGIN_ENTRY_POINT
    group, name, target = PLUGIN_ENTRY_POINT
    eps = tomllib.loads((Path(vp.ROOT) / "pyproject.toml").read_text())["project"]["entry-points"]
    assert eps[group][name] == target
    d = tmp_path / "ep" / "vidcache_entry_point-0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: vidcache-entry-point\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    code = ("import sys\nfrom vllm.multimodal.video import VIDEO_LOADER_REGISTRY as R\n"
            f"assert {LOADER_NAME!r} not in R.name2class\n"
            "from vllm.plugins import load_general_plugins\nload_general_plugins()\n"
            f"print(R.name2class[{LOADER_NAME!r}].__module__)\n")
    env = vp.peer_env(tmp_path / "node")
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "ep")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "vidcache.vllm.loader"
