"""Mixed image / video rows, parquet prompt files (videos as paths or bytes) and HF datasets: prewarm and the
lazy dataset.  Images are checked (Miles' own fetch_image), never cached; videos are cached as from JSONL."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import pyarrow as pa  # vidcache's own dependency (Miles' parquet prompt files)
import pyarrow.parquet as pq

from vidcache import VideoCache, VideoOptions
from vidcache.dataset import InlineBytes, LazyVideoDataset
from vidcache.errors import UnknownColumnError
from vidcache.prewarming import prewarm
from vidcache.testing.videos import make_video

from support.cli import EVERYTHING, run_cli

MM = json.dumps({"video": "videos", "image": "images"})


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    from PIL import Image
    d = tmp_path_factory.mktemp("media")
    make_video(str(d / "a.mkv"), codec="ffv1", width=64, height=48, fps=10, n_frames=10, seed=1)
    make_video(str(d / "b.mkv"), codec="ffv1", width=48, height=64, fps=10, n_frames=8, seed=2)
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(d / "i.png")
    (d / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"not the rest of a png")
    return d


def _rows(d):
    """Image-only, video-only and image + video rows (relative paths: resolved against the file's directory)."""
    return [
        {"prompt": "<image> what is it?", "images": ["i.png"], "videos": [], "label": "0"},
        {"prompt": "<video> what happens?", "images": [], "videos": ["a.mkv"], "label": "1"},
        {"prompt": "<image> and <video>?", "images": ["i.png"], "videos": ["b.mkv"], "label": "2"},
        {"prompt": [{"role": "user", "content": [{"type": "image", "image": "i.png"},
                                                 {"type": "video", "video": "a.mkv", "fps": 1.0},
                                                 {"type": "text", "text": "same?"}]}], "label": "3"},
    ]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _cli(*args, cache, cwd):
    return run_cli(args, cache, inherit=EVERYTHING, cwd=str(cwd), timeout=600)


def test_cli_prewarms_mixed_jsonl_and_the_same_rows_as_parquet(tmp_path, media):
    """CLI only: a fresh VIDCACHE_DIR, the mixed JSONL, then the same rows as parquet: 0 failures, and the
    parquet run finds every video the JSONL run built."""
    import shutil
    work = tmp_path / "data"
    shutil.copytree(media, work)
    rows = _rows(work)
    jsonl = _jsonl(work / "mixed.jsonl", rows)
    cache = tmp_path / "fresh_cache"
    r = _cli("prewarm", str(jsonl), "--multimodal-keys", MM, "--no-progress", "--min-pixels", "3136",
             cache=cache, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "3 new, 0 hit" in r.stdout and "1 images checked" in r.stdout and "0 failed" in r.stdout, r.stdout
    # Parquet as Miles reads it: message-list prompts in a column need one type per column, so the message row
    # goes as JSON text in another file; here the first three rows.
    pq.write_table(pa.Table.from_pylist(rows[:3]), work / "mixed.parquet")
    r = _cli("prewarm", str(work / "mixed.parquet"), "--multimodal-keys", MM, "--no-progress",
             "--min-pixels", "3136", cache=cache, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "0 new, 2 hit" in r.stdout and "0 failed" in r.stdout, r.stdout
    assert not (work / "mixed.failures.jsonl").exists()


def test_unreadable_image_or_video_costs_its_row_only(tmp_path, media):
    rows = _rows(media)[:3] + [
        {"prompt": "<image> broken", "images": ["broken.png"], "videos": []},
        {"prompt": "<video> missing", "images": [], "videos": ["missing.mkv"]},
        {"prompt": "<image> gone", "images": ["gone.png"], "videos": []},
    ]
    cache = VideoCache(tmp_path / "cache")
    path = _jsonl(media / "bad_mixed.jsonl", rows)
    s = prewarm(str(path), cache, VideoOptions(min_pixels=3136), image_key="images", progress=False,
                failures_path=str(tmp_path / "f.jsonl"))
    by_row = {f["row"]: f for f in s.failures}
    assert sorted(by_row) == [3, 4, 5]
    assert by_row[3]["kind"] == "decode" and "broken.png" in by_row[3]["source"]
    assert by_row[4]["kind"] == "not_found" and by_row[5]["kind"] == "not_found"
    assert s.new == 2 and s.images == 1 and s.failed == 3
    assert sorted(json.loads(x)["row"] for x in open(tmp_path / "f.jsonl")) == [3, 4, 5]    # in completion order


def test_parquet_bytes_are_hashed_never_written_beside_the_dataset(tmp_path, media):
    """A bytes column: the entry is the one the file would make (same content digest); nothing appears beside
    the dataset and the cache's temp directory is empty afterwards."""
    data = tmp_path / "ds"
    data.mkdir()
    raw = (media / "a.mkv").read_bytes()
    pq.write_table(pa.Table.from_pylist([{"prompt": "<video> x", "videos": [raw]},
                                         {"prompt": "<video> y", "videos": [raw]}]), data / "bytes.parquet")
    # HF datasets' Video storage form, {"bytes", "path"}, in a column of its own name.
    pq.write_table(pa.Table.from_pylist([{"prompt": "<video> z", "clips": [{"bytes": raw, "path": None}]}]),
                   data / "hf_form.parquet")
    cache = VideoCache(tmp_path / "cache")
    opts = VideoOptions(min_pixels=3136)
    s = prewarm(str(data / "bytes.parquet"), cache, opts, progress=False)
    assert (s.new, s.hit, s.failed) == (1, 0, 0), s.failures       # the two rows hold the same clip
    s = prewarm(str(data / "hf_form.parquet"), cache, opts, video_key="clips", progress=False)
    assert (s.new, s.hit, s.failed) == (0, 1, 0), s.failures
    assert sorted(os.listdir(data)) == ["bytes.parquet", "hf_form.parquet"]
    assert not any(files for _, _, files in os.walk(cache.tmp_dir))
    by_file = cache.ensure(str(media / "a.mkv"), opts)
    assert by_file.status == "hit" and by_file.key == InlineBytes(raw).key(opts)
    ds = LazyVideoDataset(str(data / "bytes.parquet"), cache, opts)
    h = ds[1].handles[0]
    assert h.source is None and h.key == by_file.key and ds[1].inline[h.key].data == raw
    assert h.num_video_tokens > 0                                   # from the manifest


def test_unknown_keys_name_the_columns_found(tmp_path, media):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "<video>", "clips": ["a.mkv"]}]), path)
    with pytest.raises(UnknownColumnError, match=r"no column 'prompt'.*\['question', 'clips'\]"):
        prewarm(str(path), VideoCache(tmp_path / "c"), VideoOptions(), progress=False)
    with pytest.raises(UnknownColumnError, match=r"no column 'videos'.*\['question', 'clips'\]"):
        prewarm(str(path), VideoCache(tmp_path / "c"), VideoOptions(), input_key="question", progress=False)
    with pytest.raises(UnknownColumnError, match=r"no column 'pics'"):
        LazyVideoDataset(str(path), "local-" + "0" * 32, VideoOptions(), input_key="question", image_key="pics")
    r = _cli("prewarm", str(path), "--input-key", "question", "--no-progress", cache=tmp_path / "c2", cwd=tmp_path)
    assert r.returncode != 0 and "columns found: ['question', 'clips']" in r.stderr, r.stderr
    # A directory that is no dataset (clips only) is refused, not turned into one by load_dataset.
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "a.mkv").write_bytes((media / "a.mkv").read_bytes())
    r = _cli("prewarm", str(tmp_path / "clips"), "--no-progress", cache=tmp_path / "c3", cwd=tmp_path)
    assert r.returncode != 0 and "neither a save_to_disk directory" in r.stderr, r.stderr


