"""``vidcache.frozen_copies.FrozenCopies``: where an entry's frozen files are (this node's files, the shared
tier's objects), the digest recorded beside each, and what happens to a copy whose bytes are not its record's.
Nothing here decodes, so plain bytes and in-memory stores stand in for frozen files and tiers."""
import os

import pytest

from vidcache import keys as K
from vidcache.config import NodeLayout
from vidcache.digest import Digest
from vidcache.errors import InvalidKeyError
from vidcache.frozen_copies import FrozenCopies
from vidcache.store.memory import MemoryStore

KEY = "0" * 32 + ".12." + "f" * 32
OTHER = "1" * 32 + ".12." + "f" * 32
LOCAL_BYTES, SHARED_BYTES = b"local frozen file" * 10, b"shared compact object" * 10


@pytest.fixture
def fc(tmp_path):
    """A node with one local frozen file (.mp4) and one shared object (.nut) of KEY, each recorded, plus a local
    file of another key."""
    f = FrozenCopies(NodeLayout(str(tmp_path / "node")), MemoryStore(), MemoryStore(), read_only=False)
    os.makedirs(f.dir)
    _write(f, KEY + ".mp4", LOCAL_BYTES)
    _write(f, OTHER + ".mp4", b"another entry")
    f.shared.set_many({K.frozen(KEY, ".nut"): SHARED_BYTES})
    f.record("local", KEY, ".mp4", LOCAL_BYTES)
    f.record("shared", KEY, ".nut", SHARED_BYTES)
    return f


def _write(f, name, data):
    with open(os.path.join(f.dir, name), "wb") as out:
        out.write(data)


def test_copies_lists_this_nodes_files_then_the_shared_objects_of_that_key_only(fc):
    _write(fc, KEY + ".avi", b"x")
    assert fc.copies(KEY) == [("local", ".avi"), ("local", ".mp4"), ("shared", ".nut")]
    assert fc.copies(OTHER) == [("local", ".mp4")]


def test_copies_of_a_node_without_files_or_tier_is_empty_and_a_bad_key_is_refused(tmp_path):
    f = FrozenCopies(NodeLayout(str(tmp_path / "never")), MemoryStore(), None, read_only=False)
    assert f.copies(KEY) == []                          # no frozen dir yet, no shared tier: nothing, no error
    with pytest.raises(InvalidKeyError):
        f.copies("../" + KEY)


def test_read_pairs_each_copy_with_its_own_tiers_record(fc):
    assert fc.read("local", KEY, ".mp4") == (LOCAL_BYTES, str(Digest.of(LOCAL_BYTES)).encode())
    assert fc.read("shared", KEY, ".nut") == (SHARED_BYTES, str(Digest.of(SHARED_BYTES)).encode())
    assert fc.read("local", KEY, ".nut") == (None, None)           # the shared copy's record is not the local one's
    assert fc.local.get(K.frozen_digest(KEY, ".nut")) is None


def test_record_writes_the_digest_in_the_copys_tier_and_nothing_into_a_read_only_one(tmp_path):
    local, shared = MemoryStore(), MemoryStore(read_only=True)
    f = FrozenCopies(NodeLayout(str(tmp_path)), local, shared, read_only=False)
    f.record("local", KEY, ".mp4", b"abc")
    assert local.get(K.frozen_digest(KEY, ".mp4")) == str(Digest.of(b"abc")).encode()
    f.record("shared", KEY, ".nut", b"abc")                         # a read-only tier: no error, no write
    assert list(shared.keys()) == []


def test_sound_copies_have_no_problems_and_repair_changes_nothing(fc):
    before = (sorted(os.listdir(fc.dir)), dict(fc.local._data), dict(fc.shared._data))
    assert fc.problems(KEY) == [] and fc.problems(KEY, repair=True) == []
    assert (sorted(os.listdir(fc.dir)), dict(fc.local._data), dict(fc.shared._data)) == before


def test_a_copy_whose_bytes_changed_is_reported_and_on_repair_moved_aside_with_its_record_forgotten(fc):
    _write(fc, KEY + ".mp4", LOCAL_BYTES[:-1] + b"!")
    fc.shared.set_many({K.frozen(KEY, ".nut"): SHARED_BYTES[:-1] + b"!"})
    problems = fc.problems(KEY)
    assert len(problems) == 2 and all("hashes to" in p for p in problems), problems
    assert problems[0].startswith("local: frozen file .mp4") and problems[1].startswith("shared: frozen file .nut")
    assert fc.copies(KEY) == [("local", ".mp4"), ("shared", ".nut")]      # a look changes nothing

    assert fc.problems(KEY, repair=True) == problems
    assert fc.copies(KEY) == []                                            # never served again
    assert open(os.path.join(fc.layout.quarantine_dir, KEY + ".mp4"), "rb").read() == LOCAL_BYTES[:-1] + b"!"
    assert fc.shared.get(K.quarantined(K.frozen(KEY, ".nut"))) == SHARED_BYTES[:-1] + b"!"
    assert fc.local.get(K.frozen_digest(KEY, ".mp4")) is None
    assert fc.shared.get(K.frozen_digest(KEY, ".nut")) is None
    assert fc.copies(OTHER) == [("local", ".mp4")]                         # another entry's file stays


