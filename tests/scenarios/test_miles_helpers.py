"""miles_integration pieces that need no Miles checkout: flags, handle<->metadata, train-side rebuild."""
import argparse
import importlib
import copy
import json
import pickle
import sys
import types

import pytest
import torch

import vidcache
from miles_integration.args import OPTION_NAMES, VidcacheConfig, add_vidcache_arguments, video_options_from_args
from miles_integration.meta import KEY, handles_from_metadata, has_video, metadata_entry, set_request_state
from miles_integration.train_hooks import (
    HANDLE_KEY,
    HydratingIterator,
    decode_handles,
    encode_handles,
    handle_train_inputs,
    hydrate,
    install_train_hooks,
    patch_get_batch,
)
from support.toy_processors import build_processor
from vidcache import Digest, PreparedRequest, VideoHandle, VideoOptions
from vidcache.errors import InvalidKeyError, TierMismatchError
from vidcache.keys import cache_key
from vidcache.sglang_facts import STOCK_QWEN3_GRID as STOCK_SGLANG_QWEN3_SIZE_FACTOR


def _parser():
    p = argparse.ArgumentParser()
    add_vidcache_arguments(p)
    return p


def _key(content: bytes, options: VideoOptions) -> str:
    """A well-formed cache key (the real key format), for entries that need not exist."""
    return cache_key(Digest.of(content), options)


@pytest.fixture
def node_env(tmp_path, monkeypatch):
    """This process's node configuration: its own VIDCACHE_DIR, no shared tier."""
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    return tmp_path / "node"


def test_flags_parse_into_options_and_config(tmp_path):
    p = _parser()
    add_vidcache_arguments(p)            # rollout fn and generate fn both register: must not conflict
    a = p.parse_args(["--vidcache-cache", str(tmp_path), "--vidcache-shared", str(tmp_path / "tier"),
                      "--vidcache-family", "qwen3_vl", "--vidcache-fps", "1", "--vidcache-max-pixels", "200704",
                      "--vidcache-mode", "plugin", "--vidcache-transport", "data", "--vidcache-train-inputs", "handles"])
    cfg = VidcacheConfig.from_args(a)
    assert cfg.options == VideoOptions(family="qwen3_vl", fps=1.0, max_pixels=200704)
    assert (cfg.mode, cfg.transport, cfg.train_inputs, cfg.cache, cfg.shared) == (
        "plugin", "data", "handles", str(tmp_path), str(tmp_path / "tier"))
    d = VidcacheConfig.from_args(p.parse_args([]))
    # qwen2_5_vl by default: stock mode; the transport is chosen from the cache (None); the node's cache.
    assert (d.options.family, d.mode, d.transport, d.train_inputs, d.cache, d.shared) == (
        "qwen2_5_vl", "stock", None, "tensors", None, None)
    with pytest.raises(SystemExit):
        p.parse_args(["--vidcache-mode", "fast"])
    with pytest.raises(SystemExit):
        p.parse_args(["--vidcache-transport", "nfs"])


def test_option_flags_are_generated_from_every_video_option():
    p = _parser()
    flags = set(p._option_string_actions)
    fields = VideoOptions.flag_fields()
    assert OPTION_NAMES == tuple(n for n, _ in fields) and "size_factor" in OPTION_NAMES
    for name, typ in fields:
        flag = "--vidcache-" + name.replace("_", "-")
        assert flag in flags, flag
        assert p._option_string_actions[flag].type is typ
    a = p.parse_args(["--vidcache-family", "qwen3_vl", "--vidcache-size-factor", "224", "--vidcache-nframes", "8",
                      "--vidcache-video-start", "0.5"])
    assert video_options_from_args(a) == VideoOptions(family="qwen3_vl", size_factor=224, nframes=8, video_start=0.5)


