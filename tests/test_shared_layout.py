"""The shared tier's compact layout (issue 17): one lossless object per entry, expanded exactly on each node,
older raw tiers still read, converted only on request."""
import errno
import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.errors import NoSpaceError, StoreError

from support.cli import run_cli
from support.damage import flip_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tier_names(tier) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), tier) for d, _, fs in os.walk(tier) for f in fs)


def ns(tier, namespace) -> list[str]:
    return [n for n in tier_names(tier) if n.startswith(namespace)]


def test_a_new_entry_crosses_the_network_once_and_compact(node_a, tmp_path, videos):
    tier, a = node_a.tier, node_a.cache
    keys = node_a.build("h264_30", "mjpeg_24")
    assert ns(tier, "cas/") == [] and len(ns(tier, "frozen/")) == 2          # no raw frames in the tier
    compact = sum(os.path.getsize(tier / n) for n in ns(tier, "frozen/"))
    raw = sum(a.manifest(k).frames.nbytes for k in keys)
    assert compact < raw                                                    # smaller than the frames
    import av
    with av.open(str(tier / ns(tier, "frozen/")[0])) as box:                 # the serving format's codec
        assert box.streams.video[0].codec_context.name == "magicyuv"
    b = VideoCache(tmp_path / "b", shared=str(tier))                         # a fresh node: expanded exactly
    for k in keys:
        assert torch.equal(b.frames(k), a.frames(k))
    b.sync()                                                                # the local commits run behind reads
    for k in keys:
        assert b.local.get("cas/" + b.manifest(k).frames.blob) is not None  # ... once, into its local tier
    assert b.verify(keys[0]) == [] and a.verify(keys[0]) == []


def test_a_first_read_hands_out_its_own_expanded_frames_and_later_reads_are_unaffected(node_a, tmp_path, videos):
    """The first read of a compact entry returns the expanded buffer itself (no copy out): it must be the
    caller's alone, so writing into it changes neither the local copy nor the next read; zero-copy views of an
    expanded entry are read-only like views into the memory map; ``out=`` still fills the caller's tensor."""
    tier, a = node_a.tier, node_a.cache
    (k,) = node_a.build("h264_30")
    want = a.frames(k)
    first = VideoCache(tmp_path / "b", shared=str(tier)).frames(k)
    assert torch.equal(first, want)
    first.fill_(7)                                                       # the caller's buffer ...
    b = VideoCache(tmp_path / "b", shared=str(tier))
    assert torch.equal(b.frames(k), want)                                # ... not the backfilled local copy
    with VideoCache(tmp_path / "c", shared=str(tier)).read_frames(k) as view:
        assert not view.flags.writeable and torch.equal(torch.from_numpy(view.copy()), want)
    out = torch.empty_like(want)
    assert VideoCache(tmp_path / "d", shared=str(tier)).frames(k, out=out) is out and torch.equal(out, want)


