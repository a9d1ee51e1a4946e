"""vidcache.catalog: what a cache holds, per tier (``ls``, ``stats``, ``inspect``'s helpful miss, repair's sources),
read against what was put in, on a node with a shared directory tier and on one without."""
from __future__ import annotations

import dataclasses
import shutil

from vidcache import VideoCache, VideoOptions, catalog, get
from vidcache.keys import source_digest_of

OPTS = VideoOptions(family="qwen2_5_vl", fps=2.0, min_pixels=3136, max_pixels=50176)


def test_listing_names_each_entry_its_sources_shape_and_tiers(node_a, tmp_path, videos):
    a = node_a.cache
    src = str(tmp_path / "copy.mp4")
    shutil.copy(videos["h264_30"], src)
    h1 = get(videos["h264_30"], OPTS, a)
    get(src, OPTS, a)                                  # the same bytes under a second name: one entry
    h2 = get(videos["mjpeg_24"], dataclasses.replace(OPTS, fps=1.0), a)
    rows = {r["key"]: r for r in catalog.listing(a)}
    assert set(rows) == {h1.key, h2.key}
    assert rows[h1.key]["sources"] == sorted([videos["h264_30"], src])
    t, _, hh, ww = h1.manifest.frames.shape
    assert (rows[h1.key]["frames"], rows[h1.key]["height"], rows[h1.key]["width"]) == (t, hh, ww)
    assert rows[h1.key]["tokens"] == h1.manifest.tokens.video_pad_tokens
    assert rows[h1.key]["tiers"] == ["local", "shared"]
    b = VideoCache(tmp_path / "b", shared=str(tmp_path / "tier"))     # a fresh node: the tier's entries only
    assert {r["key"]: r["tiers"] for r in catalog.listing(b)} == {h1.key: ["shared"], h2.key: ["shared"]}


def test_options_under_a_digest_and_sources_by_digest(tmp_path, videos):
    c = VideoCache(tmp_path / "c")
    h1 = get(videos["h264_30"], OPTS, c)
    h2 = get(videos["h264_30"], dataclasses.replace(OPTS, fps=1.0), c)
    d = source_digest_of(h1.key)
    assert source_digest_of(h2.key) == d and h1.key != h2.key
    under = catalog.options_under(c, d)
    assert sorted(o["fps"] for o in under) == [1.0, 2.0]
    assert catalog.sources_by_digest(c.store) == {str(d): [videos["h264_30"]]}


def test_stats_count_each_tier(tmp_path, videos):
    c = VideoCache(tmp_path / "n", shared=str(tmp_path / "tier"))
    get(videos["h264_30"], OPTS, c)
    get(videos["mjpeg_24"], OPTS, c)
    s = catalog.stats(c)
    assert s["entries"] == 2 and s["local"]["entries"] == 2 and s["shared"]["entries"] == 2
    assert s["sources"] == 2 and s["identity"] == c.identity
    alone = catalog.stats(VideoCache(tmp_path / "alone"))
    assert alone["entries"] == 0 and alone["shared"] is None


def test_tiered_entries_merge_the_tiers_listings_as_they_are_read(tmp_path):
    """Issue 50: ``ls`` held both tiers' names in sets (and a prefix table) before its first row.  The entries
    are the two sorted listings merged: the first costs a page of the local walk (traced allocations, 30,000
    local names; the sets alone took megabytes), and the walk is every entry once, in key order, with the tiers
    that hold it; stray names are skipped."""
    from types import SimpleNamespace

    from support.traced import first_and_peak

    from vidcache import keys as K
    from vidcache.store import LMDBStore, MemoryStore
    key = "{:032x}.{}.{:032x}".format
    n = 30_000
    local, shared = LMDBStore(tmp_path / "l"), MemoryStore()
    local.set_many({K.ac(key(i, 10, i)): b"m" for i in range(0, n, 2)} | {"ac/stray": b"x", "cas/0": b"b"})
    shared.set_many({K.ac(key(i, 10, i)): b"m" for i in range(0, n, 3)} | {"src/0": b"s"})
    cache = SimpleNamespace(local=local, shared=shared)
    first, it, peak = first_and_peak(lambda: catalog.tiered_entries(cache))
    assert first == (key(0, 10, 0), ["local", "shared"])
    assert peak < 1 << 20, f"the first entry of {n} cost {peak} traced bytes"
    want = [(key(i, 10, i), [t for t, every in (("local", 2), ("shared", 3)) if i % every == 0])
            for i in range(n) if i % 2 == 0 or i % 3 == 0]
    assert [first, *it] == want
    assert list(catalog.tiered_entries(SimpleNamespace(local=local, shared=None))) == [
        (key(i, 10, i), ["local"]) for i in range(0, n, 2)]
    local.close()


def test_tiered_entries_fail_when_the_shared_tier_cannot_be_listed(tmp_path):
    """The merge is lazy, the shared listing is not: a tier that is down fails the call (where ``ls`` turns to
    this node's own copies), not a row of the listing."""
    from types import SimpleNamespace

    import pytest

    from vidcache.store import LMDBStore, MemoryStore

    class Down(MemoryStore):
        def keys(self, prefix=""):
            raise ConnectionError("tier down")
    local = LMDBStore(tmp_path / "l")
    with pytest.raises(ConnectionError, match="tier down"):
        catalog.tiered_entries(SimpleNamespace(local=local, shared=Down()))
    local.close()
