"""``vidcache.store.prefetch.Prefetch``: a value read as a file while a background thread fetches it.  The
decoder must be able to start before the fetch ends, and a fetch that fails part-way must end the file
quietly and be raised by ``finish()``, so that a caller never takes a network failure for corrupt bytes."""
import threading

import pytest

from vidcache.digest import Digest, StreamingDigest
from vidcache.errors import SharedTimeoutError, SharedUnavailableError
from vidcache.store.memory import MemoryStore
from vidcache.store.prefetch import Prefetch


class Paced(MemoryStore):
    """Hands its value over in two halves, the second only once ``go`` is set (or gives up after 20 s),
    then ends with ``fail`` raised, if one is given."""

    def __init__(self, data, fail=None):
        super().__init__(data)
        self.go, self.fail, self.gave_up = threading.Event(), fail, False

    def stream(self, key, sink):
        value = self.get(key)
        if value is None:
            return False
        half = len(value) // 2
        sink(value[:half])
        self.gave_up = not self.go.wait(20)
        if self.fail is not None:
            raise self.fail
        sink(value[half:])
        return True


def read_all(f, n=4096):
    out = b""
    while piece := f.read(n):
        out += piece
    return out


def test_the_reader_gets_the_first_bytes_before_the_fetch_ends():
    store = Paced({"frozen/k.nut": bytes(range(256)) * 64})
    f = Prefetch(store, "frozen/k.nut")
    assert f.found()
    first = f.read(100)                       # while the second half is held back
    assert first == bytes(range(100)) and not store.gave_up
    store.go.set()
    assert first + read_all(f) == bytes(range(256)) * 64 and f.read(10) == b""
    f.finish()
    assert not store.gave_up


def test_read_with_no_size_takes_everything_that_has_come():
    f = Prefetch(MemoryStore({"cas/x": b"abcdef"}), "cas/x")
    assert f.read(2) == b"ab" and f.read() == b"cdef" and f.read() == b""


def test_absent_and_empty_are_told_apart():
    store = MemoryStore({"cas/empty": b""})
    assert Prefetch(store, "cas/missing").found() is False
    empty = Prefetch(store, "cas/empty")
    assert empty.found() is True and empty.read(10) == b""


def test_a_fetch_cut_off_part_way_ends_the_file_and_finish_raises_it():
    cut = SharedUnavailableError("shared tier s3://b/t is unreachable (get frozen/k.nut: reset)")
    store = Paced({"frozen/k.nut": b"x" * 1000}, fail=cut)
    f = Prefetch(store, "frozen/k.nut")
    assert f.found()
    store.go.set()
    assert read_all(f) == b"x" * 500              # what came, then an end: no error into the decoder
    with pytest.raises(SharedUnavailableError) as e:
        f.finish()
    assert e.value is cut


def test_the_hasher_is_fed_every_byte_in_order_and_a_cut_fetch_is_raised_before_it_is_read():
    value = bytes(range(256)) * 64
    store = Paced({"frozen/k.nut": value})
    f = Prefetch(store, "frozen/k.nut", hasher=StreamingDigest())
    store.go.set()
    read_all(f)
    f.finish()
    assert f.hasher.digest() == Digest.of(value)
    cut = Paced({"frozen/k.nut": value}, fail=SharedUnavailableError("reset"))
    g = Prefetch(cut, "frozen/k.nut", hasher=StreamingDigest())
    cut.go.set()
    with pytest.raises(SharedUnavailableError):      # half the bytes came: finish() says so before any check
        g.finish()
    assert g.hasher.size_bytes == len(value) // 2


def test_a_fetch_that_fails_before_any_byte_raises_from_found():
    class Down(MemoryStore):
        def stream(self, key, sink):
            raise SharedTimeoutError("shared tier s3://b/t: get frozen/k.nut got no answer in 60 s")
    f = Prefetch(Down(), "frozen/k.nut")
    with pytest.raises(SharedTimeoutError):
        f.found()
    assert f.read(10) == b""


def test_pieces_that_come_after_the_fetch_gave_up_are_not_read():
    late = []

    class Late(MemoryStore):
        def stream(self, key, sink):
            late.append(sink)
            raise SharedTimeoutError("gave up")
    f = Prefetch(Late(), "cas/x")
    with pytest.raises(SharedTimeoutError):
        f.finish()
    late[0](b"woke up late")                     # a transfer the timeout abandoned, still running
    assert f.read(100) == b""


class Counted(MemoryStore):
    """Hands its value over in pieces of ``piece`` bytes, counting those the sink took."""

    def __init__(self, data, piece):
        super().__init__(data)
        self.piece, self.taken = piece, 0

    def stream(self, key, sink):
        value = self.get(key)
        for i in range(0, len(value), self.piece):
            sink(value[i:i + self.piece])
            self.taken += 1
        return True


def _settles(store, want, wait_s=10.0):
    import time
    end = time.monotonic() + wait_s
    while store.taken < want and time.monotonic() < end:
        time.sleep(0.01)
    time.sleep(0.2)                                  # long enough for a fetch that is not held to go on
    return store.taken


def test_an_unbounded_fetch_runs_at_most_ahead_bytes_ahead_of_its_reader(monkeypatch):
    """Until its caller bounds it (the manifest, fetched beside it) a fetch holds at most ``AHEAD_BYTES`` unread:
    it streamed on into memory, so how much of a planted 512 MB object came before its bound depended on the
    machine's load (a flaky test), and a fetch whose read went another way streamed the whole object for no one.
    Reading makes room; a bound lets it run on."""
    from vidcache.store import prefetch
    monkeypatch.setattr(prefetch, "AHEAD_BYTES", 4096)
    value = bytes(range(256)) * 256                  # 64 kB: 64 pieces of 1 kB
    store = Counted({"cas/x": value}, 1024)
    f = Prefetch(store, "cas/x")
    assert _settles(store, 4) == 4                   # 4 kB unread: the fifth piece waits
    assert f.read(1024) == value[:1024]
    assert _settles(store, 5) == 5                   # one piece read, one more taken
    f.limit(len(value))                              # bounded: the rest comes without a reader
    assert _settles(store, 64) == 64
    assert value[:1024] + read_all(f) == value
    f.finish()


def test_a_reader_drains_an_unbounded_fetch_to_its_end(monkeypatch):
    from vidcache.store import prefetch
    monkeypatch.setattr(prefetch, "AHEAD_BYTES", 4096)
    value = bytes(range(256)) * 256
    f = Prefetch(Counted({"cas/x": value}, 1024), "cas/x")
    assert read_all(f, 700) == value
    f.finish()


def test_a_fetch_nobody_bounds_or_reads_ends_and_finish_says_so(monkeypatch):
    """A fetch abandoned by its caller (nothing bounds or reads it for ``ABANDON_S``) ends, its thread and
    connection with it; a caller that comes back later reads what came, and ``finish()`` names the abandonment,
    a tier error (never taken for a corrupt object)."""
    from vidcache.store import prefetch
    monkeypatch.setattr(prefetch, "AHEAD_BYTES", 4096)
    monkeypatch.setattr(prefetch, "ABANDON_S", 0.2)
    value = bytes(range(256)) * 256
    store = Counted({"cas/x": value}, 1024)
    f = Prefetch(store, "cas/x")
    assert _settles(store, 4) == 4
    with pytest.raises(SharedUnavailableError, match="cas/x was abandoned"):
        f.finish()
    assert store.taken == 4 and read_all(f) == value[:4096]
