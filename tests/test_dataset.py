import json
import os
import pickle
import resource

import pytest

from vidcache import VideoCache, VideoOptions
from vidcache.loader.dataset import LazyVideoDataset


def test_opening_a_100k_row_file_decodes_nothing(tmp_path, videos, count_decodes):
    path = tmp_path / "big.jsonl"
    names = list(videos)
    with open(path, "w") as f:
        for i in range(100_000):
            f.write(json.dumps({"prompt": f"<video> question {i}", "videos": [videos[names[i % len(names)]]],
                                "label": str(i)}) + "\n")
    ds = LazyVideoDataset(str(path), str(tmp_path / "cache"), VideoOptions())
    assert len(ds) == 100_000
    row = ds[99_999]
    assert row.data["label"] == "99999" and row.handles[0].source == videos[names[99_999 % len(names)]]
    assert len(pickle.dumps(row.handles[0])) < 1024
    assert count_decodes == []                      # nothing fetched or decoded by opening or indexing


def test_rows_resolve_message_items_and_token_counts(tmp_path, videos, count_decodes):
    rel = os.path.relpath(videos["h264_30"], tmp_path)
    rows = [
        {"prompt": "<video>\nwhat?", "videos": [rel]},
        {"prompt": [{"role": "user", "content": [{"type": "video", "video": videos["mjpeg_24"], "fps": 1.0,
                                                   "max_pixels": 50176, "min_pixels": 3136}, {"type": "text", "text": "what?"}]}]},
        {"prompt": "text only"},
    ]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = VideoCache(tmp_path / "cache")
    ds = LazyVideoDataset(str(path), cache.path, VideoOptions(family="qwen2_5_vl"))
    r0, r1, r2 = ds[0], ds[1], ds[2]
    assert r0.handles[0].source == videos["h264_30"]            # relative to the JSONL's directory
    assert r1.handles[0].options.fps == 1.0 and r1.handles[0].options.max_pixels == 50176
    assert r2.handles == []
    for r in (r0, r1):
        for h in r.handles:
            cache.ensure(h.source, h.options)                  # prewarm
    n = len(count_decodes)
    # Token counts come from manifests: no decoding.
    assert r0.num_video_tokens == r0.handles[0].metadata["video_pad_tokens"] > 0
    assert r1.num_video_tokens < r0.num_video_tokens
    assert len(count_decodes) == n


def test_lazy_dataset_memory_is_small(tmp_path):
    # RSS budget for 100k rows: the offsets array is 800 KB; this guards against keeping rows.
    path = tmp_path / "d.jsonl"
    with open(path, "w") as f:
        for i in range(100_000):
            f.write(json.dumps({"prompt": "<video>" + "x" * 200, "videos": [f"/v/{i}.mp4"]}) + "\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ds = LazyVideoDataset(str(path), str(tmp_path / "c"), VideoOptions())
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert len(ds) == 100_000 and (after - before) * 1024 < 50 << 20


def test_dataloader_workers_read_after_fork(tmp_path, videos):
    torch = pytest.importorskip("torch")
    rows = [{"prompt": "<video>", "videos": [videos[n]]} for n in ("h264_30", "mjpeg_24", "ffv1_10_small")] * 2
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = VideoCache(tmp_path / "cache")
    ds = LazyVideoDataset(str(path), cache.path, VideoOptions())
    expected = [ds[i].handles[0].frames() for i in range(len(ds))]   # builds, and opens LMDB in the parent
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         collate_fn=lambda row: row.handles[0].frames(),
                                         multiprocessing_context="fork")
    got = list(loader)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