@pytest.mark.parametrize("reader", ["frames(key)", "frames(key, manifest)", "plugin load_ref"])
def test_a_first_read_decodes_the_compact_object_while_it_downloads(node_a, tmp_path, videos, monkeypatch, reader):
    """The decoder starts on the first half of the object while the tier holds the second half back (up to
    20 s): it fails on a reader that waits for the whole object before decoding.  Every read path: the
    plugin's ``load_ref`` and a read given its manifest did not stream before issue 30."""
    import threading

    from vidcache.store.fsspec import FsspecStore
    from vidcache.store.prefetch import Prefetch
    tier, a = node_a.tier, node_a.cache
    (k,) = node_a.build("h264_30")
    decoding, early, real_read = threading.Event(), [], Prefetch.read

    def read(self, n=-1):
        piece = real_read(self, n)
        if piece:
            decoding.set()
        return piece

    def stream(self, key, sink):
        value = self.get(key)
        sink(value[:len(value) // 2])
        early.append(decoding.wait(20))        # the decoder has read bytes of the first half by now
        sink(value[len(value) // 2:])
        return True
    want = a.frames(k)
    monkeypatch.setattr(Prefetch, "read", read)
    monkeypatch.setattr(FsspecStore, "stream", stream)
    if reader == "plugin load_ref":
        from vidcache import node
        from vidcache.sglang.plugin.qwen_vl import load_ref
        monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "b"))
        monkeypatch.setenv("VIDCACHE_SHARED", str(tier))
        monkeypatch.setattr(node, "_OPEN", {})
        got = load_ref({"tier": node.node_cache().identity, "key": k}).frames
    else:
        b = VideoCache(tmp_path / "b", shared=str(tier))
        got = b.frames(k) if reader == "frames(key)" else b.frames(k, b.require_manifest(k))
    assert torch.equal(got, want)
    assert early == [True]


def test_a_tier_failure_part_way_through_a_download_is_raised_and_the_object_stays(node_a, tmp_path, videos,
                                                                                   monkeypatch):
    """A fetch cut off mid-object is the tier's failure (SharedUnavailableError), never a corrupt object: the
    compact object is not quarantined, nothing half-decoded is served or kept, and the next read is exact."""
    from vidcache.errors import SharedUnavailableError
    from vidcache.store.fsspec import FsspecStore
    tier, a = node_a.tier, node_a.cache
    (k,) = node_a.build("h264_30")
    want, real_stream = a.frames(k), FsspecStore.stream

    def cut(self, key, sink):
        value = self.get(key)
        sink(value[:len(value) // 2])
        raise SharedUnavailableError(f"shared tier {self.url} is unreachable (get {key}: connection reset)")
    monkeypatch.setattr(FsspecStore, "stream", cut)
    b = VideoCache(tmp_path / "b", shared=str(tier))
    with pytest.raises(SharedUnavailableError, match="connection reset"):
        b.frames(k)
    assert b.shared.get(b.compact.key(k)) is not None                        # still there, ...
    assert not list(b.shared.keys(K.QUARANTINE))                             # ... nothing moved aside
    assert not b.local.exists_many([K.cas(b.manifest(k).frames.blob)])[0]    # nothing kept
    monkeypatch.setattr(FsspecStore, "stream", real_stream)
    assert torch.equal(b.frames(k), want) and b.verify(k) == []


def test_a_first_read_fetches_the_manifest_and_the_compact_object_side_by_side(node_a, tmp_path, videos, monkeypatch):
    """One round trip, not two in a row: the manifest's fetch waits (up to 20 s) until the compact object's
    fetch has begun, which only happens when both are in flight at once.  A resume check does not pull
    the object."""
    import threading

    from vidcache.store.directory import DirectoryStore  # the directory tier's class (it reads itself)
    tier, a = node_a.tier, node_a.cache
    (k,) = node_a.build("h264_30")
    object_asked, fetched = threading.Event(), []
    real_get, real_stream = DirectoryStore.get, DirectoryStore.stream

    def get(self, key):
        fetched.append(key)
        if key == K.ac(k):
            assert object_asked.wait(20), "the manifest was fetched before the compact object was asked for"
        return real_get(self, key)

    def stream(self, key, sink):
        fetched.append(key)
        object_asked.set()
        return real_stream(self, key, sink)
    monkeypatch.setattr(DirectoryStore, "get", get)
    monkeypatch.setattr(DirectoryStore, "stream", stream)
    b = VideoCache(tmp_path / "b", shared=str(tier))
    assert torch.equal(b.frames(k), a.frames(k))
    assert fetched.count(b.compact.key(k)) == 1 and fetched.count(K.ac(k)) == 1
    fetched.clear()
    assert torch.equal(b.frames(k), a.frames(k)) and fetched == []          # the second read is local
    c = VideoCache(tmp_path / "c", shared=str(tier))
    assert c.ensure(videos["h264_30"], VideoOptions()).status == "hit"
    assert c.compact.key(k) not in fetched                                   # a hit is counted, not pulled


def test_an_older_raw_tier_is_read_and_converted_only_when_asked(tmp_path, videos):
    """CLI only, on fresh nodes: a tier written by the older layout (raw frames) is read as it is; `verify
    --shared --upgrade` converts it, deleting a raw blob only once every entry using it is compact."""
    tier = tmp_path / "tier"
    old = VideoCache(tmp_path / "old", shared=str(tier), shared_layout="raw")
    k1 = old.ensure(videos["ffv1_10_small"], VideoOptions(family="qwen2_vl")).key
    k2 = old.ensure(videos["ffv1_10_small"], VideoOptions(family="qwen2_5_vl")).key   # the same frames: one blob
    k3 = old.ensure(videos["mjpeg_24"], VideoOptions()).key
    want = {k: old.frames(k) for k in (k1, k2, k3)}
    assert len(ns(tier, "cas/")) == 2 and ns(tier, "frozen/") == []
    before = tier_names(tier)

    b = tmp_path / "nodeB"
    r = run_cli(["verify", "--shared"], b, tier)
    assert r.returncode == 0 and "verify: 3 ok, 0 bad" in r.stdout, r.stdout + r.stderr
    reader = VideoCache(tmp_path / "reader", shared=str(tier))              # reads the old layout ...
    assert all(torch.equal(reader.frames(k), v) for k, v in want.items())
    assert tier_names(tier) == before                                        # ... and rewrites nothing

    r = run_cli(["verify", "--shared", "--upgrade"], b, tier)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "upgrade: 3 converted to compact objects, 0 already compact, 0 kept raw" in r.stdout
    assert ns(tier, "cas/") == [] and len(ns(tier, "frozen/")) == 3
    assert "verify: 3 ok, 0 bad" in run_cli(["verify", "--shared"], tmp_path / "nodeC", tier).stdout
    fresh = VideoCache(tmp_path / "nodeD", shared=str(tier))
    assert all(torch.equal(fresh.frames(k), v) for k, v in want.items())
    r = run_cli(["verify", "--shared", "--upgrade"], b, tier)
    assert "0 converted to compact objects, 3 already compact" in r.stdout


def test_a_tier_of_ut_video_objects_from_the_previous_format_is_still_read(tmp_path, videos, monkeypatch):
    """Compact objects were UT Video before MagicYUV, under the same ``.nut`` name.  A fresh node reads them
    exactly (the codec comes from the stream), `verify --shared` passes them (CLI only), and nothing is
    re-encoded: `--upgrade` finds them compact already."""
    import av

    from vidcache import frozen_file
    tier = tmp_path / "tier"
    old_format = frozen_file.FrozenFormat("magicyuv", "nut", ".nut", "utvideo", "gbrp", "video/x-nut",
                                          (("pred", "median"),))
    with monkeypatch.context() as m:
        m.setitem(frozen_file.FORMATS, "magicyuv", old_format)
        a = VideoCache(tmp_path / "a", shared=str(tier))
        keys = [a.ensure(videos[n], VideoOptions()).key for n in ("h264_30", "mjpeg_24")]
    objects = [tier / n for n in ns(tier, "frozen/")]
    assert len(objects) == 2 and ns(tier, "cas/") == []
    for o in objects:
        with av.open(str(o)) as box:
            assert box.streams.video[0].codec_context.name == "utvideo"      # really the old codec
    before = tier_names(tier)
    r = run_cli(["verify", "--shared"], tmp_path / "nodeB", tier)
    assert r.returncode == 0 and "verify: 2 ok, 0 bad" in r.stdout, r.stdout + r.stderr
    fresh = VideoCache(tmp_path / "nodeC", shared=str(tier))
    assert all(torch.equal(fresh.frames(k), a.frames(k)) for k in keys)
    r = run_cli(["verify", "--shared", "--upgrade"], tmp_path / "nodeB", tier)
    assert r.returncode == 0 and "0 converted to compact objects, 2 already compact" in r.stdout, r.stdout
    assert tier_names(tier) == before


def test_upgrade_needs_the_shared_tier_named(tmp_path):
    r = run_cli(["verify", "--upgrade"], tmp_path / "n", tmp_path / "tier")
    assert r.returncode == 1 and "vidcache: error: [config]" in r.stderr and "Traceback" not in r.stderr


def test_a_full_local_disk_still_serves_a_sound_compact_entry(node_a, tmp_path, videos, monkeypatch, caplog):
    """D20 for compact objects: the backfill is skipped with one warning; the checked frames are served."""
    tier, a = node_a.tier, node_a.cache
    (k,) = node_a.build("mjpeg_24")
    b = VideoCache(tmp_path / "b", shared=str(tier))
    b.manifest(k)
    real = type(b.local).set_many_staged

    def full(self, items, staged):           # the backfill's write (store/backfill.py)
        if any(key.startswith(K.CAS) for key in items):
            raise NoSpaceError(f"no space left for the LMDB file ({os.strerror(errno.ENOSPC)})")   # as LMDBStore says it
        return real(self, items, staged)
    monkeypatch.setattr(type(b.local), "set_many_staged", full)
    with caplog.at_level(logging.WARNING, logger="vidcache"):
        assert torch.equal(b.frames(k), a.frames(k)) and torch.equal(b.frames(k), a.frames(k))
        b.close()                             # every write this process started has ended
    assert sum("without a local copy" in r.message for r in caplog.records) == 1
    assert b.local.get("cas/" + b.manifest(k).frames.blob) is None


def test_any_other_failure_of_a_local_copy_is_raised_by_the_next_read_not_dropped(node_a, tmp_path, videos,
                                                                                  monkeypatch):
    """Only a full disk is tolerated (D20): a local copy that fails otherwise (a failing disk, a bug) in the
    background writer is raised in the reader's thread by its next read, not lost."""
    tier, a = node_a.tier, node_a.cache
    k1, k2 = node_a.build("mjpeg_24", "h264_30")
    b = VideoCache(tmp_path / "b", shared=str(tier))

    real = type(b.local).set_many_staged

    def failing(self, items, staged):
        if any(key.startswith(K.CAS) for key in items):
            raise StoreError("mdb_txn_commit: Input/output error")  # EIO with room to spare: not a full disk
        return real(self, items, staged)
    monkeypatch.setattr(type(b.local), "set_many_staged", failing)
    assert torch.equal(b.frames(k1), a.frames(k1))                 # served: the checked shared frames
    with pytest.raises(StoreError, match="Input/output error"):
        b.frames(k2)
    b.frames(k2)                                                   # raised once, then reads go on


def test_an_entry_no_frozen_file_can_hold_stays_raw(node_a, tmp_path, videos):
    """decord cannot open a 2-frame NUT: such an entry keeps raw frames in the tier rather than an object some
    SGLang decoder cannot read."""
    tier, a = node_a.tier, node_a.cache
    k = a.ensure(videos["mjpeg_24"], VideoOptions(nframes=2, min_frames=2)).key
    assert a.manifest(k).num_frames == 2
    assert len(ns(tier, "cas/")) == 1 and ns(tier, "frozen/") == []
    assert torch.equal(VideoCache(tmp_path / "b", shared=str(tier)).frames(k), a.frames(k))


def test_stock_mode_is_served_the_compact_object_itself(node_a, tmp_path, videos):
    """One object per entry for a stock-mode cluster: the shared transport's URL names the compact object."""
    from urllib.parse import unquote, urlparse

    import vidcache
    from vidcache.sglang.transport import video_uri
    tier, a = node_a.tier, node_a.cache
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(family="qwen2_5_vl"), a)
    before = tier_names(tier)
    uri = video_uri(h, transport="shared")
    assert tier_names(tier) == before                       # nothing new was published
    assert os.path.relpath(unquote(urlparse(uri).path), tier) in ns(tier, "frozen/")
    assert json.loads(json.dumps(uri))                      # a plain string SGLang can take


def test_prewarm_sweeps_old_partial_files_of_killed_publishes(tmp_path, videos):
    """D25: a node killed mid-publish left a .partial in the tier; the next prewarm (any node) removes it once
    it is old enough that no live writer can own it, and leaves a young one alone."""
    import time
    tier = tmp_path / "tier"
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["mjpeg_24"]]}) + "\n")
    r = run_cli(["prewarm", str(ds)], tmp_path / "a", tier)
    assert r.returncode == 0, r.stderr
    ac_dir = next(p for p in (tier / "ac").iterdir() if p.is_dir())
    old, young = ac_dir / ".x.deadbeef.partial", ac_dir / ".y.cafef00d.partial"
    old.write_bytes(b"\0" * 1000)
    young.write_bytes(b"\0" * 10)
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    r = run_cli(["prewarm", str(ds)], tmp_path / "b", tier)
    assert r.returncode == 0 and "removed 1 partial file(s)" in r.stderr, r.stderr
    assert not old.exists() and young.exists()


