"""The shared tier's store, ``vidcache.store.fsspec``: the store contract on a directory and on memory://,
partial files, keys that try to leave the root, URLs.  Its failures (timeouts, refused and full tiers):
``tests/test_shared_failures.py``."""
import os
import uuid

import fsspec
import pytest

from vidcache.errors import InvalidKeyError
from vidcache.store.fsspec import FsspecStore
from vidcache.testing.store import PicklableStoreContract, StoreContract


class _FsspecMedium:
    """Raw access through the filesystem itself, at the path layout the store documents."""

    def _raw_path(self, store, key):
        return store._path(key)

    def raw_get(self, store, key):
        fs = fsspec.core.url_to_fs(store.url)[0]
        try:
            return fs.cat_file(self._raw_path(store, key))
        except FileNotFoundError:
            return None

    def raw_set(self, store, key, value):
        fs = fsspec.core.url_to_fs(store.url)[0]
        path = self._raw_path(store, key)
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(path, value)


class TestFsspecStoreLocalDir(_FsspecMedium, PicklableStoreContract):
    @pytest.fixture
    def store(self, tmp_path):
        return FsspecStore(str(tmp_path / "shared"))

    def test_leftover_partial_files_are_invisible(self, store):
        store.set_many({"cas/abc": b"1"})
        d = os.path.dirname(store._path("cas/def"))
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, ".def.1234.partial"), "wb").write(b"half")
        assert list(store.keys("cas/")) == ["cas/abc"] and store.get("cas/def") is None

    @pytest.mark.parametrize("key", ["cas/../../etc/passwd", "ac/a/b", "/abs", "cas/", "ac/x\x00y", "cas/..",
                                     "noslash"])
    def test_keys_never_leave_the_root(self, store, key):
        with pytest.raises(InvalidKeyError):
            store.get(key)

    def test_file_urls(self, store):
        store.set_many({"frozen/k.nut": b"frames"})
        url = store.url_for("frozen/k.nut")
        assert store.supports_urls and url.startswith("file:///")
        from urllib.parse import unquote, urlparse
        assert open(unquote(urlparse(url).path), "rb").read() == b"frames"


class TestFsspecStoreMemoryFS(_FsspecMedium, StoreContract):
    @pytest.fixture
    def store(self):
        return FsspecStore(f"memory://vidcache-{uuid.uuid4().hex}")

    def test_no_urls(self, store):
        assert not store.supports_urls
        with pytest.raises(NotImplementedError):
            store.url_for("frozen/x.nut")


def test_an_s3_object_streams_in_pieces_from_one_get(s3):
    """``stream`` on S3 hands the GET's body on as it arrives: several pieces for a 3 MB object, joined
    exactly; an absent key is False, not an error."""
    store = FsspecStore("s3://cache/st", storage_options={"endpoint_url": s3.endpoint,
                                                          "client_kwargs": {"region_name": "us-east-1"}})
    value = os.urandom(3 << 20) + b"tail"
    store.set_many({"cas/big": value})
    pieces = []
    assert store.stream("cas/big", pieces.append) is True
    assert b"".join(pieces) == value and len(pieces) > 1
    assert store.stream("cas/none", pieces.append) is False


def test_an_oversized_s3_object_is_refused_before_its_body_is_read(s3):
    """D33: the GET's Content-Length is checked before a byte of its body is handed on."""
    from vidcache.errors import OversizedObjectError
    store = FsspecStore("s3://cache/big", max_object_bytes=1 << 20,
                        storage_options={"endpoint_url": s3.endpoint, "client_kwargs": {"region_name": "us-east-1"}})
    store.set_many({"cas/big": bytes(3 << 20), "cas/small": b"fits"})
    with pytest.raises(OversizedObjectError, match=str(3 << 20)):
        store.stream("cas/big", lambda piece: pytest.fail("a byte of it was handed on"))
    pieces = []
    assert store.stream("cas/small", pieces.append) and b"".join(pieces) == b"fits"


@pytest.fixture
def cut_endpoint(monkeypatch):
    """An S3-like endpoint on loopback that serves one object, ``VALUE``, and drops the connection after the
    first ``CUT`` bytes of a GET; a resumed GET (a Range) is served in full when ``resume`` is set, and
    dropped before its first byte otherwise."""
    import http.server
    import socket
    import threading
    from types import SimpleNamespace
    state = SimpleNamespace(value=os.urandom(3 << 20), cut=1 << 20, resume=True, ranges=[])

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            rng = self.headers.get("Range")
            state.ranges.append(rng)
            start = int(rng.split("=")[1].rstrip("-")) if rng else 0
            rest = state.value[start:]
            self.send_response(206 if rng else 200)
            self.send_header("Content-Length", str(len(rest)))
            self.send_header("ETag", '"v1"')
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{len(state.value) - 1}/{len(state.value)}")
            self.end_headers()
            if rng and state.resume:
                self.wfile.write(rest)
                return
            self.wfile.write(b"" if rng else rest[:state.cut])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)

        def log_message(self, *args):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    state.store = FsspecStore("s3://cache/t", storage_options={
        "endpoint_url": f"http://127.0.0.1:{srv.server_address[1]}", "client_kwargs": {"region_name": "us-east-1"}})
    yield state
    srv.shutdown()
    srv.server_close()


def test_an_s3_stream_cut_off_part_way_resumes_where_it_stopped(cut_endpoint):
    """As s3fs retries a GET that broke, a stream resumes: a ranged GET from the first missing byte (If-Match
    the same object), so the sink gets every byte once, in order."""
    pieces = []
    assert cut_endpoint.store.stream("cas/x", pieces.append) is True
    assert b"".join(pieces) == cut_endpoint.value
    assert cut_endpoint.ranges == [None, f"bytes={cut_endpoint.cut}-"]


