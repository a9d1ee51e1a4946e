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
