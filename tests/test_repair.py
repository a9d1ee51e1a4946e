"""``vidcache.repair``: quarantine, replicate a sound copy, else rebuild through the callback it is handed."""
from __future__ import annotations

import json

import torch

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K

from support.damage import flip_stored


def test_a_bad_local_blob_is_replaced_from_the_shared_tiers_sound_copy_without_rebuilding(node_a, tmp_path, videos):
    tier, a = node_a.tier, node_a.cache
    (key,) = node_a.build("mjpeg_24")
    want = a.frames(key)
    a.sync()
    flip_stored(a.local, K.cas(a.manifest(key).frames.blob), at=500, bit=0x10)
    rebuilt = []
    a._repair.rebuild = lambda k, o: rebuilt.append(k) or False       # the RepairFunc must not be needed
    problems = a.verify(key, repair=True)
    assert problems and any(p.startswith("local:") for p in problems)
    assert rebuilt == [] and a.verify(key) == []
    assert torch.equal(VideoCache(tmp_path / "a").frames(key), want)
    assert list(a.local.keys(K.QUARANTINE))                              # the bad copy kept for inspection


def test_no_sound_copy_anywhere_rebuilds_through_the_callback(tmp_path, videos):
    c = VideoCache(tmp_path / "a")
    key = c.ensure(videos["mjpeg_24"], VideoOptions()).key
    want = c.frames(key)
    flip_stored(c.local, K.cas(c.manifest(key).frames.blob), at=500, bit=0x10)
    real, asked = c._repair.rebuild, []
    c._repair.rebuild = lambda k, o: asked.append((k, o)) or real(k, o)
    assert c.verify(key, repair=True)
    assert [k for k, _ in asked] == [key] and asked[0][1] == c.manifest(key).video_options()
    assert c.verify(key) == [] and torch.equal(VideoCache(tmp_path / "a").frames(key), want)


def test_a_quarantined_manifest_still_names_the_options_to_rebuild_with(tmp_path, videos):
    c = VideoCache(tmp_path / "a")
    opts = VideoOptions(fps=1.0)
    key = c.ensure(videos["mjpeg_24"], opts).key
    d = json.loads(c.local.get(K.ac(key)))
    d["tokens"]["video_pad_tokens"] += 1                                # still JSON; the seal breaks
    c.local.set_many({K.ac(key): json.dumps(d).encode()})
    asked = []
    c._repair.rebuild = lambda k, o: asked.append(o) or False
    assert c.verify(key, repair=True)
    assert asked and asked[0].fps == 1.0