def test_mode_defaults_by_family():
    p = _parser()
    assert VidcacheConfig.from_args(p.parse_args(["--vidcache-family", "qwen3_vl"])).mode == "plugin"
    for family in ("qwen2_vl", "qwen2_5_vl"):
        assert VidcacheConfig.from_args(p.parse_args(["--vidcache-family", family])).mode == "stock"
    # an explicit mode always wins
    assert VidcacheConfig.from_args(p.parse_args(["--vidcache-family", "qwen2_5_vl", "--vidcache-mode",
                                                  "plugin"])).mode == "plugin"
    # a namespace without the flags (only --data-source-path points at vidcache) follows the same rule
    assert VidcacheConfig.from_args(argparse.Namespace(vidcache_family="qwen3_vl")).mode == "plugin"


def test_family_comes_from_the_checkpoint_and_a_contradiction_is_refused_at_startup(tmp_path):
    ckpt = tmp_path / "Qwen3-VL-8B"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps({"model_type": "qwen3_vl", "architectures": ["X"]}))
    p = _parser()
    p.add_argument("--hf-checkpoint")
    cfg = VidcacheConfig.from_args(p.parse_args(["--hf-checkpoint", str(ckpt)]))
    assert cfg.options.family == "qwen3_vl" and cfg.mode == "plugin"           # inferred, with its default mode
    same = VidcacheConfig.from_args(p.parse_args(["--hf-checkpoint", str(ckpt), "--vidcache-family", "qwen3_vl"]))
    assert same.options == cfg.options
    with pytest.raises(ValueError) as e:
        VidcacheConfig.from_args(p.parse_args(["--hf-checkpoint", str(ckpt), "--vidcache-family", "qwen2_5_vl"]))
    assert "--vidcache-family qwen2_5_vl" in str(e.value) and "model_type: qwen3_vl" in str(e.value)
    # No readable config.json (a hub id): the explicit family, else the documented fallback.
    assert VidcacheConfig.from_args(p.parse_args(["--hf-checkpoint", "Qwen/Qwen2-VL-2B"])).options.family == \
        "qwen2_5_vl"


def test_qwen3_stock_off_the_224_grid_fails_at_startup_naming_both_fixes():
    p = _parser()
    with pytest.raises(ValueError) as e:
        VidcacheConfig.from_args(p.parse_args(["--vidcache-family", "qwen3_vl", "--vidcache-mode", "stock"]))
    msg = str(e.value)
    assert "--vidcache-mode plugin" in msg
    assert f"--vidcache-size-factor {STOCK_SGLANG_QWEN3_SIZE_FACTOR}" in msg
    assert "32" in msg                                    # names the grid the frames are on
    with pytest.raises(ValueError, match="--vidcache-mode plugin"):
        VidcacheConfig(cache=None, options=VideoOptions(family="qwen3_vl", size_factor=64), mode="stock")
    # the stock-safe grid, and the same options as VideoOptions.for_stock_sglang, are accepted
    ok = VidcacheConfig.from_args(p.parse_args(["--vidcache-family", "qwen3_vl", "--vidcache-mode", "stock",
                                                "--vidcache-size-factor", str(STOCK_SGLANG_QWEN3_SIZE_FACTOR)]))
    assert ok.mode == "stock" and ok.options == VideoOptions.for_stock_sglang("qwen3_vl")
    # Qwen2/2.5-VL frames are on SGLang's own grid: stock is fine
    assert VidcacheConfig(cache=None, options=VideoOptions(family="qwen2_5_vl"), mode="stock").mode == "stock"


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="base-url"):
        VidcacheConfig.from_args(argparse.Namespace(vidcache_transport="http"))
    with pytest.raises(ValueError, match="transport"):
        VidcacheConfig(cache=None, options=VideoOptions(), transport="nfs")
    with pytest.raises(ValueError, match="mode"):
        VidcacheConfig(cache=None, options=VideoOptions(), mode="fast")
    with pytest.raises(ValueError, match="train-inputs"):
        VidcacheConfig(cache=None, options=VideoOptions(), train_inputs="pixels")


