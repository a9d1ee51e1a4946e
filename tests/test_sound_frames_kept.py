"""Issue 48: nothing deletes sound frames.  An object whose frames are exact is served and rewritten, never removed
(D55); ``verify --repair`` writes the replacement before it retires the old object, under kill -9 at each of its
writes and with readers meanwhile (D57); a FIFO at an object's name is refused unopened (D58); a bloated object is
read and set aside only as far as its manifest bounds it (D59).

Counted in every test here: frames served that are not the entry's (corrupt), and entries no fresh node can read
(lost).  Both must be 0.
"""
from __future__ import annotations

import os
import shutil
import signal
import threading

import numpy as np
import pytest
import torch

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K
from vidcache.digest import Digest
from vidcache.errors import NotCachedError, NotRegularFileError
from vidcache.integrity import compact_frames, frozen_problem, max_object_bytes

from support.cli import run_cli

SUFFIX = ".nut"


@pytest.fixture
def entry(tmp_path):
    """An entry built by node A into a directory tier, its source then removed, so that no node can rebuild it:
    only the tier's compact object holds its frames.  (a, key, frames, manifest).  24 frames of 280x392: PyAV
    raises on bytes appended to an object of this size (D55's probe met it with 24 frames of 560x1008; an object
    of 4 small frames decodes past them silently)."""
    from vidcache.testing.videos import make_video
    src = make_video(str(tmp_path / "src.avi"), codec="mjpeg", width=392, height=280, fps=4, n_frames=48, seed=55)
    a = VideoCache(tmp_path / "a", shared=str(tmp_path / "tier"))
    key = a.ensure(str(src), VideoOptions()).key
    want, m = a.frames(key), a.manifest(key)
    a.close()
    os.remove(src)
    return a, key, want, m


def _object(a, key) -> str:
    return a.shared._path(K.frozen(key, SUFFIX))


def _clean(store, key, m) -> bool:
    """The tier's object of ``key``: its recorded bytes, exactly ``m``'s frames, nothing after them."""
    value, record = store.get(K.frozen(key, SUFFIX)), store.get(K.frozen_digest(key, SUFFIX))
    got = compact_frames(value, m)
    return frozen_problem(value, record) is None and got.frames is not None and got.trailing is None


def _fresh(tmp_path, name, **kw) -> VideoCache:
    return VideoCache(tmp_path / name, shared=str(tmp_path / "tier"), **kw)


TAILS = {"1 zero byte": b"\0", "7 zero bytes": b"\0" * 7, "100 zero bytes": b"\0" * 100,
         "4096 zero bytes": b"\0" * 4096,
         "1 KiB random": np.random.default_rng(55).integers(0, 256, 1024, dtype=np.uint8).tobytes()}


# --- D55 -----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tail", list(TAILS))
def test_an_object_with_bytes_appended_is_served_and_rewritten_never_deleted(tmp_path, entry, tail):
    """D55: PyAV decodes every frame of such an object, then raises on the appended bytes; every reader deleted it,
    and repair could not decode it back out of quarantine: with the source gone, the entry was lost."""
    a, key, want, m = entry
    path = _object(a, key)
    sound = open(path, "rb").read()
    with open(path, "ab") as f:
        f.write(TAILS[tail])
    ro = _fresh(tmp_path, "ro", read_only=True)
    assert torch.equal(ro.frames(key), want)                          # a read-only node serves it too
    assert os.path.getsize(path) == len(sound) + len(TAILS[tail])     # ... and leaves it as it is
    b = _fresh(tmp_path, "b")
    assert torch.equal(b.frames(key), want)
    b.sync()                                                          # the rewrite runs on the writer thread
    assert _clean(b.shared, key, m)                                   # a clean copy in its place
    kept = b.shared.get(K.quarantined(K.frozen(key, SUFFIX)))
    assert kept == sound + TAILS[tail]                                # the damaged one set aside, whole
    assert compact_frames(kept, m).frames is not None                 # ... and still readable back
    assert torch.equal(_fresh(tmp_path, "c").frames(key), want)


def test_verify_repair_from_a_fresh_node_rewrites_an_object_with_bytes_appended(tmp_path, entry):
    """D55 through the CLI: ``verify --shared --repair`` on a fresh node, source gone.  It said "1 bad (repair
    attempted)" and every node then got NotCachedError."""
    a, key, want, m = entry
    with open(_object(a, key), "ab") as f:
        f.write(TAILS["1 KiB random"])
    r = run_cli(["verify", "--shared", "--repair"], node=tmp_path / "v", shared=tmp_path / "tier")
    assert "-> repaired" in r.stdout, r.stdout + r.stderr
    assert _clean(a.shared, key, m)
    assert torch.equal(_fresh(tmp_path, "after").frames(key), want)
    r = run_cli(["verify", "--shared"], node=tmp_path / "v2", shared=tmp_path / "tier")
    assert r.returncode == 0 and "1 ok, 0 bad" in r.stdout, r.stdout + r.stderr


