"""miles_integration pieces that need no Miles checkout: flags, handle<->metadata, train-side rebuild."""
import argparse
import copy
import pickle
import sys
import types

import pytest
import torch

from miles_integration.args import VidcacheConfig, add_vidcache_arguments, video_options_from_args
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
from toy_processors import build_processor
from vidcache import PreparedRequest, VideoHandle, VideoOptions


def test_flags_parse_into_options_and_config(tmp_path):
    p = argparse.ArgumentParser()
    add_vidcache_arguments(p)
    add_vidcache_arguments(p)            # rollout fn and generate fn both register: must not conflict
    a = p.parse_args(["--vidcache-cache", str(tmp_path), "--vidcache-family", "qwen3_vl", "--vidcache-fps", "1",
                      "--vidcache-max-pixels", "200704", "--vidcache-mode", "plugin", "--vidcache-transport", "data",
                      "--vidcache-train-inputs", "handles"])
    cfg = VidcacheConfig.from_args(a)
    assert cfg.options == VideoOptions(family="qwen3_vl", fps=1.0, max_pixels=200704)
    assert (cfg.mode, cfg.transport, cfg.train_inputs, cfg.cache) == ("plugin", "data", "handles", str(tmp_path))
    d = VidcacheConfig.from_args(p.parse_args([]))
    assert (d.mode, d.transport, d.train_inputs) == ("stock", "file", "tensors")      # stock unless asked
    with pytest.raises(SystemExit):
        p.parse_args(["--vidcache-mode", "fast"])


def test_config_without_registered_flags_uses_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path))
    ns = argparse.Namespace(multimodal_keys={"video": "clips"})       # only Miles' own args
    cfg = VidcacheConfig.from_args(ns)
    assert cfg.cache == str(tmp_path) and cfg.video_key == "clips" and cfg.mode == "stock"
    assert video_options_from_args(ns) == VideoOptions()
    with pytest.raises(ValueError, match="base-url"):
        VidcacheConfig.from_args(argparse.Namespace(vidcache_transport="http"))


def test_handles_metadata_round_trip(tmp_path):
    hs = [VideoHandle("/data/a.mp4", VideoOptions(fps=1.0), str(tmp_path)),
          VideoHandle("/data/b #1.mp4", VideoOptions(family="qwen3_vl", nframes=8), str(tmp_path), key="k.1.x")]
    md = {"row": 3, KEY: metadata_entry(hs)}
    assert has_video(md) and not has_video({"row": 3}) and not has_video(None)
    for clone in (copy.deepcopy(md), pickle.loads(pickle.dumps(md)), __import__("json").loads(__import__("json").dumps(md))):
        assert clone == md                                           # plain dicts: merge_samples' == works
        assert handles_from_metadata(clone) == hs
        assert handles_from_metadata(clone)[1].key == "k.1.x"
    prep = PreparedRequest([1, 2], [1, 9, 9, 2], ["file:///x.mkv"], {}, "stock")
    set_request_state(md, prep)
    assert md[KEY]["request"] == {"compact_ids": [1, 2], "prompt_len": 4, "video_data": ["file:///x.mkv"], "mode": "stock"}


def test_handle_tensor_encoding(tmp_path):
    hs = [VideoHandle("/v.mp4", VideoOptions(fps=2.0), str(tmp_path), key="abc")]
    t = encode_handles(hs, "plugin")
    assert t.dtype == torch.uint8 and t.ndim == 1
    mode, back = decode_handles(t.clone())
    assert mode == "plugin" and back == hs and back[0].key == "abc"
    assert set(handle_train_inputs(hs, "stock")) == {HANDLE_KEY}


@pytest.fixture(scope="module")
def q25():
    return build_processor("qwen2_5_vl")


@pytest.mark.parametrize("mode", ["stock", "plugin"])
def test_train_side_rebuild_equals_rollout_tensors(cache, videos, q25, mode):
    h = cache.get(videos["h264_30"], VideoOptions(family="qwen2_5_vl", fps=1.0))
    h2 = cache.get(videos["mpeg4_25_odd"], VideoOptions(family="qwen2_5_vl", nframes=4))
    want = __import__("vidcache").train_inputs(q25, [h, h2], mode=mode)
    got = hydrate({HANDLE_KEY: encode_handles([h.to_dict(), h2.to_dict()], mode)}, q25)
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert hydrate(None, q25) is None
    plain = {"pixel_values": torch.zeros(2)}
    assert hydrate(plain, q25) is plain


class _FakeIterator:
    def __init__(self, rollout_data):
        self.rollout_data, self.offset = rollout_data, 0

    def get_next(self, keys):
        return {k: list(self.rollout_data.get(k)) if self.rollout_data.get(k) is not None else None for k in keys}


def test_get_batch_is_patched_in_every_by_name_importer(cache, videos, q25, monkeypatch):
    h = cache.get(videos["h264_30"], VideoOptions(family="qwen2_5_vl", fps=1.0))
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
    want = h.train_inputs(q25, mode="stock")
    assert out["multimodal_train_inputs"][1] is None
    assert all(torch.equal(out["multimodal_train_inputs"][0][k], want[k]) for k in want)
    assert HANDLE_KEY not in out["multimodal_train_inputs"][0]
    # keys without multimodal inputs pass the iterator through untouched
    sys.modules["_vc_fake.actor"].get_batch(it, ["tokens"])
    assert seen[-1] == {"tokens": [[1], [2]]}
    assert isinstance(HydratingIterator(it, q25).rollout_data, dict)


def test_install_train_hooks_is_a_noop_for_tensors():
    assert install_train_hooks(argparse.Namespace(vidcache_train_inputs="tensors")) == []
    assert install_train_hooks(argparse.Namespace()) == []
