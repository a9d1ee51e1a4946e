import json
import os
import pickle
import resource

import pytest

from vidcache import VideoCache, VideoOptions
from vidcache.dataset import LazyVideoDataset
from vidcache.prompt_files import iter_jsonl
from vidcache.errors import BadRowError, TierMismatchError


def test_opening_a_100k_row_file_decodes_nothing(tmp_path, videos, count_decodes):
    path = tmp_path / "big.jsonl"
    names = list(videos)
    with open(path, "w") as f:
        for i in range(100_000):
            f.write(json.dumps({"prompt": f"<video> question {i}", "videos": [videos[names[i % len(names)]]],
                                "label": str(i)}) + "\n")
    cache = VideoCache(tmp_path / "cache")
    ds = LazyVideoDataset(str(path), cache, VideoOptions())
    assert len(ds) == 100_000
    row = ds[99_999]
    assert row.data["label"] == "99999" and row.handles[0].source == videos[names[99_999 % len(names)]]
    assert row.handles[0].identity == cache.identity and row.handles[0].key is None
    blob = pickle.dumps(row.handles[0])
    assert len(blob) < 1024 and cache.path.encode() not in blob      # handles never carry a node path
    assert ds[-1].data == row.data and [r.index for r in ds[2:5]] == [2, 3, 4]
    with pytest.raises(IndexError):
        ds[100_000]
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
    # The clips sit beside the JSONL's directory ("../videos0/..."), which a dataset reads only where told (D54)
    ds = LazyVideoDataset(str(path), cache, VideoOptions(family="qwen2_5_vl"),
                          media_roots=[os.path.dirname(videos["h264_30"])])
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
    ds = LazyVideoDataset(str(path), "local-" + "0" * 32, VideoOptions())     # an identity: nothing opened
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert len(ds) == 100_000 and (after - before) * 1024 < 50 << 20


@pytest.mark.parametrize("by", ["object", "identity"])
def test_dataloader_workers_read_after_fork(tmp_path, videos, by):
    import torch
    rows = [{"prompt": "<video>", "videos": [videos[n]]} for n in ("h264_30", "mjpeg_24", "ffv1_10_small")] * 2
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = VideoCache(tmp_path / "cache")
    ds = LazyVideoDataset(str(path), cache if by == "object" else cache.identity, VideoOptions())
    expected = [ds[i].handles[0].frames() for i in range(len(ds))]   # builds, and opens LMDB in the parent
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2,
                                         collate_fn=lambda row: row.handles[0].frames(),
                                         multiprocessing_context="fork")
    got = list(loader)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


def test_handles_of_an_unknown_identity_are_refused(tmp_path, videos, monkeypatch):
    """A dataset named by an identity this process cannot resolve fails loudly on first use."""
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"prompt": "<video>", "videos": [videos["mjpeg_24"]]}) + "\n")
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    ds = LazyVideoDataset(str(path), "local-" + "f" * 32, VideoOptions())
    with pytest.raises(TierMismatchError, match="local-ffff"):
        ds[0].handles[0].frames()


BAD_ROWS = [
    (b"\xff\xfe not utf-8\n", "not UTF-8"),
    (b'{"prompt": "<video>", "videos": [\n', "not JSON"),
    (b'["a", "list"]\n', "JSON object"),
    (b'{"prompt": "<video>", "videos": 7}\n', "list of sources"),
    (b'{"prompt": "<video>", "videos": [7]}\n', "source string"),
    (b'{"prompt": "<video><video>", "videos": ["a.mp4"]}\n', "placeholder"),
    (b'{"prompt": [{"role": "user", "content": [{"type": "video", "video": "a.mp4", "fps": "fast"}]}]}\n',
     "per-video options"),
]


def test_each_bad_row_is_a_bad_row_error_of_its_own(tmp_path):
    good = b'{"prompt": "<video>", "videos": ["a.mp4"]}\n'
    path = tmp_path / "d.jsonl"
    path.write_bytes(good + b"".join(line + good for line, _ in BAD_ROWS))
    ds = LazyVideoDataset(str(path), "local-" + "0" * 32, VideoOptions())
    assert len(ds) == 2 * len(BAD_ROWS) + 1
    for i, (_, why) in enumerate(BAD_ROWS):
        assert ds[2 * i].handles[0].source == str(tmp_path / "a.mp4")          # its neighbours are intact
        with pytest.raises(BadRowError, match=why) as e:
            ds[2 * i + 1]
        assert e.value.kind == "bad_row"
    got = list(iter_jsonl(str(path)))
    bad = [i for i, r in got if isinstance(r, BadRowError)]
    assert len(got) == len(ds) and len(bad) == 3            # iter_jsonl parses; row-shape checks come later
