"""Mixed image / video rows through the Miles data source, against Miles' own modules (MILES_SRC) and SGLang
0.5.23's own Qwen-VL processor (tests/support/sglang_peer.py) with an image and a video in one request.

The choice under test (docs/miles.md, "Images"): images are not cached; they go through Miles' own image path
untouched.  So a sample's images must be exactly what Miles' own eager ``Dataset`` gives for the row, and an
image + video request must give SGLang's processor output equal (torch.equal) to the trainer's tensors: the
video ones from the cache, the image ones from Miles' images, with the ids expanded the same way.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from support.miles_compat import miles_or_skip

REPO = Path(__file__).resolve().parents[2]
MILES = miles_or_skip(REPO)       # Miles present: from here on a missing peer is a failure, never a skip

from support import sglang_peer  # noqa: E402

from miles.utils.data import Dataset as MilesDataset  # noqa: E402
from miles.utils.processing_utils import encode_image_for_rollout_engine, load_processor, load_tokenizer  # noqa: E402
from PIL import Image  # noqa: E402
from support.toy_processors import build_processor, save_checkpoint  # noqa: E402

import vidcache  # noqa: E402
from miles_integration.args import VidcacheConfig  # noqa: E402
from miles_integration.data_source import VidcacheDataset  # noqa: E402
from miles_integration.meta import handles_from_metadata  # noqa: E402
from vidcache.sglang.config import sglang_config  # noqa: E402
from vidcache.testing.videos import make_video  # noqa: E402

FAMILY = "qwen2_5_vl"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MM_KEYS = {"image": "images", "video": "videos"}


def _image(path, w, h, seed):
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("miles_mixed")
    ckpt = root / "ckpt"
    proc = save_checkpoint(FAMILY, ckpt, CHAT_TEMPLATE)
    make_video(str(root / "a.mp4"), codec="h264", width=160, height=120, fps=10, n_frames=20, seed=3)
    _image(root / "p.png", 150, 100, 0)          # not on the 28 grid: Miles' image path resizes it
    _image(root / "q.jpg", 320, 240, 1)          # above a 50176-pixel image budget (the capped case below)
    rows = [
        # Both keys on every row: Miles' own Dataset (the reference here) fails on a row without one.
        {"prompt": "<image>\nWhat is drawn?", "images": [str(root / "p.png")], "videos": [], "label": "img"},
        {"prompt": "<video>\nWhat happens?", "images": [], "videos": [str(root / "a.mp4")], "label": "vid"},
        {"prompt": "<image> then <video>: same colours?", "images": [str(root / "q.jpg")],
         "videos": [str(root / "a.mp4")], "label": "both"},
    ]
    data = root / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ns = argparse.Namespace(vidcache_cache=str(root / "cache"), vidcache_family=FAMILY, vidcache_fps=1.0,
                            vidcache_min_pixels=3136,
                            vidcache_max_pixels=50176, vidcache_mode="stock", vidcache_transport="file",
                            multimodal_keys=MM_KEYS)
    cfg = VidcacheConfig.from_args(ns)
    tok = load_tokenizer(str(ckpt), chat_template_path=None, trust_remote_code=True)
    processor = load_processor(str(ckpt), trust_remote_code=True)
    kw = dict(prompt_key="prompt", multimodal_keys=MM_KEYS, label_key="label", apply_chat_template=True)
    return argparse.Namespace(root=root, ckpt=ckpt, data=data, rows=rows, cfg=cfg, tok=tok, processor=processor,
                              kw=kw)


def _pixels(im):
    return (im.mode, im.size, im.tobytes())


@pytest.mark.miles
def test_samples_carry_miles_own_images_and_lazy_video_handles(env):
    ours = VidcacheDataset(str(env.data), env.tok, env.processor, None, config=env.cfg, **env.kw)
    miles = MilesDataset(str(env.data), env.tok, env.processor, None, **env.kw)     # Miles' eager path
    assert len(ours) == len(miles) == 3
    for i in range(3):
        a, b = ours.samples[i], miles.samples[i]
        assert a.prompt == b.prompt and a.label == b.label
        want = (b.multimodal_inputs or {}).get("images")
        got = (a.multimodal_inputs or {}).get("images")
        if want is None:
            assert got is None
        else:
            assert [_pixels(x) for x in got] == [_pixels(x) for x in want]     # bit for bit Miles' images
        # Videos are handles, never frames, in the sample (Miles' own Dataset holds decoded videos there).
        assert (a.multimodal_inputs or {}).get("videos") is None
        assert len(handles_from_metadata(a.metadata)) == len(env.rows[i].get("videos", []))
    assert ours.samples[0].multimodal_inputs["images"][0].size != (150, 100)   # Miles resized it (28 grid)


def _cap_images(processor, max_pixels):
    """A checkpoint whose preprocessor_config caps images below qwen-vl-utils' budget: the HF image processor
    then resizes Miles' images, on both sides."""
    ip = processor.image_processor
    ip.max_pixels = max_pixels
    ip.size = {"shortest_edge": ip.size["shortest_edge"], "longest_edge": max_pixels}
    return processor