def test_a_damaged_record_is_a_problem_too(fc):
    fc.local.set_many({K.frozen_digest(KEY, ".mp4"): b"\xff not a digest"})
    assert fc.problems(KEY) == ["local: frozen file .mp4 its recorded digest is damaged"]


def test_a_copy_without_a_record_is_reported_unless_it_decodes_and_then_repair_records_it(fc):
    fc.local.delete(K.frozen_digest(KEY, ".mp4"))
    assert fc.problems(KEY) == ["local: frozen file .mp4 no recorded digest"]
    asked = []
    assert fc.problems(KEY, decodes=lambda *a: asked.append(a) or True) == []
    assert asked == [("local", ".mp4", LOCAL_BYTES)]
    assert fc.local.get(K.frozen_digest(KEY, ".mp4")) is None             # looked, not recorded
    assert fc.problems(KEY, repair=True, decodes=lambda *a: True) == []
    assert fc.local.get(K.frozen_digest(KEY, ".mp4")) == str(Digest.of(LOCAL_BYTES)).encode()


def test_an_unrecorded_copy_that_does_not_decode_is_reported_but_not_moved(fc):
    """Without a record there is nothing it contradicts (D39: a crash between a copy and its record): it is
    left for ``repair_frozen``, which checks it by decoding."""
    fc.local.delete(K.frozen_digest(KEY, ".mp4"))
    assert fc.problems(KEY, repair=True, decodes=lambda *a: False) == ["local: frozen file .mp4 no recorded digest"]
    assert fc.copies(KEY)[0] == ("local", ".mp4")


def test_set_aside_copies_the_bad_shared_object_only_while_it_is_still_the_bad_one(fc):
    bad = Digest.of(SHARED_BYTES)
    assert fc.set_aside("shared", KEY, ".nut", bad) is True
    assert fc.shared.get(K.quarantined(K.frozen(KEY, ".nut"))) == SHARED_BYTES
    assert fc.shared.get(K.frozen(KEY, ".nut")) == SHARED_BYTES            # left in place
    fc.shared.set_many({K.frozen(KEY, ".nut"): b"a racing node's fresh object"})
    assert fc.set_aside("shared", KEY, ".nut", bad) is False
    assert fc.shared.get(K.quarantined(K.frozen(KEY, ".nut"))) == SHARED_BYTES
    fc.shared.delete(K.frozen(KEY, ".nut"))
    assert fc.set_aside("shared", KEY, ".nut", bad) is False               # gone


def test_quarantine_leaves_a_shared_object_that_is_other_bytes_now(fc):
    fc.quarantine("shared", KEY, ".nut", bad=Digest.of(b"what was found bad"))
    assert fc.shared.get(K.frozen(KEY, ".nut")) == SHARED_BYTES
    assert fc.shared.get(K.frozen_digest(KEY, ".nut")) is not None
    fc.quarantine("shared", KEY, ".nut", bad=Digest.of(SHARED_BYTES))
    assert fc.shared.get(K.frozen(KEY, ".nut")) is None and fc.shared.get(K.frozen_digest(KEY, ".nut")) is None


def test_a_read_only_node_moves_nothing(fc):
    ro = FrozenCopies(fc.layout, fc.local, fc.shared, read_only=True)
    ro.quarantine("local", KEY, ".mp4")
    ro.quarantine("shared", KEY, ".nut")
    assert ro.copies(KEY) == [("local", ".mp4"), ("shared", ".nut")]
    assert not os.path.exists(fc.layout.quarantine_dir)


def test_a_shared_tier_that_refuses_writes_warns_instead_of_raising(fc, caplog, monkeypatch):
    from vidcache import errors
    monkeypatch.setattr(errors, "_WARNED", set())
    shared = fc.shared.with_read_only()
    f = FrozenCopies(fc.layout, fc.local, shared, read_only=False)
    with caplog.at_level("WARNING", logger="vidcache"):
        f.quarantine("shared", KEY, ".nut")
    assert "could not move a corrupt copy aside" in caplog.text
    assert shared.get(K.frozen(KEY, ".nut")) == SHARED_BYTES