def test_config_without_registered_flags_uses_the_node_cache(node_env):
    ns = argparse.Namespace(multimodal_keys={"video": "clips"})       # only Miles' own args
    cfg = VidcacheConfig.from_args(ns)
    assert cfg.cache is None and cfg.shared is None and cfg.video_key == "clips" and cfg.mode == "stock"
    assert video_options_from_args(ns) == VideoOptions()
    c = cfg.open_cache()
    assert c is vidcache.node_cache() and c.path == str(node_env)      # $VIDCACHE_DIR, not a default path
    assert c.shared is None


def test_open_cache_with_a_shared_tier_flag(tmp_path, monkeypatch):
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    cfg = VidcacheConfig(cache=None, options=VideoOptions(), shared=str(tmp_path / "tier"))
    c = cfg.open_cache()
    assert c is cfg.open_cache()                                        # one per process
    assert c.path == str(tmp_path / "node") and c.shared is not None
    assert c.identity.startswith("tier-")                               # the shared tier's id, not a path
    explicit = VidcacheConfig(cache=str(tmp_path / "other"), options=VideoOptions(), shared=str(tmp_path / "tier"))
    c2 = explicit.open_cache()
    assert c2.path == str(tmp_path / "other") and c2.identity == c.identity   # same tier, same identity


def test_handles_metadata_round_trip(cache):
    o1, o2 = VideoOptions(fps=1.0), VideoOptions(family="qwen3_vl", nframes=8)
    k2 = _key(b"clip b", o2)
    hs = [VideoHandle("/data/a.mp4", o1, cache.identity),
          VideoHandle("/data/b #1.mp4", o2, cache.identity, key=k2)]
    md = {"row": 3, KEY: metadata_entry(hs)}
    assert has_video(md) and not has_video({"row": 3}) and not has_video(None)
    assert md[KEY]["videos"][0] == {"source": "/data/a.mp4", "options": o1.to_dict(), "identity": cache.identity}
    for clone in (copy.deepcopy(md), pickle.loads(pickle.dumps(md)), json.loads(json.dumps(md))):
        assert clone == md                                           # plain dicts: merge_samples' == works
        back = handles_from_metadata(clone)
        assert back == hs
        assert back[0].key is None and back[1].key == k2 and back[1].identity == cache.identity
    bad = copy.deepcopy(md)
    bad[KEY]["videos"][1]["key"] = "../../etc/passwd"
    with pytest.raises(InvalidKeyError):
        handles_from_metadata(bad)                                   # a key from outside is checked first
    prep = PreparedRequest([1, 2], [1, 9, 9, 2], ["file:///x.mkv"], {}, "stock")
    set_request_state(md, prep)
    assert md[KEY]["request"] == {"compact_ids": [1, 2], "prompt_len": 4, "video_data": ["file:///x.mkv"], "mode": "stock"}


def test_handle_tensor_encoding(cache):
    o = VideoOptions(fps=2.0)
    hs = [VideoHandle("/v.mp4", o, cache.identity, key=_key(b"v", o)), VideoHandle("/w.mp4", o, cache.identity)]
    t = encode_handles(hs, "plugin")
    assert t.dtype == torch.uint8 and t.ndim == 1
    mode, back = decode_handles(t.clone())
    assert mode == "plugin" and back == hs and back[0].key == hs[0].key and back[1].key is None
    assert [h.identity for h in back] == [cache.identity] * 2
    assert torch.equal(encode_handles([h.to_dict() for h in hs], "plugin"), t)     # dicts or handles: same bytes
    assert set(handle_train_inputs(hs, "stock")) == {HANDLE_KEY}
    bad = json.loads(bytes(t.numpy()).decode())
    bad["v"] = 9
    with pytest.raises(ValueError, match="encoding"):
        decode_handles(torch.frombuffer(bytearray(json.dumps(bad).encode()), dtype=torch.uint8))


@pytest.fixture(scope="module")
def q25():
    return build_processor("qwen2_5_vl")