def test_upgrade_never_trusts_an_unsound_object_at_the_compact_name(tmp_path, videos):
    """D32, CLI only for the upgrade: a raw-layout tier where a bit-rotted frozen file (stock mode of the older
    layout publishes to the same name) already sits at one entry's compact name.  `verify --shared --upgrade`
    proves the object before it deletes the raw frames: the bad one is moved aside and replaced, and a fresh
    node reads every entry exactly (before: the raw blob was deleted, and the entry was lost)."""
    tier = tmp_path / "tier"
    old = VideoCache(tmp_path / "old", shared=str(tier), shared_layout="raw")
    k1 = old.ensure(videos["ffv1_10_small"], VideoOptions()).key
    k2 = old.ensure(videos["mjpeg_24"], VideoOptions()).key
    want = {k: old.frames(k) for k in (k1, k2)}
    writer = VideoCache(tmp_path / "writer", shared=str(tier))
    assert writer.compact.publish(k2, want[k2], old.manifest(k2))   # a sound object at k2's compact name ...
    name = tier / next(n for n in ns(tier, "frozen/") if k2 in n and n.endswith(".nut"))
    flip_file(name, 0.5, bit=0x55)                                  # ... rotted in its middle
    r = run_cli(["verify", "--shared", "--upgrade"], tmp_path / "nodeB", tier)
    assert "Traceback" not in r.stderr, r.stderr
    assert "2 converted to compact objects" in r.stdout, r.stdout + r.stderr
    assert any(k2 in n for n in ns(tier, "quarantine/")), tier_names(tier)       # the bad one, kept aside
    fresh = VideoCache(tmp_path / "nodeC", shared=str(tier))
    assert all(torch.equal(fresh.frames(k), v) for k, v in want.items())
    r = run_cli(["verify", "--shared"], tmp_path / "nodeD", tier)
    assert r.returncode == 0 and "verify: 2 ok, 0 bad" in r.stdout, r.stdout + r.stderr