@pytest.mark.miles
@pytest.mark.parametrize("image_max_pixels", [None, 50176])
def test_image_and_video_in_one_request_match_sglang(env, image_max_pixels):
    processor = env.processor if image_max_pixels is None else _cap_images(
        load_processor(str(env.ckpt), trust_remote_code=True), image_max_pixels)
    ds = VidcacheDataset(str(env.data), env.tok, processor, None, config=env.cfg, **env.kw)
    s = ds.samples[2]
    handles = [h.pinned() for h in handles_from_metadata(s.metadata)]
    images = s.multimodal_inputs["images"]
    prep = vidcache.prepare(processor, s.prompt, handles, mode="stock", transport="file", images=images)
    server_proc = build_processor(FAMILY, sglang_size_override=True)
    if image_max_pixels is not None:
        _cap_images(server_proc, image_max_pixels)
        assert images[0].width * images[0].height > image_max_pixels       # the cap is what resizes them
    peer = sglang_peer.build_peer(FAMILY, server_proc,
                                  video_config=sglang_config(FAMILY, "stock")["mm_process_config"]["video"])
    # What Miles' compute_request_payload puts in image_data, beside vidcache's video_data and compact ids.
    out = sglang_peer.run_peer(peer, prep.compact_ids, prep.video_data,
                               image_uris=[encode_image_for_rollout_engine(im) for im in images])
    ti = prep.train_inputs
    assert torch.equal(out["pixel_values_videos"], ti["pixel_values_videos"])
    assert torch.equal(out["video_grid_thw"].to(torch.int64), ti["video_grid_thw"])
    assert torch.equal(torch.as_tensor(out["second_per_grid_ts"], dtype=torch.float32), ti["second_per_grid_ts"])
    assert out["pixel_values"] is not None and torch.equal(out["pixel_values"], ti["pixel_values"])
    assert torch.equal(out["image_grid_thw"], ti["image_grid_thw"])
    assert out["input_ids"] == prep.expanded_ids
    # The image tensors are the ones Miles' own trainer path computes (processor on text + Miles' images).
    miles_out = processor(text=s.prompt.replace("<|vision_start|><|video_pad|><|vision_end|>", ""),
                          images=images, return_tensors="pt")
    assert torch.equal(miles_out["pixel_values"], ti["pixel_values"])
    assert torch.equal(miles_out["image_grid_thw"], ti["image_grid_thw"])