@pytest.mark.parametrize("mode", ["stock", "plugin"])
def test_train_side_rebuild_equals_rollout_tensors(cache, videos, q25, mode):
    h = vidcache.get(videos["h264_30"], VideoOptions(family="qwen2_5_vl", fps=1.0), cache)
    h2 = vidcache.get(videos["mpeg4_25_odd"], VideoOptions(family="qwen2_5_vl", nframes=4), cache)
    want = vidcache.train_inputs(q25, [h, h2], mode=mode, memo=False)
    # Unpickled elsewhere, a handle finds its cache by identity (this process made it: the same object).
    got = hydrate({HANDLE_KEY: encode_handles([h.to_dict(), h2.to_dict()], mode)}, q25)
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert hydrate(None, q25) is None
    plain = {"pixel_values": torch.zeros(2)}
    assert hydrate(plain, q25) is plain


def test_hydrate_refuses_a_foreign_tier(node_env, cache, videos, q25):
    """A handle names its cache by identity; a process that has no cache with that identity (and whose
    node cache is another) refuses it rather than rebuilding into some other directory."""
    o = VideoOptions(family="qwen2_5_vl", fps=1.0)
    real = vidcache.get(videos["h264_30"], o, cache)
    foreign = VideoHandle(real.source, o, "tier-" + "0" * 32, key=real.key)
    with pytest.raises(TierMismatchError, match="VIDCACHE_SHARED"):
        hydrate({HANDLE_KEY: encode_handles([foreign], "stock")}, q25)
    assert vidcache.node_cache().entries() == []                     # nothing was built in the node cache


class _FakeIterator:
    def __init__(self, rollout_data):
        self.rollout_data, self.offset = rollout_data, 0

    def get_next(self, keys):
        return {k: list(self.rollout_data.get(k)) if self.rollout_data.get(k) is not None else None for k in keys}


def test_get_batch_is_patched_in_every_by_name_importer(cache, videos, q25, monkeypatch):
    h = vidcache.get(videos["h264_30"], VideoOptions(family="qwen2_5_vl", fps=1.0), cache)
    seen = []

    def get_batch(data_iterator, keys, pad_multiplier=128):
        b = data_iterator.get_next(keys)
        seen.append(b)
        return b

    # The defining module and two by-name importers, like training_utils.data / megatron model.py / fsdp actor.
    names = ["_vc_fake.data", "_vc_fake.model", "_vc_fake.actor"]
    for n in names:
        m = types.ModuleType(n)
        m.get_batch = get_batch
        monkeypatch.setitem(sys.modules, n, m)
    calls = []

    def factory():
        calls.append(1)
        return q25

    assert patch_get_batch(factory, names) == names
    assert patch_get_batch(factory, names) == names          # idempotent: no double wrapping
    assert sys.modules["_vc_fake.model"].get_batch.__wrapped__ is get_batch
    it = _FakeIterator({"tokens": [[1], [2]], "multimodal_train_inputs": [{HANDLE_KEY: encode_handles([h], "stock")}, None]})
    out = sys.modules["_vc_fake.model"].get_batch(it, ["tokens", "multimodal_train_inputs"])
    want = h.train_inputs(q25, mode="stock", memo=False)
    assert out["multimodal_train_inputs"][1] is None
    assert set(out["multimodal_train_inputs"][0]) == set(want)
    assert all(torch.equal(out["multimodal_train_inputs"][0][k], want[k]) for k in want)
    assert HANDLE_KEY not in out["multimodal_train_inputs"][0]
    assert calls == [1]
    # keys without multimodal inputs pass the iterator through untouched
    sys.modules["_vc_fake.actor"].get_batch(it, ["tokens"])
    assert seen[-1] == {"tokens": [[1], [2]]}
    assert isinstance(HydratingIterator(it, q25).rollout_data, dict)


@pytest.fixture
def restore_rope_index(monkeypatch):
    """install_train_hooks gives transformers' classes the engine's M-RoPE rule: put the originals back after."""
    from vidcache.positions import patchable
    for module, name in patchable().values():
        cls = getattr(importlib.import_module(module), name)
        monkeypatch.setattr(cls, "get_rope_index", cls.get_rope_index)
    return [f"{m}.{n}" for m, n in patchable().values()]