def test_a_symlink_planted_at_an_object_name_is_never_followed(node_a, tmp_path, videos):
    """D33: anyone who can write the export plants `frozen/.../<key>.nut -> /a/node/secret`.  A fresh node never
    reads through the link: the entry is as if that object were missing (the read fails by name or is rebuilt),
    and nothing of the secret reaches the tier (its quarantine/ included)."""
    from vidcache.errors import NotCachedError
    tier, a = node_a.tier, node_a.cache
    (key,) = node_a.build("mjpeg_24")
    obj = tier / next(n for n in ns(tier, "frozen/") if key in n and n.endswith(".nut"))
    secret = tmp_path / "secret"
    secret.write_bytes(b"TOPSECRET" * 1000)
    obj.unlink()
    obj.symlink_to(secret)
    b = VideoCache(tmp_path / "b", shared=str(tier))
    with pytest.raises(NotCachedError):
        b.frames(key)
    r = run_cli(["verify", "--shared"], tmp_path / "c", tier)                 # CLI: named, no traceback
    assert "Traceback" not in r.stderr and key in r.stdout + r.stderr
    for d, _, fs in os.walk(tier):
        for f in fs:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                assert b"TOPSECRET" not in open(p, "rb").read(), p


def test_a_crash_between_the_object_and_its_record_heals_on_the_next_publish(node_a, tmp_path, videos):
    """D39: a node dies after the compact object's PUT and before its digest record.  The next publish of that
    entry (the resumed prewarm rebuilding it) finds the sound object and writes the missing record, so `verify
    --shared` (CLI, a fresh node) passes without --repair."""
    tier, a = node_a.tier, node_a.cache
    (key,) = node_a.build("mjpeg_24")
    frames = a.frames(key)
    records = [n for n in ns(tier, "frozen-digest/") if key in n]
    assert records, tier_names(tier)
    for n in records:
        os.unlink(tier / n)                                     # the crash: the object, and no record
    r = run_cli(["verify", "--shared"], tmp_path / "b", tier)
    # D39 reported it bad; verify now checks an unrecorded compact object by decoding it (and a look writes nothing)
    assert r.returncode == 0 and "verify: 1 ok, 0 bad" in r.stdout, r.stdout + r.stderr
    assert not [n for n in ns(tier, "frozen-digest/") if key in n]
    assert a.compact.publish(key, frames, a.manifest(key))     # the resumed run's publish
    assert sorted(n for n in ns(tier, "frozen-digest/") if key in n) == sorted(records)   # the record is back
    r = run_cli(["verify", "--shared"], tmp_path / "c", tier)
    assert r.returncode == 0 and "verify: 1 ok, 0 bad" in r.stdout, r.stdout + r.stderr


