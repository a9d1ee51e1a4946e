"""Ray prewarm on a real multi-node cluster on one machine (ray.cluster_utils.Cluster).

Each Ray node has its own VIDCACHE_DIR (set in the node's environment, as `ray start` would inherit
it), all share one tier.  A node is killed mid-run: its videos are re-run elsewhere, the run
completes, and every entry is present in the shared tier and verified.
"""
import json
import os
import threading
import time

import pytest

from vidcache import VideoCache, VideoOptions
from vidcache.prewarming import prewarm

ray = pytest.importorskip("ray", reason="ray not installed: pip install -e .[test]")
from ray.cluster_utils import Cluster  # noqa: E402


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [c.add_node(num_cpus=1, env_vars={"VIDCACHE_DIR": str(tmp_path / f"ray_node_{i}")}) for i in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, nodes
    finally:
        ray.shutdown()
        c.shutdown()


def _dataset(tmp_path, videos, n_opts):
    rows = [{"prompt": "<video>", "videos": [{"video": videos[name], "fps": fps}]}
            for name in ("h264_30", "mjpeg_24", "ffv1_10_small", "hevc_25") for fps in n_opts]
    p = tmp_path / "d.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p), len(rows)


def test_ray_prewarm_survives_a_node_dying(tmp_path, videos, cluster, count_decodes):
    c, nodes = cluster
    shared = str(tmp_path / "shared")
    ds, n = _dataset(tmp_path, videos, (0.5, 1.0, 2.0, 3.0))
    driver = VideoCache(tmp_path / "driver", shared=shared)

    def kill_a_node_once_work_lands():
        deadline = time.time() + 120
        while time.time() < deadline and len(list(driver.shared.keys("ac/"))) < 2:
            time.sleep(0.1)
        c.remove_node(nodes[0], allow_graceful=False)
    killer = threading.Thread(target=kill_a_node_once_work_lands)
    killer.start()
    s = prewarm(ds, driver, VideoOptions(min_pixels=3136, max_pixels=12544), ray=True, progress=False,
                failures_path=str(tmp_path / "failures.jsonl"))
    killer.join()
    assert s.failed == 0, s.failures
    assert s.new + s.hit == n
    entries = [k[len("ac/"):] for k in driver.shared.keys("ac/")]
    assert len(entries) == n
    reader = VideoCache(tmp_path / "reader", shared=shared)
    assert all(reader.verify(k) == [] for k in entries)
    # every Ray node built into its own local dir; the driver decoded nothing itself
    assert os.path.isdir(tmp_path / "ray_node_1" / "lmdb")
    assert not os.path.exists(tmp_path / "driver" / "lmdb" / "data.mdb") or count_decodes == []
    assert count_decodes == []


def test_ray_failures_are_the_same_report_as_a_local_run(tmp_path, videos, cluster):
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["ffv1_10_small"]]}) + "\n"
                  + json.dumps({"prompt": "<video>", "videos": [str(tmp_path / "missing.mp4")]}) + "\n"
                  + "not json\n")
    shared = str(tmp_path / "shared")
    ray_s = prewarm(str(ds), VideoCache(tmp_path / "d1", shared=shared), VideoOptions(), ray=True, progress=False)
    local_s = prewarm(str(ds), VideoCache(tmp_path / "d2"), VideoOptions(), progress=False)
    strip = lambda fs: sorted((f["row"], f["kind"]) for f in fs)   # noqa: E731
    assert strip(ray_s.failures) == strip(local_s.failures) == [(1, "not_found"), (2, "bad_row")]
    assert (ray_s.new, ray_s.failed) == (1, 2)