def test_install_train_hooks_opens_the_configured_cache(tmp_path, monkeypatch, node_env, restore_rope_index):
    """With handles, the hook opens the train node's cache from Miles' args (flags here; the environment
    otherwise) at init, so handles naming that cache resolve to it; the node's own cache is another one."""
    from miles_integration import train_hooks
    from vidcache.node import cache_for

    factories = []
    monkeypatch.setattr(train_hooks, "patch_get_batch", lambda factory, engine=None: factories.append(factory) or ["fake"])
    by_name = []                # Miles' modules stay as they are: the wrappers are tested on their own
    monkeypatch.setattr(train_hooks, "patch_by_name", lambda attr, modules, wrap: by_name.append(attr) or [attr])
    ns = argparse.Namespace(vidcache_train_inputs="handles", vidcache_cache=str(tmp_path / "train"),
                            vidcache_shared=str(tmp_path / "tier"), hf_checkpoint=str(tmp_path / "no-ckpt"))
    assert install_train_hooks(ns) == restore_rope_index + ["fake", "get_data_iterator"] and len(factories) == 1
    assert by_name == ["get_data_iterator"]
    c = VidcacheConfig.from_args(ns).open_cache()
    assert c.path == str(tmp_path / "train") and c.identity.startswith("tier-")
    assert cache_for(c.identity) is c
    assert vidcache.node_cache().identity != c.identity                  # not the env's (node_env: no tier)


def test_install_train_hooks_only_sets_the_position_rule_for_tensors(restore_rope_index):
    assert install_train_hooks(argparse.Namespace(vidcache_train_inputs="tensors")) == restore_rope_index
    assert install_train_hooks(argparse.Namespace()) == restore_rope_index
    assert install_train_hooks(argparse.Namespace(vidcache_positions="transformers")) == []


def test_install_train_hooks_gives_megatron_bridges_model_sglangs_positions(restore_rope_index):
    """Megatron-Bridge's Qwen25VLModel binds transformers' ``Qwen2_5_VLModel.get_rope_index`` when it is built
    (``types.MethodType``, after Miles' init hook) and ignores ``position_ids``: after install_train_hooks, what
    it binds computes SGLang's rule; before, transformers' (the canary check names it)."""
    import types

    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel

    from vidcache.positions import _CANARY_IDS, _canary, trainer_rule_problem
    assert "Qwen2_5_VLModel.get_rope_index puts" in trainer_rule_problem("qwen2_5_vl", "sglang")
    install_train_hooks(argparse.Namespace(vidcache_train_inputs="tensors"))
    assert trainer_rule_problem("qwen2_5_vl", "sglang") is None and trainer_rule_problem("qwen2_vl") is None
    # As Bridge builds it: a module whose config carries the vision config and the token ids.
    from transformers import Qwen2_5_VLConfig
    bridge = types.SimpleNamespace(config=Qwen2_5_VLConfig(vision_config={"spatial_merge_size": 2,
                                                                          "tokens_per_second": 2}, **_CANARY_IDS))
    bridge.get_rope_index = types.MethodType(Qwen2_5_VLModel.get_rope_index, bridge)
    ids = torch.tensor([_canary("qwen2_5_vl")] * 2)
    mm = (ids == _CANARY_IDS["video_token_id"]).int() * 2
    grids = torch.tensor([[24, 20, 20], [6, 12, 16]] * 2)
    spg = torch.tensor([1.0, 0.5] * 2)
    pos, delta = bridge.get_rope_index(ids, mm, None, grids, second_per_grid_ts=spg)
    from vidcache import mrope
    want = mrope.positions(ids[0], rule="sglang", family="qwen2_5_vl", merge=2, tokens_per_second=2,
                           image_token_id=_CANARY_IDS["image_token_id"], video_token_id=_CANARY_IDS["video_token_id"],
                           video_grid_thw=grids[:2], second_per_grid_ts=spg[:2])
    assert torch.equal(pos[:, 0], want) and torch.equal(pos[:, 1], want)
    assert delta.tolist() == [[int(want.max()) + 1 - ids.shape[1]]] * 2
