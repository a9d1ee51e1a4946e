"""An S3 tier under faults (issue 48, item 8), through the CLI alone: the endpoint killed (SIGKILL) mid-``prewarm``,
mid-``pull`` and mid-``verify --repair``, and bodies served at the wrong length.

The endpoint is a proxy in front of moto's server on loopback (``support/faulty_proxy.py``), a process of its own:
killing it is, to a node, the S3 endpoint dying mid-transfer, while moto keeps the objects, so that what the tier
holds afterwards can be checked.  Counted over every kill point: frames served that are not a local decode's
(corrupt), entries unreadable once the endpoint is back and the command is run again (lost), and failures that are
not one clear ``vidcache: error:`` line or a per-row failure (unclear).  All must be 0.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from vidcache import VideoCache, VideoOptions

from support.net import free_port
from support.cli import run_cli

PROXY = os.path.join(os.path.dirname(__file__), "support", "faulty_proxy.py")
TIER = "s3://cache/faults"        # made unique per test below: moto's objects outlive its server in this process


class Endpoint:
    """The proxy's port, the same across restarts, so that a node's recorded tier stays the same."""

    def __init__(self, upstream: str) -> None:
        self.upstream_port = int(upstream.rsplit(":", 1)[1])
        self.port = free_port()
        self.proc = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *faults: str) -> None:
        self.stop()
        self.proc = subprocess.Popen([sys.executable, PROXY, str(self.port), str(self.upstream_port), *faults],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(10)
            self.proc.stdout.close()
            self.proc = None

    def died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None


@pytest.fixture(autouse=True)
def _own_tier(monkeypatch):
    import uuid
    monkeypatch.setattr(sys.modules[__name__], "TIER", f"s3://cache/faults-{uuid.uuid4().hex[:8]}")


@pytest.fixture
def endpoint(s3):
    e = Endpoint(s3.endpoint)
    e.start()
    yield e
    e.stop()


@pytest.fixture
def dataset(tmp_path, videos):
    p = tmp_path / "data" / "train.jsonl"
    p.parent.mkdir()
    rows = [{"prompt": "<video> a", "videos": [videos["mjpeg_24"]]},
            {"prompt": "<video> b", "videos": [videos["ffv1_10_small"]]},
            {"prompt": "<video> c", "videos": [videos["h264_30"]]}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.fixture
def want(tmp_path, videos):
    """key -> the frames a node-local decode gives (no tier): what every read must serve."""
    ref = VideoCache(tmp_path / "ref")
    out = {}
    for n in ("mjpeg_24", "ffv1_10_small", "h264_30"):
        key = ref.ensure(videos[n], VideoOptions()).key
        out[key] = ref.frames(key)
    return out


def cli(args, node, endpoint, **env):
    return run_cli(args, node, TIER, env={"AWS_ENDPOINT_URL": endpoint.url, "AWS_ACCESS_KEY_ID": "test",
                                          "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                                          "VIDCACHE_SHARED_TIMEOUT_S": "20", **env})


def unclear(r) -> bool:
    """A failed run that says nothing clear: a traceback, or no error line and no failed rows."""
    if r.returncode == 0:
        return False
    return "Traceback" in r.stderr or not ("vidcache: error: [" in r.stderr or "failed" in r.stdout + r.stderr)


def tier_objects(s3) -> dict:
    """Every object of the tier in moto, key -> ETag (the tier's bytes, read behind the proxy)."""
    out, token = {}, {}
    while True:
        page = s3.client.list_objects_v2(Bucket="cache", Prefix=TIER[len("s3://cache/"):] + "/", **token)
        out.update({o["Key"]: o["ETag"] for o in page.get("Contents", [])})
        if not page.get("IsTruncated"):
            return out
        token = {"ContinuationToken": page["NextContinuationToken"]}


def counted(tmp_path, endpoint, want, name) -> tuple[int, int]:
    """(corrupt, lost) as a fresh node finds the tier, the endpoint up."""
    c = VideoCache(tmp_path / name, shared=TIER, shared_storage_options={"endpoint_url": endpoint.url})
    corrupt = lost = 0
    for key, frames in want.items():
        try:
            corrupt += not torch.equal(c.frames(key), frames)
        except KeyError:                                   # NotCachedError
            lost += 1
    c.close()
    return corrupt, lost


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


# Bytes moved through the endpoint before it dies: early (the first objects), middle, late.
KILL_AFTER = (20_000, 300_000, 1_500_000)


def test_prewarm_with_the_endpoint_killed_mid_way_loses_nothing_and_fails_clearly(tmp_path, endpoint, dataset,
                                                                                     want, s3, aws):
    corrupt = lost = unclear_runs = killed = 0
    for i, after in enumerate(KILL_AFTER):
        for k in tier_objects(s3):                        # an empty tier each time, so that each run uploads
            s3.client.delete_object(Bucket="cache", Key=k)
        endpoint.start("--die-after", str(after))
        node = tmp_path / f"node{i}"
        r = cli(["prewarm", str(dataset)], node, endpoint)
        killed += endpoint.died()
        unclear_runs += unclear(r)
        endpoint.start()
        again = cli(["prewarm", str(dataset)], node, endpoint)
        assert again.returncode == 0, again.stdout + again.stderr
        c, l_ = counted(tmp_path, endpoint, want, f"fresh{i}")
        corrupt, lost = corrupt + c, lost + l_
        v = cli(["verify", "--shared"], tmp_path / f"v{i}", endpoint)
        assert "verify: 3 ok, 0 bad" in v.stdout, v.stdout + v.stderr
    assert killed == len(KILL_AFTER)
    assert (corrupt, lost, unclear_runs) == (0, 0, 0)


def _prewarmed(tmp_path, endpoint, dataset) -> None:
    r = cli(["prewarm", str(dataset)], tmp_path / "builder", endpoint)
    assert r.returncode == 0 and "3 new" in r.stdout, r.stdout + r.stderr


def test_pull_with_the_endpoint_killed_mid_way_changes_nothing_in_the_tier(tmp_path, endpoint, dataset, want, s3,
                                                                          aws):
    _prewarmed(tmp_path, endpoint, dataset)
    before = tier_objects(s3)
    corrupt = unclear_runs = killed = 0
    for i, after in enumerate(KILL_AFTER):
        endpoint.start("--die-after", str(after))
        node = tmp_path / f"puller{i}"
        r = cli(["pull", str(dataset)], node, endpoint)
        killed += endpoint.died()
        unclear_runs += unclear(r)
        endpoint.start()
        again = cli(["pull", str(dataset)], node, endpoint)
        assert again.returncode == 0, again.stdout + again.stderr
        local = VideoCache(node)                          # what the pull left on the node, read with no tier
        corrupt += sum(not torch.equal(local.frames(k), f) for k, f in want.items())
        local.close()
    assert killed == len(KILL_AFTER)
    assert tier_objects(s3) == before                     # nothing deleted, nothing rewritten
    assert (corrupt, unclear_runs) == (0, 0)


def test_verify_repair_with_the_endpoint_killed_mid_way_loses_nothing(tmp_path, endpoint, dataset, want, s3, aws):
    from vidcache import keys as K
    from vidcache.store.fsspec import FsspecStore
    _prewarmed(tmp_path, endpoint, dataset)
    corrupt = lost = unclear_runs = killed = 0
    for i, after in enumerate((2_000, 20_000, 200_000)):
        behind = FsspecStore(TIER, storage_options={"endpoint_url": s3.endpoint})      # moto itself
        behind.set_many({K.frozen_digest(key, ".nut"): b"damaged" for key in want})   # each object to be rewritten
        endpoint.start("--die-after", str(after))
        r = cli(["verify", "--shared", "--repair"], tmp_path / f"r{i}", endpoint)
        killed += endpoint.died()
        unclear_runs += unclear(r) and "BAD" not in r.stdout
        endpoint.start()
        c, l_ = counted(tmp_path, endpoint, want, f"mid{i}")     # before any second repair: nothing hidden
        corrupt, lost = corrupt + c, lost + l_
        again = cli(["verify", "--shared", "--repair"], tmp_path / f"s{i}", endpoint)
        assert again.returncode in (0, 1), again.stdout + again.stderr
        v = cli(["verify", "--shared"], tmp_path / f"v{i}", endpoint)
        assert "verify: 3 ok, 0 bad" in v.stdout, v.stdout + v.stderr
    assert killed == 3
    assert (corrupt, lost, unclear_runs) == (0, 0, 0)


def test_wrong_length_bodies_are_the_tiers_failure_never_a_corrupt_object(tmp_path, endpoint, dataset, want, s3,
                                                                           aws):
    """Every large body served at half its length, under a Content-Length that says so: HTTP sees a complete
    response.  The frames do not decode or hash: a node must neither serve them nor delete the sound objects."""
    _prewarmed(tmp_path, endpoint, dataset)
    before = tier_objects(s3)
    endpoint.start("--short-bodies", "4096")
    r = cli(["pull", str(dataset)], tmp_path / "short", endpoint)
    assert r.returncode != 0 and not unclear(r), r.stdout + r.stderr
    r = cli(["verify", "--shared", "--repair"], tmp_path / "short2", endpoint)
    assert "Traceback" not in r.stderr, r.stderr
    now = tier_objects(s3)
    assert {k: now.get(k) for k in before} == before      # nothing deleted, nothing rewritten
    endpoint.start()
    assert counted(tmp_path, endpoint, want, "after") == (0, 0)
