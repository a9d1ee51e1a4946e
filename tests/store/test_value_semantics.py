"""Every store is a value, derived in one place (``Store._args``): equal iff the same type, location and
read_only; a hash that agrees; a repr naming the type and the location; a pickle round trip that gives the same
store back (where the data is not in the object); ``with_read_only`` that gives another store and back again."""
import pickle

import pytest

from vidcache.store.fsspec import FsspecStore
from vidcache.store.lmdb import LMDBStore
from vidcache.store.memory import MemoryStore
from vidcache.store.tiered import TieredStore


def _lmdb(tmp_path, where="a", **kw):
    return LMDBStore(tmp_path / where, **kw)


def _fsspec(tmp_path, where="a", **kw):
    return FsspecStore(str(tmp_path / where), **kw)


def _tiered(tmp_path, where="a", **kw):
    return TieredStore(LMDBStore(tmp_path / where / "local"), FsspecStore(str(tmp_path / where / "shared")), **kw)


MAKERS = {"lmdb": _lmdb, "fsspec": _fsspec, "tiered": _tiered}


@pytest.fixture(params=sorted(MAKERS))
def make(request, tmp_path):
    return lambda *a, **kw: MAKERS[request.param](tmp_path, *a, **kw)


def test_equal_iff_same_location_and_read_only(make):
    a = make()
    assert a == make() and hash(a) == hash(make())
    assert a != make("b")
    assert a != make(read_only=True) and make(read_only=True) == make(read_only=True)
    assert hash(make(read_only=True)) == hash(make(read_only=True))
    assert len({a, make(), make("b"), make(read_only=True)}) == 3
    assert a != "not a store" and a != MemoryStore()


def test_repr_names_the_type_and_the_location(make, tmp_path):
    a, ro = make(), make(read_only=True)
    assert repr(a).startswith(type(a).__name__ + "(") and str(tmp_path / "a") in repr(a)
    assert "read_only=True" in repr(ro) and "read_only" not in repr(a)


def test_pickle_round_trip_is_the_same_store(make):
    for s in (make(), make(read_only=True)):
        again = pickle.loads(pickle.dumps(s))
        assert again == s and hash(again) == hash(s) and again is not s


def test_with_read_only_is_another_store_and_back(make):
    a = make()
    ro = a.with_read_only(True)
    assert ro.read_only and not a.read_only and ro != a
    assert ro.with_read_only(False) == a and hash(ro.with_read_only(False)) == hash(a)
    assert a.with_read_only(False) == a
    assert type(ro) is type(a)


# --- what counts, store by store ---------------------------------------------------------------------

def test_lmdb_identity_is_its_path_not_its_tuning(tmp_path):
    a = _lmdb(tmp_path, max_bytes=1 << 20)
    assert a == _lmdb(tmp_path, map_size=1 << 24, max_readers=8)          # the same file, tuned otherwise
    assert a == LMDBStore(str(tmp_path / "a"))                        # str or Path: the same absolute path
    ro = a.with_read_only()
    assert (ro.initial_map_size, ro.max_readers, ro.max_bytes) == (a.initial_map_size, a.max_readers, 1 << 20)


def test_lmdb_pickles_as_its_arguments_and_reopens(tmp_path):
    s = _lmdb(tmp_path, max_bytes=1 << 20, max_readers=64)
    s.set_many({"ac/k": b"v"})
    assert s.__getstate__() == {"path": s.path, "read_only": False, "map_size": 1 << 30, "max_readers": 64,
                                "max_bytes": 1 << 20}
    again = pickle.loads(pickle.dumps(s))
    assert (again.max_bytes, again.max_readers, again._touched) == (1 << 20, 64, {})
    assert again.get("ac/k") == b"v"
    old = dict(s.__getstate__())
    del old["max_bytes"]                               # a state written before budgets existed
    older = LMDBStore.__new__(LMDBStore)
    older.__setstate__(old)
    assert older == s and older.max_bytes is None


def test_fsspec_identity_is_its_url_and_pickles_its_options_as_before(tmp_path):
    opts = {"auto_mkdir": True}
    a = _fsspec(tmp_path, storage_options=opts, timeout_s=7)
    assert a == _fsspec(tmp_path) and a == FsspecStore(str(tmp_path / "a") + "/")
    a.fs                                               # a filesystem made in this process...
    state = a.__getstate__()
    assert state == {"url": a.url, "read_only": False, "storage_options": opts, "timeout_s": 7.0}
    again = pickle.loads(pickle.dumps(a))
    assert again._fs is None                           # ...is never pickled: made again where unpickled
    assert (again.storage_options, again.timeout_s) == (opts, 7.0)
    ro = a.with_read_only()
    assert (ro.storage_options, ro.timeout_s) == (opts, 7.0)


def test_tiered_identity_includes_read_only_and_local_only(tmp_path):
    a = _tiered(tmp_path)
    assert a != _tiered(tmp_path, read_only=True)        # before: equal, read_only was ignored
    assert a != _tiered(tmp_path, local_only=("src/",))  # before: equal, local_only was ignored
    assert _tiered(tmp_path, local_only=("src/",)) == _tiered(tmp_path, local_only=["src/"])
    assert a == _tiered(tmp_path, check=lambda k, v: None)   # the pull check is behaviour, not identity
    ro = a.with_read_only()
    assert ro.local.read_only and ro.shared.read_only and ro.local_only == a.local_only and ro.check is a.check
    assert repr(a) == f"TieredStore({a.local!r}, {a.shared!r}, ())"


def test_memory_identity_is_its_dict(tmp_path):
    data = {"ac/a": b"1"}
    a = MemoryStore(data)
    assert a == MemoryStore(data) and hash(a) == hash(MemoryStore(data))   # one dict: one store
    assert a != MemoryStore(dict(data)) and MemoryStore() != MemoryStore()   # equal contents are not the same store
    ro = a.with_read_only()
    assert ro != a and ro.with_read_only(False) == a and hash(ro.with_read_only(False)) == hash(a)
    assert repr(a) == "MemoryStore(<1 keys>)" and repr(ro) == "MemoryStore(<1 keys>, read_only=True)"
    again = pickle.loads(pickle.dumps(ro))             # a copy of the data: another store, as before
    assert again != ro and again._data == data and again.read_only
    t = TieredStore(MemoryStore(), MemoryStore())
    assert t.with_read_only().with_read_only(False) == t


def test_subclasses_are_other_types(tmp_path):
    class Traced(LMDBStore):
        pass
    t = Traced(tmp_path / "a")
    assert t != _lmdb(tmp_path) and repr(t).startswith("Traced(")
    assert type(t.with_read_only()) is Traced and t.with_read_only().with_read_only(False) == t