def test_ctrl_c_during_an_upgrade_loses_nothing_and_a_rerun_completes(tmp_path, videos):
    """Issue 33, CLI only: SIGINT (to the process group, as a terminal sends it) during `verify --shared
    --upgrade` of a raw tier exits 130 with no traceback; every entry still reads exactly on a fresh node, and a
    re-run converts the rest."""
    import signal
    import time
    tier = tmp_path / "tier"
    old = VideoCache(tmp_path / "old", shared=str(tier), shared_layout="raw")
    names = ["h264_30", "mjpeg_24", "hevc_25", "ffv1_10_small", "h264_ntsc", "mpeg4_25_odd"]
    want = {}
    for n in names:
        k = old.ensure(videos[n], VideoOptions()).key
        want[k] = old.frames(k)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "VIDCACHE_DIR": str(tmp_path / "nodeB"),
           "VIDCACHE_SHARED": str(tier)}
    cmd = [sys.executable, "-m", "vidcache.cli", "verify", "--shared", "--upgrade"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not ns(tier, "frozen/") and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)                                   # the first compact object: the upgrade is under way
    interrupted = proc.poll() is None
    if interrupted:
        os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
    summary = [ln for ln in out.splitlines() if ln.startswith("upgrade:")]
    assert len(summary) == 1, (out, err)                       # a summary, interrupted or not
    if interrupted and proc.returncode == 130:                 # the entry under way finished; the rest are left
        assert "interrupted (" in summary[0] and "left: run it again" in summary[0], summary
        assert "finishing the entry under way" in err, err
    else:                                                      # the signal came after the last entry
        assert proc.returncode == 0 and "interrupted" not in summary[0], (proc.returncode, out, err)
    fresh = VideoCache(tmp_path / "nodeC", shared=str(tier))
    assert all(torch.equal(fresh.frames(k), v) for k, v in want.items())    # nothing lost, mid-way or not
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "0 kept raw" in r.stdout, r.stdout + r.stderr
    assert ns(tier, "cas/") == []
    fresh = VideoCache(tmp_path / "nodeD", shared=str(tier))
    assert all(torch.equal(fresh.frames(k), v) for k, v in want.items())


