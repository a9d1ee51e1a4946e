"""Never serve a wrong byte: corrupt blobs and manifests are detected on read and by verify, never
served, quarantined (moved aside), and repaired by `verify --repair` or a re-run of prewarm."""
import json

import pytest
import torch

import vidcache

from vidcache import VideoCache, VideoOptions
from vidcache.cli import main as cli
from vidcache.errors import CorruptManifestError, DigestMismatchError, NotCachedError, StoreError
from vidcache.manifest import Manifest
from vidcache.prewarming import prewarm

from support.damage import flip_stored


@pytest.fixture
def built(tmp_path, videos):
    """A cache with two entries, their reference frames, and a dataset naming them."""
    path = tmp_path / "cache"
    c = VideoCache(path)
    names = ("h264_30", "mjpeg_24")
    keys = {n: c.ensure(videos[n], VideoOptions()).key for n in names}
    frames = {n: c.frames(keys[n]) for n in names}
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n" for n in names))
    c.close()
    return path, keys, frames, str(ds)


def _flip_blob(cache, key, at=1000):
    flip_stored(cache.local, "cas/" + cache.manifest(key).frames.blob, at, bit=0x04)


def test_flipped_blob_bytes_are_never_served(built, videos):
    path, keys, frames, ds = built
    c = VideoCache(path)                          # a fresh process view: nothing verified yet
    key = keys["h264_30"]
    _flip_blob(c, key)
    with pytest.raises(DigestMismatchError, match=key):
        c.frames(key)
    with pytest.raises(NotCachedError):           # gone from the read path: a miss now, never the bad bytes
        c.frames(key)
    assert any(k.startswith("quarantine/cas~") for k in c.local.keys("quarantine/"))   # moved aside
    h = vidcache.lazy(videos["h264_30"], VideoOptions(), c)
    assert torch.equal(h.frames(), frames["h264_30"])           # rebuilt from the reachable source


def test_verify_reports_every_bad_key_and_repair_rebuilds(built, capsys):
    path, keys, frames, ds = built
    c = VideoCache(path)
    for k in keys.values():
        _flip_blob(c, k)
    assert cli(["verify", "--cache", str(path)]) == 1
    out = capsys.readouterr().out
    assert all(f"BAD {k}" in out for k in keys.values()) and "verify: 0 ok, 2 bad" in out
    assert cli(["verify", "--cache", str(path), "--repair"]) == 1            # reports, then repairs
    assert "repaired" in capsys.readouterr().out
    assert cli(["verify", "--cache", str(path)]) == 0
    c = VideoCache(path)
    for n, k in keys.items():
        assert torch.equal(c.frames(k), frames[n])


def test_prewarm_treats_a_corrupt_entry_as_a_miss(built):
    path, keys, frames, ds = built
    c = VideoCache(path)
    _flip_blob(c, keys["mjpeg_24"])
    s = prewarm(ds, VideoCache(path), VideoOptions(), progress=False)
    assert (s.new, s.hit, s.failed) == (1, 1, 0)
    assert torch.equal(VideoCache(path).frames(keys["mjpeg_24"]), frames["mjpeg_24"])


def _mutations(m: dict, other: dict) -> dict:
    t, c, h, w = m["frames"]["shape"]
    grid = m["tokens"]["video_grid_thw"]
    return {
        "H/W swapped": lambda d: d["frames"].update(shape=[t, c, w, h]),
        "T/C swapped": lambda d: d["frames"].update(shape=[c, t, h, w]),
        "another entry's blob": lambda d: d["frames"].update(blob=other["frames"]["blob"]),
        "another entry's blob and shape": lambda d: d.update(frames=dict(other["frames"])),
        "wrong pad tokens": lambda d: d["tokens"].update(video_pad_tokens=d["tokens"]["video_pad_tokens"] + 1),
        "wrong grid": lambda d: d["tokens"].update(video_grid_thw=[grid[0] + 1, grid[1], grid[2]]),
        "dtype": lambda d: d["frames"].update(dtype="float32"),
        "options digest": lambda d: d.update(options_digest="0" * 32),
        "frame indices": lambda d: d["sampling"].update(frame_indices=d["sampling"]["frame_indices"][:-1]),
        "key": lambda d: d.update(key=other["key"]),
        "schema": lambda d: d.update(schema=1),
    }


@pytest.mark.parametrize("mutation", list(_mutations(
    {"frames": {"shape": [4, 3, 28, 56], "blob": ""}, "tokens": {"video_grid_thw": [2, 2, 4]}}, {"frames": {}})))
def test_manifest_mutations_are_corruption(built, videos, mutation, capsys):
    path, keys, frames, ds = built
    c = VideoCache(path)
    key, other = keys["h264_30"], keys["mjpeg_24"]
    d = json.loads(c.local.get("ac/" + key))
    od = json.loads(c.local.get("ac/" + other))
    _mutations(d, od)[mutation](d)
    bad = json.dumps(d).encode()
    with pytest.raises(CorruptManifestError, match=key):
        Manifest.from_json(bad, key)
    c.local.set_many({"ac/" + key: bad})
    assert cli(["verify", "--cache", str(path), key]) == 1 and f"BAD {key}" in capsys.readouterr().out
    c = VideoCache(path)
    with pytest.raises(NotCachedError):           # never served: the manifest is quarantined on read
        c.frames(key)
    assert c.local.get("quarantine/ac~" + key) == bad
    s = prewarm(ds, VideoCache(path), VideoOptions(), progress=False)
    assert (s.new, s.hit) == (1, 1)               # rebuilt, not a hit
    assert torch.equal(VideoCache(path).frames(key), frames["h264_30"])


def test_damaged_lmdb_file_gives_a_clear_error_and_a_rebuild_path(built, capsys):
    path, keys, frames, ds = built
    data = path / "lmdb" / "data.mdb"
    raw = bytearray(data.read_bytes())
    raw[0:4096 * 2] = b"\xff" * (4096 * 2)        # both meta pages: the environment cannot open
    data.write_bytes(bytes(raw))
    with pytest.raises(StoreError, match="damaged.*prewarm"):
        VideoCache(path).frames(keys["h264_30"])
    assert cli(["stats", "--cache", str(path)]) == 1
    assert "damaged" in capsys.readouterr().err
    # the rebuild path the message names: move the file aside, prewarm again
    (path / "lmdb").rename(path / "lmdb.damaged")
    s = prewarm(ds, VideoCache(path), VideoOptions(), progress=False)
    assert s.new == 2 and torch.equal(VideoCache(path).frames(keys["h264_30"]), frames["h264_30"])


def test_read_only_commands_create_nothing(tmp_path, capsys):
    empty = tmp_path / "not_a_cache"
    for cmd in (["stats"], ["verify"], ["inspect", "0" * 32 + ".1." + "0" * 32]):
        assert cli(cmd + ["--cache", str(empty)]) == 1
        assert "no vidcache cache" in capsys.readouterr().err
    assert not empty.exists()