@pytest.mark.miles
@pytest.mark.parametrize("train_inputs", ["tensors", "handles"])
def test_generate_sends_miles_images_beside_cached_videos(env, train_inputs):
    """The request vidcache's generate function builds for an image + video sample (Miles' own payload code
    with its own image_data, compact ids, video_data) goes through SGLang's processor to the same ids and
    tensors the sample carries to the trainer; the divergence guard agrees."""
    from types import SimpleNamespace

    from miles.utils.async_utils import run
    from support.miles_smoke_example import make_miles_args

    from miles_integration.generate import check_divergence, prepare_sample, start_video_sample, video_payload
    from miles_integration.train_hooks import HANDLE_KEY, hydrate

    args = make_miles_args(hf_checkpoint=str(env.ckpt), router_port=1)
    cfg = VidcacheConfig(cache=env.cfg.cache, options=env.cfg.options, mode="stock", transport="file",
                         train_inputs=train_inputs)
    ds = VidcacheDataset(str(env.data), env.tok, env.processor, None, config=env.cfg, **env.kw)
    sample = ds.samples[2]
    prep = run(prepare_sample(SimpleNamespace(processor=env.processor), sample, cfg))
    st = start_video_sample(sample, prep, cfg)
    payload, halt = video_payload(args, sample, st, {"max_new_tokens": 8, "temperature": 1.0})
    assert halt is None
    images = sample.multimodal_inputs["images"]
    assert payload["image_data"] == [encode_image_for_rollout_engine(im) for im in images]
    assert payload["input_ids"] == prep.compact_ids and len(payload["video_data"]) == 1
    peer = sglang_peer.build_peer(FAMILY, build_processor(FAMILY, sglang_size_override=True),
                                  video_config=sglang_config(FAMILY, "stock")["mm_process_config"]["video"])
    out = sglang_peer.run_peer(peer, payload["input_ids"], payload["video_data"], image_uris=payload["image_data"])
    check_divergence(st, sample.tokens, {"prompt_token_ids": out["input_ids"], "meta_info": {}})
    mm = sample.multimodal_train_inputs
    if train_inputs == "handles":      # the train actor's hydration keeps Miles' image tensors beside the videos
        assert HANDLE_KEY in mm
        mm = hydrate(mm, env.processor)
    assert torch.equal(mm["pixel_values"], out["pixel_values"])
    assert torch.equal(mm["image_grid_thw"], out["image_grid_thw"])
    assert torch.equal(mm["pixel_values_videos"], out["pixel_values_videos"])
    assert torch.equal(mm["video_grid_thw"], out["video_grid_thw"].to(torch.int64))
    # --recompute-logprobs-via-prefill (VidcacheRolloutFn) scores the same request: images included.
    from miles_integration.rollout import video_prefill_payload
    pre, _ = video_prefill_payload(args, sample, {"max_new_tokens": 8})
    assert pre["image_data"] == payload["image_data"] and pre["video_data"] == payload["video_data"]
    again = sglang_peer.run_peer(peer, pre["input_ids"], pre["video_data"], image_uris=pre["image_data"])
    assert again["input_ids"] == list(sample.tokens)


@pytest.mark.miles
def test_parquet_prompt_file_with_video_bytes_gives_the_jsonl_samples(env, tmp_path):
    """The same rows as a .parquet file (Miles' other prompt format), the video as bytes: same prompts, same
    images, and handles to the same entries; the bytes are built in the rollout process on first use."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from miles_integration.data_source import _cached

    raw = (env.root / "a.mp4").read_bytes()
    rows = [{**r, "videos": [raw for _ in r["videos"]]} for r in env.rows]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "mixed.parquet")
    cfg = VidcacheConfig(cache=str(tmp_path / "fresh"), options=env.cfg.options, mode="stock", transport="file")
    from_jsonl = VidcacheDataset(str(env.data), env.tok, env.processor, None, config=env.cfg, **env.kw)
    from_parquet = VidcacheDataset(str(tmp_path / "mixed.parquet"), env.tok, env.processor, None, config=cfg, **env.kw)
    for i in range(len(rows)):
        a, b = from_jsonl.samples[i], from_parquet.samples[i]
        assert a.prompt == b.prompt and a.label == b.label
        assert [_pixels(x) for x in (a.multimodal_inputs or {}).get("images") or []] == \
            [_pixels(x) for x in (b.multimodal_inputs or {}).get("images") or []]
        ha = [h.pinned() for h in handles_from_metadata(a.metadata)]
        hb = handles_from_metadata(b.metadata)
        assert [h.key for h in ha] == [h.key for h in hb]               # content-addressed: one entry
        assert all(h.source is None and _cached(h) for h in hb)        # built from the bytes at sample build
        for x, y in zip(ha, hb):
            assert torch.equal(x.frames(), y.frames())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fresh", "mixed.parquet"]