def test_hf_dataset_and_its_directory_prewarm_with_progress(tmp_path, media, capsys):
    import datasets          # vidcache[data], in [test]: scripts/install.sh --test installs it (never a skip)
    rows = _rows(media)[:3]
    absolute = [{**r, "images": [str(media / x) for x in r["images"]], "videos": [str(media / x) for x in r["videos"]]}
                for r in rows]
    ds = datasets.Dataset.from_list(absolute)
    cache = VideoCache(tmp_path / "cache")
    s = prewarm(ds, cache, VideoOptions(min_pixels=3136), image_key="images", progress=True)
    assert (s.new, s.images, s.failed) == (2, 1, 0), s.failures
    assert "reading rows" in capsys.readouterr().err                 # tqdm over the rows
    # HF's Image feature (decoded to PIL by default) is read as stored: bytes, checked, never decoded per row.
    imgs = datasets.Dataset.from_dict({"prompt": ["<image> a"], "images": [[str(media / "i.png")]]}).cast_column(
        "images", datasets.List(datasets.Image()))
    imgs.save_to_disk(str(tmp_path / "saved"))
    s = prewarm(str(tmp_path / "saved"), cache, VideoOptions(min_pixels=3136), image_key="images", progress=False)
    assert (s.images, s.failed) == (1, 0), s.failures
    lazy = LazyVideoDataset(str(tmp_path / "saved"), cache, VideoOptions(), image_key="images")
    assert len(lazy) == 1 and lazy[0].images[0].startswith("data:image;base64,")
    # A dataset directory with relative video paths: they resolve against it, in prewarm and in the lazy dataset.
    # "../a.mkv" leaves the directory, so it is read only where media_roots (--media-root) allow it (D54).
    import shutil
    shutil.copy(media / "a.mkv", tmp_path / "a.mkv")
    datasets.Dataset.from_dict({"prompt": ["<video> a"], "videos": [["../a.mkv"]]}).save_to_disk(str(tmp_path / "rel"))
    opts = VideoOptions(min_pixels=3136)
    s = prewarm(str(tmp_path / "rel"), cache, opts, progress=False)
    assert (s.new + s.hit, s.failed) == (0, 1) and s.failures[0]["kind"] == "outside_media_root", s.failures
    s = prewarm(str(tmp_path / "rel"), cache, opts, progress=False, media_roots=[tmp_path])
    assert (s.new + s.hit, s.failed) == (1, 0), s.failures      # found (a missing path would fail the row)
    h = LazyVideoDataset(str(tmp_path / "rel"), cache, opts, media_roots=[tmp_path])[0].handles[0]
    assert h.source == str(tmp_path / "a.mkv") and h.resolve(build=False)


