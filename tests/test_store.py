import multiprocessing as mp
import os

import lmdb
import pytest

from vidcache.store.lmdb import LMDBStore
from vidcache.store.memory import MemoryStore
from vidcache.testing.store import PicklableStoreContract, StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self):
        return MemoryStore()

    @pytest.fixture
    def read_only_store(self):
        def make(s):
            ro = MemoryStore(read_only=True)
            ro._data = s._data
            return ro
        return make


class TestLMDBStore(PicklableStoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        s = LMDBStore(tmp_path / "db", map_size=1 << 20)   # tiny map: growth is exercised by every test
        yield s
        s.close()

    @pytest.fixture
    def read_only_store(self):
        def make(s):
            s.close()
            return LMDBStore(s.path, read_only=True)
        return make

    def raw_get(self, store, key):
        store.close()   # one environment per file per process (LMDB's rule); the store reopens lazily
        with lmdb.open(store.path, readonly=True) as env, env.begin() as txn:
            return txn.get(key.encode())

    def test_map_grows_on_demand(self, store):
        big = os.urandom(5 << 20)
        store.set_many({"cas/big": big})
        assert store.get("cas/big") == big
        assert store.stats()["map_size"] > 1 << 20

    def test_read_is_zero_copy(self, store):
        store.set_many({"cas/z": b"abc" * 1000})
        with store.read("cas/z") as v:
            assert isinstance(v, memoryview) and v.readonly


def _child_reads(path, q):
    q.put(LMDBStore(path).get("ac/k"))


def _child_writes(path, i, n):
    s = LMDBStore(path, map_size=1 << 16)
    for j in range(n):
        s.set_many({f"cas/{i}-{j}": os.urandom(20000), f"ac/{i}-{j}": b"m"})


def test_store_used_before_fork_works_in_child(tmp_path):
    s = LMDBStore(tmp_path / "db")
    s.set_many({"ac/k": b"parent"})
    assert s.get("ac/k") == b"parent"          # the parent's environment is open now
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_reads, args=(s.path, q))
    p.start()
    p.join(30)
    assert q.get(timeout=5) == b"parent"
    s2 = s                                     # the same object keeps working in the parent after the fork
    assert s2.get("ac/k") == b"parent"


def test_concurrent_writers_grow_one_map(tmp_path):
    path = str(tmp_path / "db")
    LMDBStore(path, map_size=1 << 16).set_many({"ac/init": b"1"})
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_child_writes, args=(path, i, 15)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    s = LMDBStore(path)
    assert len(list(s.keys("cas/"))) == 45 and len(list(s.keys("ac/"))) == 46
