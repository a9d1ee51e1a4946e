"""Issue 50, the scale curves' fixes: ``ls`` prints as it reads (its first row comes before it has read every
manifest) and a shared tier's listing of one namespace lists that namespace only.  Counted, never timed."""
import io
import json
import os
import sys

import pytest

from vidcache import VideoCache
from vidcache import keys as K
from vidcache.cli import main

from support.cli import run_cli

CLIPS = ("ffv1_10_small", "mjpeg_24", "h264_30", "mpeg4_25_odd")


class _Counting(io.StringIO):
    """stdout that notes, at each write, how many manifests had been read by then."""

    def __init__(self, reads: list) -> None:
        super().__init__()
        self.reads, self.at = reads, []

    def write(self, s):
        self.at.append((s, len(self.reads)))
        return super().write(s)


@pytest.mark.parametrize("as_json", [False, True])
def test_ls_prints_its_first_entry_before_it_has_read_every_manifest(node_a, monkeypatch, as_json):
    ks = node_a.build(*CLIPS)
    node_a.cache.close()
    reads = []
    real = VideoCache.manifest
    monkeypatch.setattr(VideoCache, "manifest",
                        lambda self, key, *a, **k: reads.append(key) or real(self, key, *a, **k))
    out = _Counting(reads)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["ls", "--cache", str(node_a.tmp_path / "a"), "--shared", node_a.shared]
                + (["--json"] if as_json else [])) == 0
    monkeypatch.undo()
    text = out.getvalue()
    first_key = sorted(ks)[0]
    # the first write that names an entry's key (its prefix in the table, the whole key in JSON)
    at = next(n for s, n in out.at if first_key[:16] in s)
    assert at < len(ks), (at, len(ks))
    if as_json:
        assert [r["key"] for r in json.loads(text)] == sorted(ks)
    else:
        assert text.rstrip().splitlines()[-1].startswith(f"{len(ks)} entries")


def test_a_listing_of_one_namespace_of_a_directory_tier_lists_that_namespace_only(node_a, monkeypatch):
    ks = node_a.build("ffv1_10_small", "mjpeg_24")
    shared = node_a.cache.shared
    listed = []
    real = shared.fs.ls            # a directory tier is walked a fan-out directory at a time (no find)
    monkeypatch.setattr(shared.fs, "ls", lambda path, *a, **k: listed.append(path) or real(path, *a, **k))
    monkeypatch.setattr(shared.fs, "find", lambda *a, **k: pytest.fail("keys listed the whole tier with find"))
    got = list(shared.keys(K.AC))
    assert sorted(got) == sorted(K.ac(k) for k in ks)
    assert listed and all(os.path.relpath(p, shared.root).split(os.sep)[0] == "ac" for p in listed), listed
    node_a.cache.close()


def test_cli_ls_on_a_fresh_node_lists_the_tiers_entries_whole(node_a, tmp_path):
    """Driven through the CLI only: a fresh node lists the shared tier's entries, the table and its JSON."""
    ks = node_a.build(*CLIPS)
    node_a.cache.close()
    fresh = tmp_path / "fresh"
    r = run_cli(["ls", "--json"], fresh, node_a.shared)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["key"] for x in rows] == sorted(ks) and all(x["tiers"] == ["shared"] for x in rows)
    r = run_cli(["ls"], fresh, node_a.shared)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].startswith("KEY") and len(lines) == len(ks) + 2 and lines[-1].startswith(f"{len(ks)} entries")


def test_cli_verify_sample_checks_that_many_entries_drawn_from_the_tier(node_a, tmp_path):
    """``verify --sample N``: N entries of the tier's listing checked, not all of them; a bad count or a sample
    with named keys is a clear error."""
    ks = node_a.build(*CLIPS)
    node_a.cache.close()
    node = tmp_path / "a"
    r = run_cli(["verify", "--sample", "2"], node)
    assert r.returncode == 0, r.stderr
    checked = [ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("OK ")]
    assert f"checking 2 of {len(ks)} entries" in r.stdout and len(checked) == 2 and set(checked) <= set(ks)
    assert "verify: 2 ok, 0 bad" in r.stdout
    r = run_cli(["verify", "--sample", "9"], node)            # more than there are: every entry, once
    assert sorted(ln.split()[1] for ln in r.stdout.splitlines() if ln.startswith("OK ")) == sorted(ks)
    r = run_cli(["verify", "--sample", "0"], node)
    assert r.returncode == 2 and "at least 1" in r.stderr, r.stderr
    r = run_cli(["verify", "--sample", "2", ks[0]], node)
    assert r.returncode != 0 and "vidcache: error: [config]" in r.stderr and "--sample" in r.stderr, r.stderr


def test_verify_shared_lists_the_tiers_frozen_files_once_not_once_per_entry(node_a, monkeypatch, capsys):
    """Every entry has a compact object among the shared tier's frozen files: a listing of them per entry made
    ``verify --shared`` O(n^2) in requests and names.  Counted: one listing of the namespace for the walk."""
    from vidcache.store.fsspec import FsspecStore
    ks = node_a.build(*CLIPS)
    node_a.cache.close()
    frozen_listings = []
    real = FsspecStore.keys
    monkeypatch.setattr(FsspecStore, "keys", lambda self, prefix="": (
        frozen_listings.append(prefix) if prefix.startswith(K.FROZEN) else None) or real(self, prefix))
    assert main(["verify", "--cache", str(node_a.tmp_path / "a"), "--shared", node_a.shared]) == 0
    out = capsys.readouterr().out
    assert f"verify: {len(ks)} ok, 0 bad" in out and all(f"OK  {k}" in out for k in ks)
    assert len(frozen_listings) == 1, frozen_listings


def test_stats_on_a_node_alone_walks_each_namespace_once(tmp_path, videos, monkeypatch):
    """Each walk of an LMDB namespace is O(n) keys, disk-bound once the file outgrows the page cache (issue 50:
    ``stats`` took 56 s at 10^6 entries, against 1.2 s at 10^5); the node's own counts are the cache's counts
    when the node has no shared tier, so they are not walked again."""
    from vidcache import VideoOptions
    from vidcache.store.lmdb import LMDBStore
    c = VideoCache(tmp_path / "node")
    ks = [c.ensure(videos[n], VideoOptions()).key for n in CLIPS[:2]]
    walked = []
    real = LMDBStore.keys
    monkeypatch.setattr(LMDBStore, "keys", lambda self, prefix="": walked.append(prefix) or real(self, prefix))
    st = c.stats()
    c.close()
    assert st["entries"] == st["local"]["entries"] == len(ks) and st["local"]["blobs"] == st["blobs"] == len(ks)
    assert sorted(walked) == sorted(set(walked)) and K.AC in walked and K.CAS in walked, walked
