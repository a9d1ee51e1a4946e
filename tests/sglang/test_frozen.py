"""vidcache.sglang.frozen: frozen files re-decode bit-exactly with every decoder, and are part of an entry's
integrity (issue 18, D15).

A flipped byte in a frozen file (UT Video or FFV1, this node's copy or the shared tier's) is never handed
to SGLang: the copy is checked against the digest recorded when it was verified, moved aside, and remade
from the frames.  ``verify --shared`` reports it and ``--repair`` restores it."""
import os
from urllib.parse import unquote, urlparse

import pytest
import torch

import vidcache
from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.sglang import frozen
from vidcache.sglang.frozen import (FORMATS, available_decoders, decode_all, local_frozen_path,
                                    published_frozen_key)
from vidcache.sglang.transport import video_uri

from support.cli import EVERYTHING, run_cli
from support.damage import flip_file


@pytest.fixture
def node(tmp_path, videos):
    c = VideoCache(tmp_path / "node", shared=str(tmp_path / "shared"))
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(family="qwen2_5_vl"), c)
    return c, h, tmp_path


def _new_process_view():
    """What a new process knows: no copy checked yet."""
    frozen._SOUND_FILES.clear()
    frozen._SOUND_SHARED.clear()


def _shared_file(tmp_path, key, suffix) -> str:
    [p] = [p for p in (tmp_path / "shared" / "frozen").rglob(key + suffix)]
    return str(p)


def _exact(path, frames) -> bool:
    got, fps = decode_all(path, "decord")
    return torch.equal(got, frames) and fps == 2.0


@pytest.mark.parametrize("fmt,suffix", [(None, ".nut"), ("ffv1", ".mkv"), ("magicyuv", ".nut")])
@pytest.mark.parametrize("name", ["h264_ntsc", "ffv1_10_small", "mpeg4_25_odd"])
def test_frozen_file_redecodes_bit_exactly(cache, videos, name, fmt, suffix):
    h = vidcache.get(videos[name], VideoOptions(family="qwen2_5_vl"), cache)
    path = local_frozen_path(cache, h.key, fmt)          # the serving format (UT Video in NUT) by default
    assert path.endswith(suffix) and os.path.dirname(path) == os.path.join(cache.path, "frozen")
    uri = video_uri(h, "stock", transport="file", frozen_format=fmt)
    from urllib.parse import unquote, urlparse
    assert uri.startswith("file:///") and unquote(urlparse(uri).path) == path
    frames = h.frames()
    decoders = available_decoders()
    assert "decord" in decoders and "pyav" in decoders
    for dec in decoders:
        got, fps = decode_all(path, dec)
        assert torch.equal(got, frames), dec
        assert fps == 2.0


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_flipped_local_frozen_file_is_never_handed_out(node, fmt):
    c, h, _ = node
    path = local_frozen_path(c, h.key, fmt)
    assert c.local.get(K.frozen_digest(h.key, FORMATS[fmt].suffix)) is not None      # recorded when made
    flip_file(path, 0.6, bit=0x10)
    _new_process_view()
    again = local_frozen_path(c, h.key, fmt)
    assert again == path and _exact(again, h.frames())                 # remade from the frames
    assert os.path.exists(os.path.join(c.path, "quarantine", h.key + FORMATS[fmt].suffix))   # the bad one, aside
    assert unquote(urlparse(video_uri(h, transport="file", frozen_format=fmt)).path) == path


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_flipped_shared_frozen_file_is_never_handed_out(node, fmt):
    c, h, tmp_path = node
    suffix = FORMATS[fmt].suffix
    uri = video_uri(h, transport="shared", frozen_format=fmt)
    shared_path = _shared_file(tmp_path, h.key, suffix)
    assert unquote(urlparse(uri).path) == shared_path
    flip_file(shared_path, 0.6, bit=0x10)
    _new_process_view()
    again = video_uri(h, transport="shared", frozen_format=fmt)
    assert unquote(urlparse(again).path) == shared_path and _exact(shared_path, h.frames())   # republished
    assert c.shared.get(K.quarantined(K.frozen(h.key, suffix))) is not None


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_verify_shared_reports_flipped_frozen_files_and_repair_restores_them(node, fmt):
    """CLI only, on a fresh node B (no VIDCACHE_DIR yet): node A's shared frozen file was flipped."""
    c, h, tmp_path = node
    suffix = FORMATS[fmt].suffix
    published_frozen_key(c, h.key, fmt)
    local = local_frozen_path(c, h.key, fmt)
    flip_file(_shared_file(tmp_path, h.key, suffix), 0.6, bit=0x10)
    flip_file(local, 0.4, bit=0x10)
    a = run_cli(["verify"], c.path, tmp_path / "shared", inherit=EVERYTHING)        # node A: both copies bad
    assert a.returncode == 1 and f"local: frozen file {suffix}" in a.stdout and f"shared: frozen file {suffix}" in a.stdout
    b_dir = tmp_path / "nodeB"
    b = run_cli(["verify", "--shared"], b_dir, tmp_path / "shared", inherit=EVERYTHING)
    assert b.returncode == 1 and f"BAD {h.key}" in b.stdout and "frozen file" in b.stdout, b.stdout + b.stderr
    assert not b_dir.exists()                                            # a read-only look creates nothing
    r = run_cli(["verify", "--repair"], c.path, tmp_path / "shared", inherit=EVERYTHING)
    assert r.returncode == 1 and "-> repaired" in r.stdout, r.stdout + r.stderr
    ok = run_cli(["verify", "--shared"], b_dir, tmp_path / "shared", inherit=EVERYTHING)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert _exact(_shared_file(tmp_path, h.key, suffix), h.frames()) and _exact(local, h.frames())


