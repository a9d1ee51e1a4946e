"""Issue 51 item 1: one file is one entry however its path is spelled, in Python as on the CLI.  The core
(``loader.fetch.canonical_source``) records and looks up a local file by its absolute, normalised path, so
``a.mp4``, ``./a.mp4``, the absolute path and ``file:///abs/a.mp4`` find the entry any of them built."""
import json
import os
import shutil

import pytest

import vidcache
from vidcache import LazyVideoDataset, VideoCache, VideoOptions
from support.cli import run_cli


@pytest.fixture
def workdir(tmp_path, videos, monkeypatch):
    (tmp_path / "videos").mkdir()
    shutil.copy(videos["ffv1_10_small"], tmp_path / "videos" / "a.mp4")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _spellings(root):
    absolute = str(root / "videos" / "a.mp4")
    return ["videos/a.mp4", "./videos/a.mp4", "videos/../videos/a.mp4", absolute, "file://" + absolute]


def test_canonical_source_spells_a_local_file_one_way(workdir):
    from vidcache.loader.fetch import canonical_source
    want = str(workdir / "videos" / "a.mp4")
    assert {canonical_source(s) for s in _spellings(workdir)} == {want}
    assert canonical_source("file:///x/a%20b.mp4") == "/x/a b.mp4"      # a file URI is percent-decoded
    for other in ("s3://bucket/a.mp4", "https://host/a.mp4", "data:video/mp4;base64,AAAA", "", 3):
        assert canonical_source(other) == other                       # not a local file: as given


def test_every_spelling_finds_the_entry_python_built(workdir):
    cache = VideoCache(workdir / "cache")
    opts = VideoOptions()
    h = vidcache.get("videos/a.mp4", opts, cache)
    assert h.source == str(workdir / "videos" / "a.mp4")     # the handle keeps no cwd-relative path
    for spelling in _spellings(workdir):
        assert cache.find(spelling, opts) == h.key, spelling
    assert [r["sources"] for r in cache.listing()] == [[str(workdir / "videos" / "a.mp4")]]
    # a dataset naming the file by URI reads the entry built from a relative path: no NotCachedError
    (workdir / "d.jsonl").write_text(json.dumps({"prompt": "<video>", "videos": ["file://" + h.source]}) + "\n")
    row = LazyVideoDataset(str(workdir / "d.jsonl"), cache, opts)[0]
    assert row.num_video_tokens == h.num_video_tokens > 0
    cache.close()


def test_cli_inspect_finds_an_entry_python_built_from_a_relative_path(workdir):
    """CLI only for the look-up, on a fresh node built by the Python API from a relative spelling."""
    node = workdir / "node"
    cache = VideoCache(node)
    key = vidcache.get("./videos/a.mp4", VideoOptions(), cache).key
    cache.close()
    for spelling in _spellings(workdir):
        r = run_cli(["inspect", spelling, "--json"], node, cwd=workdir, pythonpath=[])
        assert r.returncode == 0, (spelling, r.stderr)
        assert json.loads(r.stdout)["key"] == key
    r = run_cli(["ls"], node, cwd=os.path.dirname(workdir), pythonpath=[])   # elsewhere: the source is absolute
    assert str(workdir / "videos" / "a.mp4") in r.stdout, r.stdout