def test_rows_with_no_media_where_prewarm_looks_say_what_they_carry(tmp_path, media):
    """D41, CLI only on a fresh node: rows whose videos sit under a field prewarm does not read ({"messages": ...}
    chat rows) gave "0 new, 0 hit, 0 failed" and nothing else.  Now it fails, naming where it looked and what the
    rows carry; with the field named, the same rows build."""
    rows = [{"messages": [{"role": "user", "content": "<video> what happens?"}], "clips": ["a.mkv"]},
            {"messages": [{"role": "user", "content": "<video> and here?"}], "clips": ["b.mkv"]}]
    ds = _jsonl(media / "chat.jsonl", rows)
    r = _cli("prewarm", str(ds), "--no-progress", cache=tmp_path / "node", cwd=tmp_path)
    # issue 40: a failure (rc 1, [no_media]), as parquet and HF datasets fail: a launch script must not carry on
    assert r.returncode == 1 and "Traceback" not in r.stderr and "[no_media]" in r.stderr, r.stderr
    assert "none of the 2 rows has a video or an image under 'videos' or 'images'" in r.stderr, r.stderr
    assert "clips, messages" in r.stderr
    r = _cli("prewarm", str(ds), "--no-progress", "--input-key", "messages", "--multimodal-keys", '{"video": "clips"}',
             cache=tmp_path / "node", cwd=tmp_path)
    assert r.returncode == 0 and "2 new" in r.stderr + r.stdout and "none of the" not in r.stderr, r.stdout + r.stderr


def test_image_errors_are_classified_and_images_get_the_scheme_allowlist(tmp_path, media):
    """D54: a refused connection was reported as ``decode`` ("not readable"), and an image could name any scheme
    qwen-vl-utils opens.  Now a refused connection is ``unavailable``, a scheme outside the images' allowlist is
    ``scheme_not_allowed`` (nothing opened), and a broken file is still ``decode``; the good rows land."""
    from support.net import free_port
    port = free_port()                                   # nothing listens there: the connection is refused
    rows = _rows(media)[:1] + [
        {"prompt": "<image> refused", "images": [f"http://127.0.0.1:{port}/a.png"], "videos": []},
        {"prompt": "<image> ftp", "images": ["ftp://127.0.0.1/a.png"], "videos": []},
        {"prompt": "<image> s3", "images": ["s3://bucket/a.png"], "videos": []},
        {"prompt": "<image> broken", "images": ["broken.png"], "videos": []},
    ]
    cache = VideoCache(tmp_path / "cache")
    s = prewarm(str(_jsonl(media / "schemes.jsonl", rows)), cache, VideoOptions(min_pixels=3136),
                image_key="images", progress=False)
    kinds = {f["row"]: f["kind"] for f in s.failures}
    assert kinds == {1: "unavailable", 2: "scheme_not_allowed", 3: "scheme_not_allowed", 4: "decode"}, s.failures