def test_a_compact_object_without_its_record_is_sound_to_verify_and_repair_records_it(tmp_path, videos):
    """D39 as verify sees it, CLI only on fresh node dirs: a crash (or Ctrl-C) between a compact object and its
    digest record leaves an object that decodes exactly.  `verify --shared` checks it by decoding, calls it
    sound, and `verify --shared --repair` writes the record back; a flipped byte is still bad."""
    tier = tmp_path / "tier"
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["mjpeg_24"]]}) + "\n")
    r = run_cli(["prewarm", str(ds)], tmp_path / "a", tier)
    assert r.returncode == 0, r.stdout + r.stderr
    (rec,) = ns(tier, "frozen-digest/")
    os.unlink(tier / rec)                                  # the record never written
    r = run_cli(["verify", "--shared"], tmp_path / "b", tier)
    assert r.returncode == 0 and "verify: 1 ok, 0 bad" in r.stdout, r.stdout + r.stderr
    assert ns(tier, "frozen-digest/") == []                 # a look changes nothing
    r = run_cli(["verify", "--shared", "--repair"], tmp_path / "c", tier)
    assert r.returncode == 0 and ns(tier, "frozen-digest/") == [rec], r.stdout + r.stderr
    os.unlink(tier / rec)
    (obj,) = ns(tier, "frozen/")
    flip_file(tier / obj, 0.5)
    r = run_cli(["verify", "--shared"], tmp_path / "d", tier)
    assert r.returncode == 1 and "1 bad" in r.stdout, r.stdout + r.stderr


