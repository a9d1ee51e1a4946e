"""The shared tier (fsspec CAS on a directory, memory://, S3 on moto), read-through tiers, Ray prewarm."""
import json
import os
import uuid

import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache.store.fsspec_cas import FsspecStore
from vidcache.store.lmdb import LMDBStore
from vidcache.store.memory import MemoryStore
from vidcache.store.tiered import TieredStore
from conftest import free_port
from vidcache.testing.store import PicklableStoreContract, StoreContract


class TestFsspecStoreLocalDir(PicklableStoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return FsspecStore(str(tmp_path / "shared"))

    @pytest.fixture
    def read_only_store(self):
        return lambda s: FsspecStore(s.url, read_only=True)

    def raw_get(self, store, key):
        ns, name = key.split("/", 1)
        with open(os.path.join(store.url, ns, name[:2], name), "rb") as f:
            return f.read()

    def test_leftover_partial_files_are_invisible(self, store):
        store.set_many({"cas/abc": b"1"})
        os.makedirs(os.path.join(store.url, "cas", "de"), exist_ok=True)
        open(os.path.join(store.url, "cas", "de", "def.1234.partial"), "wb").write(b"half")
        assert list(store.keys("cas/")) == ["cas/abc"] and store.get("cas/def") is None

    def test_objects_are_immutable(self, store):
        store.set_many({"ac/k": b"first"})
        store.set_many({"ac/k": b"second"})
        assert store.get("ac/k") == b"first"


class TestFsspecStoreMemoryFS(StoreContract):
    @pytest.fixture
    def store(self):
        return FsspecStore(f"memory://vidcache-{uuid.uuid4().hex}")

    @pytest.fixture
    def read_only_store(self):
        return lambda s: FsspecStore(s.url, read_only=True)


class TestTieredStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return TieredStore(LMDBStore(tmp_path / "local"), MemoryStore())

    @pytest.fixture
    def read_only_store(self):
        def make(s):
            ro = MemoryStore(read_only=True)
            ro._data = s.shared._data
            return TieredStore(MemoryStore(), ro, read_only=True)
        return make

    def test_reads_backfill_the_local_tier(self, tmp_path):
        shared = MemoryStore()
        shared.set_many({"cas/x": b"blob", "ac/y": b"manifest"})
        t = TieredStore(LMDBStore(tmp_path / "l"), shared)
        assert t.local.get("cas/x") is None
        with t.read("cas/x") as v:
            assert bytes(v) == b"blob"
        assert t.local.get("cas/x") == b"blob"
        assert t.exists_many(["ac/y", "ac/z"]) == [True, False]


def test_second_node_reads_through_without_decoding(tmp_path, videos, count_decodes):
    shared = str(tmp_path / "nfs")
    node_a = VideoCache(tmp_path / "node_a", shared=shared)
    key = node_a.ensure(videos["h264_ntsc"], VideoOptions()).key
    decoded_before = len(count_decodes)
    node_b = VideoCache(tmp_path / "node_b", shared=shared)
    assert node_b.ensure(videos["h264_ntsc"], VideoOptions()).status == "hit"
    h = node_b.handle(videos["h264_ntsc"], VideoOptions())
    assert h.resolve(build=False) == key
    assert torch.equal(h.frames(), node_a.frames(key)) and len(count_decodes) == decoded_before
    # the config is remembered: a handle opened later in this node finds the shared tier
    assert json.load(open(tmp_path / "node_b" / "config.json"))["shared"] == shared


def test_shared_tier_on_s3(tmp_path, videos, monkeypatch):
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    srv.start()
    try:
        endpoint = f"http://127.0.0.1:{srv._server.server_port}"
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="cache")
        opts = {"endpoint_url": endpoint, "client_kwargs": {"region_name": "us-east-1"}}
        a = VideoCache(tmp_path / "a", shared="s3://cache/vc", shared_storage_options=opts)
        key = a.ensure(videos["mjpeg_24"], VideoOptions()).key
        objs = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").list_objects_v2(Bucket="cache")
        names = [o["Key"] for o in objs["Contents"]]
        assert any(n.startswith("vc/ac/") for n in names) and any(n.startswith("vc/cas/") for n in names)
        b = VideoCache(tmp_path / "b", shared="s3://cache/vc", shared_storage_options=opts)
        assert torch.equal(b.frames(key), a.frames(key))
        assert "secret" not in open(tmp_path / "b" / "config.json").read()
    finally:
        srv.stop()


def test_prewarm_over_ray_into_a_shared_tier(tmp_path, videos, count_decodes):
    ray = pytest.importorskip("ray")
    from vidcache.prewarm import prewarm_ray
    names = ["h264_30", "mjpeg_24", "ffv1_10_small"]
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n" for n in names)
                  + json.dumps({"prompt": "<video>", "videos": [str(tmp_path / "missing.mp4")]}) + "\n")
    shared = str(tmp_path / "nfs")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        s = prewarm_ray(str(ds), VideoCache(tmp_path / "node", shared=shared), VideoOptions(), progress=False,
                        failures_path=str(tmp_path / "f.jsonl"))
    finally:
        ray.shutdown()
    assert (s.new, s.failed) == (3, 1) and s.failures[0]["kind"] == "not_found"
    other = VideoCache(tmp_path / "other_node", shared=shared)
    for n in names:
        assert other.ensure(videos[n], VideoOptions()).status == "hit"
    assert count_decodes == []          # the Ray workers decoded; this process never did
