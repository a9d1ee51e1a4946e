"""The shared tier's store, ``vidcache.store.fsspec_cas``: the store contract on a directory and on memory://,
partial files, keys that try to leave the root, URLs.  Its failures (timeouts, refused and full tiers):
``tests/test_shared_failures.py``."""
import os
import uuid

import fsspec
import pytest

from vidcache.errors import InvalidKeyError
from vidcache.store.fsspec_cas import FsspecStore
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
