"""Requests that name other paths, other tiers or bad keys: refused before any store call, nothing created."""
import base64
import json
import os

import pytest

pytest.importorskip("sglang", reason="SGLang peer not installed: run scripts/setup_peer_env.sh")
from support import sglang_peer as sp  # noqa: E402

import vidcache  # noqa: E402
from vidcache import VideoCache, VideoOptions  # noqa: E402
from vidcache.errors import InvalidKeyError, TierMismatchError  # noqa: E402
from vidcache.rollout.ref import REF_PREFIX, parse_ref, ref_uri  # noqa: E402

pytestmark = pytest.mark.peer


def _ref(rec) -> str:
    return REF_PREFIX + base64.b64encode(json.dumps(rec).encode()).decode()


@pytest.fixture
def node(tmp_path, videos, monkeypatch):
    """A node (VIDCACHE_DIR + VIDCACHE_SHARED) holding one entry, and the plugin's loader."""
    assert sp.peer_available(), "sglang is installed but its Qwen-VL processor does not import"
    sp._import_sglang()
    from vidcache.sglang.plugin.qwen_vl import VidcacheQwenVLProcessor, load_ref
    shared = str(tmp_path / "shared")
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("VIDCACHE_SHARED", shared)
    c = VideoCache()
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(), c)
    (tmp_path / "secret.json").write_text('{"TOPSECRET": 1}')
    return c, h, load_ref, VidcacheQwenVLProcessor


def test_a_good_reference_loads_from_the_node(node):
    c, h, load_ref, _ = node
    v = load_ref(parse_ref(ref_uri(h.identity, h.key)))
    assert v.key == h.key and tuple(v.frames.shape) == tuple(h.manifest.frames.shape)


def test_reference_to_another_tier_is_refused(node, tmp_path):
    c, h, load_ref, _ = node
    other = VideoCache(tmp_path / "elsewhere", shared=str(tmp_path / "other_shared"))
    foreign = vidcache.get(h.source, VideoOptions(), other)
    with pytest.raises(TierMismatchError, match="VIDCACHE_SHARED"):
        load_ref(parse_ref(ref_uri(foreign.identity, foreign.key)))


@pytest.mark.parametrize("key", ["../secret.json", "../../secret", "/etc/passwd", "a\x00b",
                                 "cas/../../secret.json", "0" * 32 + ".1." + "0" * 31 + "/", 17, None])
def test_bad_keys_are_refused_before_any_store_call(node, tmp_path, key):
    c, h, load_ref, _ = node
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(InvalidKeyError) as e:
        load_ref(parse_ref(_ref({"vidcache_ref": 2, "tier": c.identity, "key": key})))
    assert "TOPSECRET" not in str(e.value)
    assert sorted(p for p in tmp_path.rglob("*")) == before      # nothing created, nothing backfilled


def test_old_path_naming_references_are_refused_and_create_nothing(node, tmp_path):
    c, h, load_ref, _ = node
    target = tmp_path / "made_by_request"
    with pytest.raises(InvalidKeyError):
        parse_ref(_ref({"vidcache_ref": 1, "cache": str(target), "key": h.key}))
    assert not target.exists()


def test_a_thousand_bad_references_leave_descriptors_flat(node):
    c, h, load_ref, proc_cls = node
    from sglang.srt.managers.schedule_batch import Modality
    load_ref(parse_ref(ref_uri(h.identity, h.key)))                   # the node's cache is open
    fds = len(os.listdir("/proc/self/fd"))
    from vidcache.sglang.plugin.qwen_vl import UnloadableRef
    for i in range(1000):
        rec = {"vidcache_ref": 2, "tier": f"tier-{i:032x}", "key": h.key}
        got = proc_cls._load_single_item(_ref(rec), Modality.VIDEO)    # refused by process_mm_data, as a 400
        assert isinstance(got, UnloadableRef) and "[tier_mismatch]" in got.message
    assert len(os.listdir("/proc/self/fd")) <= fds + 2


def test_the_plugin_never_falls_back_to_decoding_a_bad_reference(node):
    c, h, load_ref, proc_cls = node
    from sglang.srt.managers.schedule_batch import Modality
    from vidcache.sglang.plugin.qwen_vl import UnloadableRef
    got = proc_cls._load_single_item(REF_PREFIX + "not base64!", Modality.VIDEO)
    assert isinstance(got, UnloadableRef) and "[invalid_key]" in got.message


def test_keys_named_ahead_are_pulled_into_the_server_node(node, tmp_path, videos):
    """A reference's ``ahead`` keys (the client's next entries) land in the server node's local tier in the
    background, exact, while the reference itself is served first."""
    import time

    import torch

    from vidcache import keys as K
    from vidcache.node import node_cache
    c, h, load_ref, _ = node
    a = VideoCache(tmp_path / "node_a", shared=c.config.shared)           # another node fills the shared tier
    later = [vidcache.get(videos[n], VideoOptions(), a) for n in ("mjpeg_24", "mpeg4_25_odd")]
    server = node_cache()
    blobs = [K.cas(x.manifest.frames.blob) for x in later]
    assert not any(server.local.exists_many(blobs))
    v = load_ref(parse_ref(ref_uri(h.identity, h.key, ahead=[x.key for x in later])))
    assert v.key == h.key
    until = time.monotonic() + 60
    while not all(server.local.exists_many(blobs)):
        assert time.monotonic() < until, "the keys named ahead were not pulled"
        time.sleep(0.05)
    for x in later:
        assert torch.equal(server.frames(x.key), a.frames(x.key))


@pytest.mark.parametrize("ahead", [["../secret.json"], "notalist", [17], "33 good keys"])
def test_bad_ahead_keys_are_refused_before_any_store_call(node, tmp_path, ahead):
    c, h, load_ref, _ = node
    if ahead == "33 good keys":
        ahead = [h.key] * 33                 # one past MAX_AHEAD
    before = sorted(p for p in tmp_path.rglob("*"))
    with pytest.raises(InvalidKeyError) as e:
        load_ref(parse_ref(_ref({"vidcache_ref": 4, "tier": c.identity, "key": h.key, "ahead": ahead})))
    assert "TOPSECRET" not in str(e.value)
    assert sorted(p for p in tmp_path.rglob("*")) == before