def test_repair_reads_back_a_quarantined_object_that_holds_every_frame(tmp_path, entry):
    """Whatever quarantine holds, repair can read back: here an object with bytes appended is all that is left of
    the entry (the tier's object gone, the source gone)."""
    a, key, want, m = entry
    obj = K.frozen(key, SUFFIX)
    a.shared.set_many({K.quarantined(obj): a.shared.get(obj) + TAILS["4096 zero bytes"]})
    a.shared.delete(obj)
    b = _fresh(tmp_path, "b")
    assert b.verify(key, repair=True)
    assert _clean(b.shared, key, m) and torch.equal(_fresh(tmp_path, "c").frames(key), want)


# --- D57 -----------------------------------------------------------------------------------------------------------
# The repair run is killed (SIGKILL, from inside, so the point is exact) before its k-th write or delete on the
# shared tier, for k = 1, 2, ...: every point between two of its steps.  A run that reaches no k-th step finished.
KILL_DRIVER = r"""
import os, signal, sys
from vidcache.store.fsspec import FsspecStore
kill_at, seen = int(os.environ["KILL_AT"]), [0]

def staged(name):
    real = getattr(FsspecStore, name)
    def step(self, *a, **k):
        seen[0] += 1
        if seen[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, *a, **k)
    setattr(FsspecStore, name, step)
for name in ("set_many", "set_if_not_exists", "delete"):
    staged(name)
from vidcache.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _damage_record(a, key) -> None:
    """D57's damage: one hex character of the object's record flipped; the object itself is sound."""
    rkey = K.frozen_digest(key, SUFFIX)
    rec = bytearray(a.shared.get(rkey))
    rec[-1] = ord("0") if rec[-1] != ord("0") else ord("1")
    a.shared.set_many({rkey: bytes(rec)})


def test_verify_repair_killed_at_every_step_loses_nothing(tmp_path, entry):
    """D57: ``verify --shared --repair`` quarantined (deleted) the sound object before its replacement existed; a
    kill -9 in that window left no object and no record (4 of 7 kill points), and every node then missed."""
    a, key, want, m = entry
    _damage_record(a, key)
    pristine = tmp_path / "pristine"
    shutil.copytree(tmp_path / "tier", pristine)
    killed, lost, corrupt = [], 0, 0
    for k in range(1, 30):
        shutil.rmtree(tmp_path / "tier")
        shutil.copytree(pristine, tmp_path / "tier")
        r = run_cli(["verify", "--shared", "--repair"], node=tmp_path / f"v{k}", shared=tmp_path / "tier",
                    code=KILL_DRIVER, env={"KILL_AT": k}, pythonpath=[])
        if r.returncode != -signal.SIGKILL:
            assert "-> repaired" in r.stdout, r.stdout + r.stderr
            break
        killed.append(k)
        # What every node meets right after the kill: a fresh read-only node (it changes nothing) ...
        try:
            corrupt += not torch.equal(_fresh(tmp_path, f"r{k}", read_only=True).frames(key), want)
        except NotCachedError:
            lost += 1
        # ... and a second repair, which must finish the job from there.
        r = run_cli(["verify", "--shared", "--repair"], node=tmp_path / f"w{k}", shared=tmp_path / "tier")
        assert r.returncode in (0, 1), r.stdout + r.stderr
        lost += not _clean(a.shared, key, m)
    assert len(killed) >= 3, killed           # set aside, replace, record: at least these steps were each cut
    assert (lost, corrupt) == (0, 0), (killed, lost, corrupt)


def test_readers_during_verify_repair_never_miss_a_sound_entry(tmp_path, entry):
    """D57: 5 of 18 readers started during an uninterrupted ``verify --shared --repair`` got NotCachedError for a
    sound entry.  Readers on fresh nodes (read-only, so that they leave the repair to verify) read in a loop for as
    long as the repair runs."""
    a, key, want, m = entry
    _damage_record(a, key)
    done, reads, missed, corrupt = threading.Event(), [0], [], [0]

    def reader(i: int) -> None:
        n = 0
        while not done.is_set() or n == 0:
            n += 1
            try:
                corrupt[0] += not torch.equal(_fresh(tmp_path, f"r{i}-{n}", read_only=True).frames(key), want)
            except NotCachedError as e:
                missed.append(str(e))
            reads[0] += 1
    threads = [threading.Thread(target=reader, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    r = run_cli(["verify", "--shared", "--repair"], node=tmp_path / "v", shared=tmp_path / "tier")
    done.set()
    for t in threads:
        t.join(120)
    assert "-> repaired" in r.stdout, r.stdout + r.stderr
    assert (missed, corrupt[0]) == ([], 0) and reads[0] >= 3, (reads, missed)
    assert _clean(a.shared, key, m)


# --- D58 -----------------------------------------------------------------------------------------------------------
def _io_threads() -> int:
    return sum(t.name == "vidcache-shared-io" and t.is_alive() for t in threading.enumerate())


def test_a_fifo_at_an_objects_name_is_refused_unopened(tmp_path, entry, monkeypatch):
    """D58: the open of a FIFO blocks until a writer comes; each read waited the whole tier timeout and left its
    thread blocked in the kernel for ever.  The timeout is short here only so that the unfixed code fails quickly."""
    monkeypatch.setenv("VIDCACHE_SHARED_TIMEOUT_S", "3")
    a, key, want, m = entry
    path = _object(a, key)
    os.remove(path)
    os.mkfifo(path)
    before = _io_threads()
    b = _fresh(tmp_path, "b")
    for _ in range(3):
        with pytest.raises(NotRegularFileError, match="a FIFO, not a regular file"):
            b.frames(key)
    with pytest.raises(NotRegularFileError, match="FIFO"):
        b.shared.get(K.frozen(key, SUFFIX))
    assert _io_threads() == before
    problems = _fresh(tmp_path, "c").verify(key)
    assert any("FIFO" in p for p in problems), problems


def test_verify_repair_replaces_a_fifo_at_an_objects_name(tmp_path, entry, monkeypatch):
    monkeypatch.setenv("VIDCACHE_SHARED_TIMEOUT_S", "3")
    a, key, want, m = entry
    b = _fresh(tmp_path, "b")
    assert torch.equal(b.frames(key), want)                           # node B holds a local copy
    path = _object(a, key)
    os.remove(path)
    os.mkfifo(path)
    assert b.verify(key, repair=True)
    assert _clean(b.shared, key, m) and torch.equal(_fresh(tmp_path, "c").frames(key), want)


# --- D59 -----------------------------------------------------------------------------------------------------------
def test_verify_repair_reads_and_sets_aside_a_bloated_object_only_as_far_as_its_manifest_bounds_it(
        tmp_path, entry, monkeypatch):
    """D59: a 1.3 MB entry's object grown to 2 GiB: ``verify --shared --repair`` read it whole (6.35 GB peak RSS)
    and wrote all 2 GiB into quarantine/.  Grown (sparse) to 256 MiB here; counted: the bytes the tier handed
    over, and what quarantine/ holds."""
    from vidcache.store.directory import DirectoryStore  # the directory tier's class (it reads itself)
    a, key, want, m = entry
    path = _object(a, key)
    sound = open(path, "rb").read()
    os.truncate(path, 256 << 20)
    handed = []
    real_stream, real_get = DirectoryStore.stream, DirectoryStore.get

    def stream(self, k, sink):
        def count(piece):
            handed.append(len(piece))
            sink(piece)
        return real_stream(self, k, count)

    def get(self, k):
        value = real_get(self, k)
        handed.append(len(value or b""))
        return value
    monkeypatch.setattr(DirectoryStore, "stream", stream)
    monkeypatch.setattr(DirectoryStore, "get", get)
    b = _fresh(tmp_path, "b")
    assert b.verify(key, repair=True)
    bound = max_object_bytes(m)
    assert max(handed) <= bound < 256 << 20
    kept = os.path.getsize(b.shared._path(K.quarantined(K.frozen(key, SUFFIX))))
    assert kept <= bound                                              # its bloat was not copied
    assert _clean(b.shared, key, m) and b.shared.get(K.frozen(key, SUFFIX)) is not None
    assert torch.equal(_fresh(tmp_path, "c").frames(key), want)


def test_stock_serving_keeps_a_sound_compact_object_whose_record_is_damaged(tmp_path, entry):
    """The D57 order in the stock-mode path (``sglang.frozen.published_frozen_key``): a damaged frozen-digest record
    made it quarantine the shared compact object, the entry's only copy once the source is gone.  Now the object is
    decoded: its frames are the entry's, so it stays and the record is rewritten."""
    from vidcache.sglang.frozen import published_frozen_key
    a, key, want, m = entry
    store = a.shared
    store.set_many({K.frozen_digest(key, SUFFIX): b"0" * 32})      # the record damaged, the object sound
    b = _fresh(tmp_path, "b")
    assert published_frozen_key(b, key) == K.frozen(key, SUFFIX)     # the serving format: the compact object
    assert _clean(store, key, m)                                    # object kept, record rewritten
    c = _fresh(tmp_path, "c")
    assert torch.equal(c.frames(key), want)                         # and every fresh node reads the entry
