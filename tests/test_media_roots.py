"""D54: images and videos follow one source rule.  A dataset's relative local paths resolve against its directory
and must not leave it by name (``..`` resolved; a link in the directory is its owner's choice) unless
``--media-root`` names where else media may be read; with ``--media-root``, every local source (relative, absolute,
``file://``) must really lie under one of the roots (links followed).
A refused row is its own failure (``outside_media_root``), naming the path and the flag; the other rows land."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from vidcache import VideoCache, VideoOptions
from vidcache.dataset import LazyVideoDataset, media_items
from vidcache.errors import ConfigError, OutsideMediaRootError
from vidcache.testing.videos import make_video

from support.cli import EVERYTHING, run_cli

OPTS = VideoOptions(min_pixels=3136)
OUTSIDE = "../../../../etc/passwd"


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """``ds/`` (the dataset's directory: a.mkv, i.png, a symlink to a clip outside it) and ``elsewhere/b.mkv``."""
    from PIL import Image
    top = tmp_path_factory.mktemp("roots")
    ds, elsewhere = top / "ds", top / "elsewhere"
    ds.mkdir()
    elsewhere.mkdir()
    make_video(str(ds / "a.mkv"), codec="ffv1", width=64, height=48, fps=10, n_frames=6, seed=1)
    make_video(str(elsewhere / "b.mkv"), codec="ffv1", width=48, height=64, fps=10, n_frames=6, seed=2)
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(ds / "i.png")
    os.symlink(elsewhere / "b.mkv", ds / "link.mkv")          # inside by name, outside once followed
    rows = [
        {"prompt": "<video> good", "videos": ["a.mkv"], "images": []},                          # 0
        {"prompt": "<image> good", "videos": [], "images": ["i.png"]},                          # 1
        {"prompt": "<image> passwd", "videos": [], "images": [OUTSIDE]},                        # 2
        {"prompt": "<video> passwd", "videos": [OUTSIDE], "images": []},                        # 3
        {"prompt": "<video> symlink", "videos": ["link.mkv"], "images": []},                    # 4
        {"prompt": "<image> hostname", "videos": [], "images": ["file:///etc/hostname"]},        # 5
        {"prompt": "<video> hostname", "videos": ["file:///etc/hostname"], "images": []},        # 6
        {"prompt": [{"role": "user", "content": [{"type": "image", "image": "sub/../../" + OUTSIDE},
                                                 {"type": "text", "text": "item"}]}]},              # 7
    ]
    (ds / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return top


def _failures(out: str) -> dict[int, str]:
    """row -> its failure line, from the CLI's summary of failures."""
    got = {}
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("row "):
            got[int(line.split()[1])] = line
    return got


def test_cli_refuses_rows_outside_the_dataset_directory_and_the_rest_land(tmp_path, tree):
    """CLI only, fresh node: ``prewarm`` then ``pull`` on a dataset mixing good rows, ``../../../../etc/passwd``
    image and video rows, a symlink escaping the dataset directory, and ``file:///etc/hostname``; then the same
    with ``--media-root``.  Before the fix every one of these was opened (the image rows reported as ``decode``)."""
    ds = tree / "ds" / "rows.jsonl"
    node, shared = tmp_path / "node", tmp_path / "shared"
    r = run_cli(["prewarm", ds, "--no-progress", "--workers", "1", "--failures", tmp_path / "f.jsonl"], node, shared,
                inherit=EVERYTHING, timeout=600)
    assert "Traceback" not in r.stderr, r.stderr
    fails = _failures(r.stdout)          # the first 5 failures are printed; all are in the report
    # rows 0, 1 and 4 landed: a link inside the dataset's directory is its owner's choice (Hugging Face's hub cache
    # links snapshots/ into blobs/), so by default the rule reads the row's text, not where links lead
    assert "prewarm: 2 new, 0 hit, 1 images checked" in r.stdout, r.stdout
    for row in (2, 3):
        assert "[outside_media_root]" in fails[row] and "--media-root DIR" in fails[row], fails
    assert (f"'{OUTSIDE}' resolves to {os.path.normpath(tree / 'ds' / OUTSIDE)}, outside the dataset's directory "
            f"{tree / 'ds'}") in fails[3], fails
    assert 4 not in fails, fails
    # An absolute file:// URL is the author's explicit choice without --media-root: opened (and not media).
    recs = {json.loads(ln)["row"]: json.loads(ln) for ln in (tmp_path / "f.jsonl").read_text().splitlines()}
    assert recs[5]["kind"] != "outside_media_root" and recs[6]["kind"] != "outside_media_root", recs
    assert recs[7]["kind"] == "outside_media_root" and "an image item" in recs[7]["error"], recs
    assert sorted(recs) == [2, 3, 5, 6, 7], recs

    # With --media-root, every local source must really be under it (links followed): file:///etc/hostname and the
    # symlinked clip are refused too.
    r = run_cli(["prewarm", ds, "--no-progress", "--media-root", tree / "ds", "--failures", tmp_path / "g.jsonl"],
                node, shared, inherit=EVERYTHING, timeout=600)
    assert "prewarm: 0 new, 1 hit, 1 images checked" in r.stdout, r.stdout + r.stderr
    assert "'link.mkv' resolves to " + str(tree / "elsewhere" / "b.mkv") in (tmp_path / "g.jsonl").read_text()
    fails = _failures(r.stdout) | {json.loads(ln)["row"]: json.loads(ln)["kind"]
                                   for ln in (tmp_path / "g.jsonl").read_text().splitlines()}
    assert all(fails[row] == "outside_media_root" for row in (2, 3, 4, 5, 6, 7)), fails
    assert "'file:///etc/hostname' resolves to /etc/hostname, outside every --media-root (" + str(tree / "ds") + \
        ")" in (tmp_path / "g.jsonl").read_text()

    # A second root lets the symlinked clip in, and only it.
    r = run_cli(["prewarm", ds, "--no-progress", "--media-root", tree / "ds", "--media-root", tree / "elsewhere",
                 "--failures", tmp_path / "h.jsonl"], node, shared, inherit=EVERYTHING, timeout=600)
    assert "prewarm: 0 new, 2 hit, 1 images checked" in r.stdout, r.stdout + r.stderr
    assert 4 not in _failures(r.stdout), r.stdout

    # pull on a fresh node reads the rows by the same rule.
    r = run_cli(["pull", ds], tmp_path / "node2", shared, inherit=EVERYTHING, timeout=600)
    assert "Traceback" not in r.stderr and "pull: 2 pulled" in r.stdout, r.stdout + r.stderr
    fails = _failures(r.stdout)
    assert all("[outside_media_root]" in fails[row] for row in (2, 3)) and 4 not in fails, r.stdout
    r = run_cli(["pull", ds, "--media-root", tree / "ds", "--media-root", tree / "elsewhere"], tmp_path / "node2",
                shared, inherit=EVERYTHING, timeout=600)
    assert "2 already here" in r.stdout and 4 not in _failures(r.stdout), r.stdout + r.stderr

    # A root that is not a directory is one error before any work.
    r = run_cli(["prewarm", ds, "--media-root", tree / "nope"], tmp_path / "node3", inherit=EVERYTHING)
    assert r.returncode == 1 and "vidcache: error: [config]" in r.stderr and "--media-root" in r.stderr, r.stderr
    assert not (tmp_path / "node3").exists()


def test_the_rule_in_python(tmp_path, tree):
    """media_items and LazyVideoDataset: relative paths stay under the base; absolute paths pass without roots;
    with roots every local source is checked (file:// URLs percent-decoded first); remote sources untouched."""
    base = str(tree / "ds")
    ok = media_items({"prompt": "<video>", "videos": ["./sub/../a.mkv"]}, OPTS, base_dir=base).videos
    assert ok[0][0] == os.path.join(base, "a.mkv")
    for src in (OUTSIDE, "sub/../../elsewhere/b.mkv"):
        with pytest.raises(OutsideMediaRootError, match="--media-root DIR"):
            media_items({"prompt": "<video>", "videos": [src]}, OPTS, base_dir=base)
    # a link in the directory is its owner's (the hub cache's snapshots/ -> blobs/): followed only under roots
    assert media_items({"prompt": "<video>", "videos": ["link.mkv"]}, OPTS, base_dir=base).videos[0][0] == \
        os.path.join(base, "link.mkv")
    with pytest.raises(OutsideMediaRootError, match="outside every --media-root"):
        media_items({"prompt": "<video>", "videos": ["link.mkv"]}, OPTS, base_dir=base, media_roots=(base,))
    assert media_items({"prompt": "<video>", "videos": ["/etc/hostname"]}, OPTS, base_dir=base).videos[0][0] == \
        "/etc/hostname"
    for src in ("/etc/hostname", "file:///etc/hostname", "file:///%65tc/hostname", "FILE:///etc/hostname"):
        with pytest.raises(OutsideMediaRootError, match="outside every --media-root"):
            media_items({"prompt": "<video>", "videos": [src]}, OPTS, base_dir=base, media_roots=(base,))
    inside = "file://" + os.path.join(base, "a.mkv")
    assert media_items({"prompt": "<video>", "videos": [inside]}, OPTS, base_dir=base,
                       media_roots=(base,)).videos[0][0] == inside
    # a NUL is not this rule's to judge: fetch refuses it (InvalidSourceError), as before
    assert "\0" in media_items({"prompt": "<video>", "videos": ["a\0b.mkv"]}, OPTS, base_dir=base).videos[0][0]
    # a root's own prefix is not inside it: /x/ds-evil is not under /x/ds
    (tree / "ds-evil").mkdir(exist_ok=True)
    with pytest.raises(OutsideMediaRootError):
        media_items({"prompt": "<video>", "videos": ["../ds-evil/a.mkv"]}, OPTS, base_dir=base)
    remote = media_items({"prompt": "<video>", "videos": ["https://example.com/../a.mkv"]}, OPTS, base_dir=base,
                         media_roots=(base,))
    assert remote.videos[0][0] == "https://example.com/../a.mkv"       # the fetch allowlist's to judge
    lazy = LazyVideoDataset(str(tree / "ds" / "rows.jsonl"), VideoCache(tmp_path / "c"), OPTS, image_key="images")
    assert lazy[0].handles and lazy[1].images == [os.path.join(base, "i.png")]
    with pytest.raises(OutsideMediaRootError, match=r"^row 3: a 'videos' entry '\.\./\.\./\.\./\.\./etc/passwd'"):
        lazy[3]
    lazy = LazyVideoDataset(str(tree / "ds" / "rows.jsonl"), VideoCache(tmp_path / "c"), OPTS, image_key="images",
                            media_roots=[base, str(tree / "elsewhere")])
    assert lazy[4].handles[0].source == os.path.join(base, "link.mkv")
    with pytest.raises(ConfigError, match="not a directory"):
        LazyVideoDataset(str(tree / "ds" / "rows.jsonl"), VideoCache(tmp_path / "c"), OPTS, media_roots=["/nope"])


def test_embed_reads_the_rows_by_the_same_rule(tmp_path, tree):
    """``vidcache embed`` finds a dataset's entries as ``pull`` does, under the same source rule and ``--media-root``
    (it had no such flag: a dataset prewarmed with ``--media-root`` could not be embedded)."""
    from vidcache.embeddings.jobs import dataset_entries
    cache = VideoCache(tmp_path / "c")
    kw = dict(input_key="prompt", video_key="videos")
    _, _, fails = dataset_entries(str(tree / "ds" / "rows.jsonl"), cache, OPTS, **kw)
    refused = {f["row"] for f in fails if f["kind"] == "outside_media_root"}
    assert 3 in refused and 4 not in refused, fails          # ../../../../etc/passwd; the link inside is the owner's
    _, _, fails = dataset_entries(str(tree / "ds" / "rows.jsonl"), cache, OPTS, media_roots=[str(tree / "ds")], **kw)
    assert 4 in {f["row"] for f in fails if f["kind"] == "outside_media_root"}, fails     # links followed under roots
    r = run_cli(["embed", tree / "ds" / "rows.jsonl", "--help"], tmp_path / "node")
    assert r.returncode == 0 and "--media-root" in r.stdout
