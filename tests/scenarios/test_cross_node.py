"""Across nodes for real: what node A makes resolves on node B, after A and the sources are gone.

Two simulated nodes share one tier (a directory, and S3 on a moto server over loopback).  Node A
(this process) prewarms a private copy of the videos, prepares stock and plugin requests for all
three families and pickles its handles.  Then A's local directory and the sources are deleted, and
node B (tests/support/node_b.py, its own process, its own empty VIDCACHE_DIR, the same VIDCACHE_SHARED) runs
SGLang 0.5.23's own processor on every URI A produced and hydrates A's handles, with decoding
disabled.  Every output must equal A's under torch.equal.
"""
import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("sglang", reason="SGLang peer not installed: run scripts/setup_peer_env.sh")
from support import sglang_peer as sp  # noqa: E402

from support.toy_processors import build_processor  # noqa: E402

import vidcache  # noqa: E402
from vidcache import VideoCache, VideoOptions, prepare  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER  # noqa: E402
from vidcache.prewarming import prewarm  # noqa: E402

pytestmark = pytest.mark.peer

FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe the video.<|im_end|>\n<|im_start|>assistant\n"


def _options(family, mode):
    # Stock SGLang keeps Qwen3-VL frames only on the 224 grid; the plugin serves the faithful 32 grid.
    return VideoOptions.for_stock_sglang(family) if mode == "stock" else VideoOptions(family=family)


def _node_a(tmp_path, videos, shared, storage_options, workdir):
    src_dir = tmp_path / "a_sources"
    src_dir.mkdir()
    private = {n: shutil.copy(videos[n], src_dir) for n in ("h264_ntsc", "mpeg4_25_odd")}
    a = VideoCache(tmp_path / "node_a", shared=shared, shared_storage_options=storage_options)
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps({"prompt": "<video>", "videos": [p]}) + "\n" for p in private.values()))
    for family in FAMILIES:
        for mode in ("stock", "plugin"):
            s = prewarm(str(ds), a, _options(family, mode), progress=False)
            assert s.failed == 0
    cases, expected = {}, {}
    for family in FAMILIES:
        proc = build_processor(family)
        for mode in ("stock", "plugin"):
            for vname, path in private.items():
                name = f"{family}-{mode}-{vname}"
                h = vidcache.get(path, _options(family, mode), a)
                prep = prepare(proc, PROMPT, [h], mode=mode)
                if mode == "stock" and shared.startswith("s3://"):
                    assert prep.video_data[0].startswith("http://127.0.0.1")        # a presigned URL
                elif mode == "stock":
                    assert prep.video_data[0].startswith("file://" + os.path.abspath(shared))
                cases[name] = {"family": family, "mode": mode, "prompt": PROMPT, "video_data": prep.video_data}
                expected[name] = {**prep.train_inputs, "expanded_ids": torch.tensor(prep.expanded_ids)}
                pickle.dump([h], open(workdir / f"{name}.handles.pkl", "wb"))
                assert str(tmp_path / "node_a") not in json.dumps(cases[name]) + repr(pickle.dumps([h]))
    json.dump(cases, open(workdir / "cases.json", "w"))
    torch.save(expected, workdir / "expected.pt")
    a.close()
    shutil.rmtree(tmp_path / "node_a")        # node A is gone ...
    shutil.rmtree(src_dir)                    # ... and so are the sources
    return cases


def _node_b(tmp_path, workdir, shared, env_extra=()):
    env = {**os.environ, "VIDCACHE_DIR": str(tmp_path / "node_b"), "VIDCACHE_SHARED": shared, **dict(env_extra)}
    node_b = os.path.join(os.path.dirname(__file__), "..", "support", "node_b.py")
    r = subprocess.run([sys.executable, node_b, str(workdir)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.load(open(workdir / "report.json"))


def _assert_all_equal(report, cases):
    assert sorted(report) == sorted(cases)
    bad = {name: [k for k, ok in checks.items() if not ok] for name, checks in report.items()}
    assert all(not v for v in bad.values()), bad


def test_node_b_reproduces_node_a_on_a_shared_directory(tmp_path, videos):
    assert sp.peer_available(), "sglang is installed but its Qwen-VL processor does not import"
    workdir = tmp_path / "handoff"
    workdir.mkdir()
    shared = str(tmp_path / "nfs")
    cases = _node_a(tmp_path, videos, shared, {}, workdir)
    # Node B reads compact objects only (issue 17): no raw frames were ever put in the tier.
    assert not (tmp_path / "nfs" / "cas").exists() and (tmp_path / "nfs" / "frozen").is_dir()
    _assert_all_equal(_node_b(tmp_path, workdir, shared), cases)


def test_node_b_reproduces_node_a_on_s3(tmp_path, videos, s3):
    assert sp.peer_available(), "sglang is installed but its Qwen-VL processor does not import"
    workdir = tmp_path / "handoff"
    workdir.mkdir()
    shared = "s3://cache/vc"
    opts = {"endpoint_url": s3.endpoint, "client_kwargs": {"region_name": "us-east-1"}}
    cases = _node_a(tmp_path, videos, shared, opts, workdir)
    names = [o["Key"] for o in s3.client.list_objects_v2(Bucket="cache", Prefix="vc/")["Contents"]]
    assert not any(n.startswith("vc/cas/") for n in names) and any(n.startswith("vc/frozen/") for n in names)
    # Node B learns the endpoint the way any fsspec user does: FSSPEC_<PROTOCOL>_<ARG> in its environment.
    env = {"FSSPEC_S3_ENDPOINT_URL": s3.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
    _assert_all_equal(_node_b(tmp_path, workdir, shared, env), cases)