def test_an_s3_stream_that_keeps_breaking_is_the_tier_s_failure_not_a_short_object(cut_endpoint):
    from vidcache.errors import SharedUnavailableError
    cut_endpoint.resume = False
    pieces = []
    with pytest.raises(SharedUnavailableError, match="unreachable"):
        cut_endpoint.store.stream("cas/x", pieces.append)
    assert len(cut_endpoint.ranges) == cut_endpoint.store.fs.retries          # s3fs's own retry budget
    assert b"".join(pieces) == cut_endpoint.value[:len(b"".join(pieces))]     # what came was in order


def test_one_store_class_per_medium_chosen_by_the_url(tmp_path):
    """``FsspecStore(url)`` opens the store of the URL's medium (``store_class``, the one place it is chosen):
    a directory, S3, or any other fsspec filesystem; a named subclass, a read-only opening and an unpickled copy
    keep their class."""
    import pickle

    from vidcache.store import DirectoryStore, S3Store
    from vidcache.store.fsspec import store_class
    assert type(FsspecStore(str(tmp_path / "d"))) is DirectoryStore
    assert type(FsspecStore("file://" + str(tmp_path / "d"))) is DirectoryStore
    assert type(FsspecStore("s3://bucket/prefix")) is S3Store and store_class("s3a://b/p") is S3Store
    generic = FsspecStore(f"memory://medium-{uuid.uuid4().hex}")
    assert type(generic) is FsspecStore and not generic.supports_urls and not generic.supports_partial_sweep
    d = DirectoryStore(str(tmp_path / "d"))
    assert type(d.with_read_only()) is DirectoryStore and type(pickle.loads(pickle.dumps(d))) is DirectoryStore
    assert d == FsspecStore(str(tmp_path / "d")) and d.supports_urls and d.exclusive_create


def test_usage_of_a_directory_tier_holds_one_fan_out_directory_not_the_tier(tmp_path, monkeypatch):
    """Issue 50: ``stats`` behind a directory tier held the tier's whole listing (fsspec's ``find``, one dict of
    every object: 283 MB at 10^5 entries).  Its usage now lists a fan-out directory at a time: it never calls
    ``find``, no listing it asks for holds more than a directory, and its counts are every object's (a partial
    file and a stray file outside the layout counted as before)."""
    store = FsspecStore(str(tmp_path / "tier"))
    store.set_many({f"cas/{i:04d}": b"x" * i for i in range(600)} | {f"ac/{i}": b"m" for i in range(50)})
    fan = os.path.dirname(store._path("cas/0007"))
    with open(os.path.join(fan, ".0007.partial.x"), "wb") as f:       # a killed writer's leftover
        f.write(b"pp")
    with open(os.path.join(str(tmp_path / "tier"), "cas", "stray"), "wb") as f:   # not namespace/fan-out/name
        f.write(b"s")
    fs = store.fs
    sizes = []
    real_ls = fs.ls

    def ls(path, *a, **k):
        out = real_ls(path, *a, **k)
        sizes.append(len(out))
        return out
    monkeypatch.setattr(fs, "find", lambda *a, **k: pytest.fail("usage listed the whole tier with find"))
    monkeypatch.setattr(fs, "ls", ls)
    u = store.usage()
    assert u["objects"] == {"cas": 600, "ac": 50}
    assert u["bytes"] == sum(range(600)) + 50
    assert (u["partial_files"], u["partial_bytes"]) == (1, 2)
    assert max(sizes) <= 257, f"a listing of {max(sizes)} entries: more than one directory's"


def test_keys_of_a_directory_tier_walk_it_a_fan_out_directory_at_a_time(tmp_path, monkeypatch):
    """Issue 50: a directory tier's ``keys`` (``ls``, and ``stats``' counts) held fsspec's ``find`` listing of
    every object's details before sorting the names.  It walks the fan-out directories now: no ``find``, no
    listing larger than a directory, the same names, sorted, under a namespace prefix only that namespace's
    directories listed, and no partial file or stray file among them."""
    store = FsspecStore(str(tmp_path / "tier"))
    store.set_many({f"cas/{i:04d}": b"x" for i in range(600)} | {f"ac/{i:03d}": b"m" for i in range(50)})
    fan = os.path.dirname(store._path("ac/007"))
    with open(os.path.join(fan, ".007.partial.x"), "wb") as f:
        f.write(b"pp")
    with open(os.path.join(str(tmp_path / "tier"), "ac", "stray"), "wb") as f:
        f.write(b"s")
    listed = []
    real_ls = store.fs.ls

    def ls(path, *a, **k):
        out = real_ls(path, *a, **k)
        listed.append((path, len(out)))
        return out
    monkeypatch.setattr(store.fs, "find", lambda *a, **k: pytest.fail("keys listed the whole tier with find"))
    monkeypatch.setattr(store.fs, "ls", ls)
    assert list(store.keys("ac/")) == [f"ac/{i:03d}" for i in range(50)]
    assert listed and all("/cas" not in p for p, _ in listed), "a namespace's keys listed another namespace"
    assert list(store.keys("ac/01")) == [f"ac/{i:03d}" for i in range(10, 20)]
    assert list(store.keys()) == sorted([f"cas/{i:04d}" for i in range(600)] + [f"ac/{i:03d}" for i in range(50)])
    assert max(n for _, n in listed) <= 257, "a listing of more than one directory"
