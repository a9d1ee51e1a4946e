"""The local tier, ``vidcache.store.lmdb``: the store contract on an LMDB file, map growth, zero-copy reads,
fork and concurrent writers, the byte budget (LRU eviction, gc).  A damaged file: ``test_lmdb_damage.py``."""
import multiprocessing as mp
import os

import lmdb
import pytest

from vidcache.store.lmdb import LMDBStore
from vidcache.testing.store import PicklableStoreContract


def _raw_env(store, write=False):
    store.close()   # one environment per file per process (LMDB's rule); the store reopens lazily
    return lmdb.open(store.path, readonly=not write, max_dbs=1)


class TestLMDBStore(PicklableStoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        s = LMDBStore(tmp_path / "db", map_size=1 << 20)   # tiny map: growth is exercised by every test
        s.set_many({"meta/init": b""})                     # the medium exists for raw access
        s.delete("meta/init")
        yield s
        s.close()

    def raw_get(self, store, key):
        with _raw_env(store) as env, env.begin() as txn:
            return txn.get(key.encode())

    def raw_set(self, store, key, value):
        with _raw_env(store, write=True) as env, env.begin(write=True) as txn:
            txn.put(key.encode(), value)

    def test_map_grows_on_demand(self, store):
        big = os.urandom(5 << 20)
        store.set_many({"cas/big": big})
        assert self.raw_get(store, "cas/big") == big
        assert store.stats()["map_size"] > 1 << 20

    def test_read_is_zero_copy(self, store):
        """The view's bytes lie inside the process's memory map of the LMDB data file (/proc/self/maps): a copy
        into Python's heap, however read-only, lies elsewhere and fails this."""
        from pathlib import Path

        from vidcache.store.lmdb_env import DATA_FILE
        store.set_many({"cas/z": b"abc" * 1000})
        data = str((Path(store.path) / DATA_FILE).resolve())
        with store.read("cas/z") as v:
            assert isinstance(v, memoryview) and v.readonly and bytes(v) == b"abc" * 1000
            addr = _address(v)
            maps = [ln.split() for ln in Path("/proc/self/maps").read_text().splitlines()]
            inside = [m for m in maps if len(m) >= 6 and m[5] == data
                      and int(m[0].split("-")[0], 16) <= addr < int(m[0].split("-")[1], 16)]
            assert inside, f"the view at {addr:#x} is not in a mapping of {data}"


def _address(view: memoryview) -> int:
    """The address of a (read-only) buffer's first byte, through NumPy's array interface (no copy)."""
    import numpy as np
    return np.frombuffer(view, dtype=np.uint8).__array_interface__["data"][0]


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
    assert s.get("ac/k") == b"parent"          # the same object keeps working in the parent after the fork


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


def test_an_open_that_meets_a_map_another_process_grew_opens_again(tmp_path, monkeypatch):
    """The race the test above met once on a loaded CI machine: lmdb.open's first transaction saw the map grown
    by another writer (MDB_MAP_RESIZED).  The open is retried at the file's new size, not raised."""
    path = str(tmp_path / "db")
    first = lmdb.open(path, map_size=1 << 20)          # an existing file, not held by this process's registry
    with first.begin(write=True) as txn:
        txn.put(b"ac/x", b"1")
    first.close()
    from vidcache.store import lmdb_env
    real, calls = lmdb.open, []

    def racing(*a, **k):
        calls.append(1)
        if len(calls) == 1:
            raise lmdb.MapResizedError("mdb_txn_begin: MDB_MAP_RESIZED: Database contents grew beyond environment mapsize")
        return real(*a, **k)
    monkeypatch.setattr(lmdb_env.lmdb, "open", racing)
    env = lmdb_env.SharedEnv(path, False, 1 << 20, 126)
    with env.env.begin() as txn:
        assert txn.get(b"ac/x") == b"1"
    assert len(calls) == 2
    env.env.close()


# --- the local tier's byte budget -------------------------------------------------------------
def test_budget_evicts_least_recently_used_and_reuses_the_space(tmp_path):
    budget = 4 << 20
    s = LMDBStore(tmp_path / "db", max_bytes=budget)
    s.set_many({"cas/keep": os.urandom(256 << 10)})
    sizes = []
    for i in range(40):                         # 40 x 512 KiB = 20 MiB through a 4 MiB budget
        s.set_many({f"cas/{i:03d}": os.urandom(512 << 10)})
        assert s.get("cas/keep") is not None    # read often: never the least recently used
        assert s.used_bytes() <= budget
        sizes.append(os.path.getsize(os.path.join(s.path, "data.mdb")))
    present = [k for k in s.keys("cas/")]
    assert "cas/keep" in present and "cas/000" not in present and "cas/039" in present
    # LMDB never shrinks its file, but freed pages are reused: the file stops growing near the budget.
    assert sizes[-1] == sizes[20] and sizes[-1] < 2 * budget, sizes


def test_gc_down_to_a_budget(tmp_path):
    s = LMDBStore(tmp_path / "db")
    for i in range(10):
        s.set_many({f"cas/{i}": os.urandom(300 << 10)})
    before = s.used_bytes()
    out = s.gc(before // 2)
    assert out["evicted"] > 0 and s.used_bytes() <= before // 2
    assert s.gc(10 << 30)["evicted"] == 0      # within budget: nothing to do


@pytest.mark.parametrize("budget", [0, -1])
def test_a_budget_of_zero_or_below_is_refused(tmp_path, budget):
    from vidcache import VideoCache
    with pytest.raises(ValueError, match="max_bytes must be a positive"):
        LMDBStore(tmp_path / "db", max_bytes=budget)
    with pytest.raises(ValueError, match="max_local_bytes must be a positive"):
        VideoCache(tmp_path / "cache", max_local_bytes=budget)
    assert not (tmp_path / "db").exists() and not (tmp_path / "cache" / "lmdb").exists()


def test_a_budget_below_one_entry_warns_once(tmp_path, caplog):
    caplog.set_level("WARNING", logger="vidcache.store.lmdb")
    roomy = LMDBStore(tmp_path / "roomy", max_bytes=2 << 20)
    for i in range(8):                          # evicts older keys, never the one just written: no warning
        roomy.set_many({f"cas/{i}": os.urandom(512 << 10)})
    assert roomy.get("cas/7") is not None and roomy.get("cas/0") is None
    assert not caplog.records
    tight = LMDBStore(tmp_path / "tight", max_bytes=100_000)
    for i in range(3):                          # each write alone is over the budget: evicted at once
        tight.set_many({f"cas/{i}": os.urandom(300 << 10)})
        assert tight.get(f"cas/{i}") is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1, warned             # once per file, not per write
    assert "below one entry" in warned[0] and "100000 bytes" in warned[0] and "cas/0" in warned[0]


def _evict_all(path, q):
    s = LMDBStore(path)
    q.put(s.gc(1)["evicted"])


def test_eviction_while_another_process_reads_is_safe(tmp_path):
    s = LMDBStore(tmp_path / "db")
    payload = os.urandom(1 << 20)
    s.set_many({"cas/v": payload})
    ctx = mp.get_context("spawn")
    with s.read("cas/v") as view:               # a zero-copy view: an MVCC snapshot
        q = ctx.Queue()
        p = ctx.Process(target=_evict_all, args=(s.path, q))
        p.start()
        p.join(60)
        assert p.exitcode == 0 and q.get(timeout=5) >= 1
        assert bytes(view) == payload           # the reader still sees its snapshot, intact
    assert s.get("cas/v") is None               # a new read sees the eviction


def test_a_deleted_directory_is_not_served_from_a_stale_environment(tmp_path):
    import shutil
    p = tmp_path / "db"
    s = LMDBStore(p)
    s.set_many({"ac/a": b"1"})
    assert s.get("ac/a") == b"1"               # this process holds the environment open
    shutil.rmtree(p)
    again = LMDBStore(p)
    assert again.get("ac/a") is None            # not the deleted file's contents
    again.set_many({"ac/b": b"2"})
    assert (p / "data.mdb").exists() and again.get("ac/b") == b"2"     # writes land where anyone can see them


def test_a_staged_write_whose_commit_fills_the_map_is_dropped_not_retried(tmp_path):
    """``set_many_staged`` hands the caller's buffers back before the commit, so a commit that fills the map
    must not be retried with them (they may have changed): the map is grown and the write dropped, as a
    NoSpaceError (the backfill's "no local copy" case)."""
    from vidcache.errors import NoSpaceError
    s = LMDBStore(tmp_path / "l")
    handed = []

    def staged():
        handed.append(True)
        raise lmdb.MapFullError("mdb_txn_commit: MDB_MAP_FULL")     # what the commit after it would raise
    with pytest.raises(NoSpaceError, match="dropped"):
        s.set_many_staged({"cas/x": b"value"}, staged)
    assert handed == [True] and s.get("cas/x") is None
    s.set_many_staged({"cas/x": b"value"}, lambda: None)             # the grown map takes the next write
    assert s.get("cas/x") == b"value"


def test_reads_of_a_store_reopened_past_its_initial_map_size_record_their_touches(tmp_path):
    """Issue 50 (benchmarks/scale.py, 1,000 entries): a process that opens a store whose data file outgrew the
    initial map size gets a map exactly full; its reads' LRU touches, flushed every 256 reads, raised
    ``MapFullError`` out of ``get`` (``vidcache prewarm`` re-run died).  They grow the map as writes do."""
    path = tmp_path / "db"
    s = LMDBStore(path, map_size=1 << 20)
    s.set_many({f"cas/{i:04d}": os.urandom(4096) for i in range(600)})     # ~2.4 MB: the map grew past 1 MiB
    s.close()
    again = LMDBStore(path, map_size=1 << 20)
    for i in range(600):
        assert again.get(f"cas/{i:04d}") is not None
    again.close()


def test_gc_of_a_store_reopened_past_its_initial_map_size_evicts(tmp_path):
    """Issue 50 (benchmarks/scale.py, ``vidcache gc`` at 1,000 entries): gc's deletes in a map exactly full (a
    store reopened past its initial map size) raised ``MapFullError``; they grow the map as writes do."""
    path = tmp_path / "db"
    s = LMDBStore(path, map_size=1 << 20)
    s.set_many({f"cas/{i:04d}": os.urandom(4096) for i in range(600)})
    s.close()
    again = LMDBStore(path, map_size=1 << 20)
    out = again.gc(again.used_bytes() // 2)
    assert out["evicted"] > 0 and out["used_bytes"] <= again.used_bytes() + 1
    assert sum(again.get(f"cas/{i:04d}") is not None for i in range(600)) == 600 - out["evicted"]
    again.close()


def test_gc_holds_no_key_per_entry_and_evicts_the_oldest(tmp_path):
    """Issue 50: ``gc`` held every key's age and size (280 MB of private memory at 10^5 entries).  Now its memory is
    a histogram and a batch, whatever the store holds (traced Python allocations, 30,000 keys: the old code's
    dict and list of them took several MB), and what it evicts is still the least recently used."""
    import tracemalloc
    s = LMDBStore(tmp_path / "db")
    n = 30_000
    for start in range(0, n, 5_000):                 # written in order: key i is older than key i + 1
        s.set_many({f"cas/{i:06d}": b"x" * 1024 for i in range(start, start + 5_000)})
    s.get("cas/000000")                              # read now: the most recently used
    before = s.used_bytes()
    tracemalloc.start()
    try:
        out = s.gc(before // 2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out["evicted"] > n // 4 and s.used_bytes() <= before // 2
    assert peak < 1 << 20, f"gc traced {peak} bytes for {n} keys"
    left = list(s.keys("cas/"))
    assert "cas/000000" in left                      # read last: kept
    assert "cas/000001" not in left and f"cas/{n - 1:06d}" in left    # the oldest went, the newest stayed


def test_keys_holds_a_page_of_names_not_the_namespace(tmp_path):
    """Issue 50: ``keys`` read the whole namespace into a list before its first name (10^6 names at 10^6
    entries, each walk of ``stats`` and ``gc``).  Now it reads ``KEYS_PAGE`` names per read transaction: what the
    walk holds (traced Python allocations, 30,000 keys: the old list alone took ~2.5 MB) is one page, and the
    walk is still every key, in order, once."""
    from support.traced import first_and_peak
    s = LMDBStore(tmp_path / "db")
    n = 30_000
    s.set_many({f"ac/{i:06d}": b"m" for i in range(n)} | {"cas/0": b"b", "a/0": b"z"})
    first, it, peak = first_and_peak(lambda: s.keys("ac/"))
    assert first == "ac/000000"
    assert peak < 1 << 20, f"the first name of {n} cost {peak} traced bytes"
    assert [first, *it] == [f"ac/{i:06d}" for i in range(n)]


def test_keys_walks_every_page_while_the_walk_deletes(tmp_path, monkeypatch):
    """A walk that deletes the keys it is given (``Cache.gc``'s orphan manifests) sees every key once, across
    pages: each page starts at the first key the page before did not read."""
    from vidcache.store import lmdb as lmdb_store
    monkeypatch.setattr(lmdb_store, "KEYS_PAGE", 3)
    s = LMDBStore(tmp_path / "db")
    s.set_many({f"ac/{i:02d}": b"m" for i in range(10)} | {"b/0": b"x"})
    seen = []
    for k in s.keys("ac/"):
        seen.append(k)
        s.delete(k)
    assert seen == [f"ac/{i:02d}" for i in range(10)]
    assert list(s.keys("")) == ["b/0"]