def test_cli_a_pull_that_meets_an_object_not_its_recorded_bytes_replaces_it(tmp_path, videos):
    """CLI only, fresh node directories: the tier's object decodes exactly but its bytes are not its record's
    (damage the decoder concealed, seen here through a record of other bytes).  A fresh node's ``pull`` serves
    the exact frames, moves the object aside and republishes it, so ``verify --shared`` finds the tier sound."""
    from vidcache.digest import Digest
    tier = tmp_path / "tier"
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [videos["mjpeg_24"]]}) + "\n")
    r = run_cli(["prewarm", str(ds), "--no-progress"], tmp_path / "a", tier)
    assert r.returncode == 0, r.stdout + r.stderr
    (rec,) = ns(tier, "frozen-digest/")
    (obj,) = ns(tier, "frozen/")
    before = (tier / obj).read_bytes()
    (tier / rec).write_text(str(Digest.of(b"other bytes")))
    r = run_cli(["verify", "--shared"], tmp_path / "b", tier)
    assert r.returncode == 1 and "1 bad" in r.stdout, r.stdout + r.stderr
    r = run_cli(["pull", str(ds)], tmp_path / "c", tier)
    assert r.returncode == 0 and "pull: 1 pulled" in r.stdout and "Traceback" not in r.stderr, r.stdout + r.stderr
    (moved,) = ns(tier, "quarantine/")
    assert (tier / moved).read_bytes() == before                   # moved aside, not lost
    r = run_cli(["verify", "--shared"], tmp_path / "d", tier)
    assert r.returncode == 0 and "verify: 1 ok, 0 bad" in r.stdout, r.stdout + r.stderr


def test_cli_verify_repair_restores_an_entry_from_an_exactly_decoding_object_in_quarantine(tmp_path, videos):
    """CLI only, fresh node directories.  D42 left tiers whose only sound copy of an entry was the compact object
    moved into ``quarantine/`` (its source gone, no node holding it).  ``verify --shared --repair`` now reads it back
    when it decodes to exactly the manifest's frames, and every node reads the entry again."""
    import shutil

    from vidcache.store.fsspec import FsspecStore
    tier = tmp_path / "tier"
    src = tmp_path / "clip.avi"
    shutil.copy(videos["mjpeg_24"], src)
    ds = tmp_path / "d.jsonl"
    ds.write_text(json.dumps({"prompt": "<video>", "videos": [str(src)]}) + "\n")
    r = run_cli(["prewarm", str(ds), "--no-progress"], tmp_path / "a", tier)
    assert r.returncode == 0, r.stdout + r.stderr
    store = FsspecStore(str(tier))
    (obj,) = [k for k in store.keys("frozen/")]
    key = obj[len("frozen/"):-len(".nut")]
    want = VideoCache(tmp_path / "a", shared=str(tier)).frames(key)
    store.set_many({K.quarantined(obj): store.get(obj)})        # what the old byte check did: moved aside...
    store.delete(obj)                                           # ... and deleted, record and all
    store.delete("frozen-digest/" + obj[len("frozen/"):])
    src.unlink()                                                # and the source is gone
    import shutil as sh
    sh.rmtree(tmp_path / "a")                                   # and no node holds it
    r = run_cli(["verify", "--shared"], tmp_path / "b", tier)
    assert r.returncode == 1 and "1 bad" in r.stdout, r.stdout + r.stderr    # lost on every node
    r = run_cli(["verify", "--shared", "--repair"], tmp_path / "c", tier)
    assert "Traceback" not in r.stderr, r.stderr
    r = run_cli(["verify", "--shared"], tmp_path / "d", tier)
    assert r.returncode == 0 and "verify: 1 ok, 0 bad" in r.stdout, r.stdout + r.stderr
    assert torch.equal(VideoCache(tmp_path / "e", shared=str(tier)).frames(key), want)