def test_frozen_files_of_an_older_vidcache_are_checked_by_decoding(node):
    """A copy made before copies were recorded: served only after it decodes to the frames, then recorded."""
    c, h, tmp_path = node
    skey = published_frozen_key(c, h.key)
    suffix = skey[len(K.FROZEN) + len(h.key):]
    c.shared.delete(K.frozen_digest(h.key, suffix))                     # the older layout: no record
    _new_process_view()
    assert any("no recorded digest" in p for p in c.frozen.problems(h.key))
    published_frozen_key(c, h.key)
    assert c.shared.get(K.frozen_digest(h.key, suffix)) is not None and not c.frozen.problems(h.key)
    c.shared.delete(K.frozen_digest(h.key, suffix))
    flip_file(_shared_file(tmp_path, h.key, suffix), 0.6, bit=0x10)    # unrecorded and wrong: aside, remade
    _new_process_view()
    published_frozen_key(c, h.key)
    assert _exact(_shared_file(tmp_path, h.key, suffix), h.frames())


def test_evict_removes_frozen_files_and_their_records(node):
    c, h, _ = node
    published_frozen_key(c, h.key)
    assert c.evict(h.key, shared=True)
    assert not list(c.shared.keys(K.FROZEN + h.key)) and not list(c.shared.keys(K.FROZEN_DIGEST + h.key))
    assert not list(c.local.keys(K.FROZEN_DIGEST + h.key))


def test_a_copy_rotting_in_place_is_caught_once_its_check_expires(node, monkeypatch):
    """D37: a check held for the life of the process, so a byte flipped in place with the mtime kept was handed
    out for ever (a file by a long-lived `serve`, a shared object to a trainer).  A check now holds RECHECK_S."""
    c, h, tmp_path = node
    path = local_frozen_path(c, h.key)
    skey = published_frozen_key(c, h.key)
    shared_path = _shared_file(tmp_path, h.key, skey[len(K.FROZEN) + len(h.key):])
    # bit rot as a long-lived process meets it: same inode, size and mtime, one byte different
    flip_file(path, 0.6, bit=0x10, keep_mtime=True)
    flip_file(shared_path, 0.6, bit=0x10, keep_mtime=True)
    monkeypatch.setattr(frozen, "RECHECK_S", 0.0)             # the window has passed
    assert local_frozen_path(c, h.key) == path and _exact(path, h.frames())          # moved aside and remade
    assert published_frozen_key(c, h.key) == skey and _exact(_shared_file(tmp_path, h.key, skey[len(K.FROZEN) + len(h.key):]), h.frames())
    assert os.listdir(c.layout.quarantine_dir)                                        # the rotten file kept aside
    assert list(c.shared.keys(K.QUARANTINE))
