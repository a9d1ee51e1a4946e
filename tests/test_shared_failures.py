"""The shared tier's failures are bounded and clear (issue 18: D20, D21, D23, D25, D27).

Every call on the shared tier ends within a bound, and a refused, hung, read-only, forbidden or full tier
raises its own ``StoreError`` (its ``kind``, one line naming the tier).  A full local disk never fails a
sound shared value.  Local hits never touch the shared tier.  Bounds asserted here are generous: they
tell "ended" from "hung", never measure speed.
"""
import errno
import logging
import os
import pickle
import subprocess
import threading
import time
import uuid

import lmdb
import pytest
import torch

from vidcache.errors import (ConfigError, NoSpaceError, PermissionDeniedError, ReadOnlyFilesystemError,
                             ReadOnlyStoreError, SharedTimeoutError, SharedUnavailableError, StoreError)
from vidcache import errors
from vidcache.store import directory as store_directory
from vidcache.store import fsspec as store_fsspec
from vidcache.store.fsspec import FsspecStore
from vidcache.store.s3 import s3_storage_options
from vidcache.store.lmdb import LMDBStore
from vidcache.store.memory import MemoryStore
from vidcache.store.tiered import TieredStore, out_of_space

from support.net import free_port
from support.cli import run_cli

S3_OPTS = {"client_kwargs": {"region_name": "us-east-1"}}


def _s3_store(endpoint, **kw):
    # A prefix of its own: moto's state is per process, shared by every test's server.
    return FsspecStore(f"s3://cache/failures-{uuid.uuid4().hex}", storage_options={"endpoint_url": endpoint,
                                                                                    **S3_OPTS}, **kw)


def _assert_clear(e, cls, kind, url):
    """The specific class and kind, one line naming the tier, and no raw traceback chained to it."""
    assert isinstance(e, cls) and e.kind == kind, (type(e), e)
    msg = str(e)
    assert url in msg and "\n" not in msg, msg
    assert e.__cause__ is None and e.__suppress_context__


@pytest.fixture
def dummy_credentials(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


@pytest.fixture
def refused(dummy_credentials):
    """An S3 endpoint nobody listens on: every connection is refused."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def hung(dummy_credentials, hung_endpoint):
    """An S3 endpoint that accepts connections and never answers."""
    return hung_endpoint


@pytest.fixture
def tiny_disk(tmp_path):
    """A 2 MiB tmpfs (needs root and mount); skipped where it cannot be mounted."""
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d)], capture_output=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _fill(d):
    """Fill the filesystem of ``d`` to the last block."""
    with open(os.path.join(d, "filler"), "wb", buffering=0) as f:
        for chunk in (65536, 4096, 512):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC


# --- S3: defaults that bound every request -----------------------------------------------------------------
def test_s3_requests_get_bounded_timeouts_and_retries_unless_the_user_sets_them():
    opts = s3_storage_options({"endpoint_url": "http://x"})
    assert opts["endpoint_url"] == "http://x"
    cfg = opts["config_kwargs"]
    assert cfg["connect_timeout"] > 0 and cfg["read_timeout"] > 0
    assert cfg["retries"]["total_max_attempts"] <= 5
    mine = s3_storage_options({"config_kwargs": {"read_timeout": 99, "retries": {"max_attempts": 1}}})
    assert mine["config_kwargs"]["read_timeout"] == 99 and mine["config_kwargs"]["retries"] == {"max_attempts": 1}
    assert mine["config_kwargs"]["connect_timeout"] == cfg["connect_timeout"]
    # ... and they reach the filesystem the store talks to; the user's options are kept as given
    store = _s3_store("http://127.0.0.1:1")
    assert store.fs.config_kwargs["read_timeout"] == cfg["read_timeout"]
    assert "config_kwargs" not in store.storage_options


def test_s3_round_trip_through_the_bounded_calls(s3):
    store = _s3_store(s3.endpoint)
    store.set_many({"cas/a": b"blob"})
    assert store.get("cas/a") == b"blob" and store.get("cas/b") is None
    assert store.exists_many(["cas/a", "cas/b"]) == [True, False] and store.size("cas/a") == 4
    assert store.set_if_not_exists("meta/tier", b"1") is True
    assert store.set_if_not_exists("meta/tier", b"2") is False and store.get("meta/tier") == b"1"
    assert list(store.keys()) == ["cas/a", "meta/tier"]
    store.delete("cas/a")
    assert store.get("cas/a") is None
    # S3 PUTs are atomic per object: the store declares no partial files to sweep, and asking is an error
    assert type(store).__name__ == "S3Store" and not store.supports_partial_sweep
    with pytest.raises(NotImplementedError):
        store.sweep_partials()


# --- D21: an S3 outage is bounded and named --------------------------------------------------------------
@pytest.mark.parametrize("call", ["get", "exists", "size", "put", "put_once", "keys"])
def test_refused_endpoint_is_shared_unavailable(refused, call):
    store = _s3_store(refused)
    t0 = time.monotonic()
    with pytest.raises(SharedUnavailableError) as ei:
        {"get": lambda: store.get("cas/x"),
         "exists": lambda: store.exists_many(["cas/x"]),      # never a silent False: an outage is not a miss
         "size": lambda: store.size("cas/x"),
         "put": lambda: store.set_many({"cas/x": b"1"}),
         "put_once": lambda: store.set_if_not_exists("meta/tier", b"1"),
         "keys": lambda: list(store.keys())}[call]()
    assert time.monotonic() - t0 < 30             # botocore's defaults took 8-13 s; the probe saw up to 16
    _assert_clear(ei.value, SharedUnavailableError, "shared_unavailable", store.url)
    assert isinstance(ei.value, ConnectionError) and not isinstance(ei.value, TimeoutError)


@pytest.mark.parametrize("call", ["get", "put"])
def test_hung_endpoint_ends_at_the_time_limit(hung, call):
    # Unbounded before: a PUT to an endpoint that never answers waited for minutes, with any read_timeout.
    store = _s3_store(hung, timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(SharedTimeoutError) as ei:
        store.get("cas/x") if call == "get" else store.set_many({"cas/x": b"1"})
    assert time.monotonic() - t0 < 20
    _assert_clear(ei.value, SharedTimeoutError, "shared_timeout", store.url)
    assert isinstance(ei.value, TimeoutError) and isinstance(ei.value, SharedUnavailableError)
    assert store_fsspec.ENV_TIMEOUT in str(ei.value)       # the fix for a slow (not dead) tier


def test_s3_access_denied_is_permission_denied(dummy_credentials, monkeypatch):
    store = _s3_store("http://127.0.0.1:1")

    def denied(*a, **kw):          # what s3fs raises for S3's AccessDenied / 403
        raise PermissionError("Access Denied")
    monkeypatch.setattr(store.fs, "cat_file", denied)
    with pytest.raises(PermissionDeniedError) as ei:
        store.get("cas/x")
    _assert_clear(ei.value, PermissionDeniedError, "permission_denied", store.url)


# --- a hung NFS server: the directory tier ends at its time limit ------------------------------------------
def test_hung_directory_tier_ends_at_the_time_limit(tmp_path, monkeypatch):
    store = FsspecStore(str(tmp_path / "shared"), timeout_s=1)
    store.set_many({"cas/a": b"blob"})
    release = threading.Event()

    def stuck(*a, **kw):           # a read on a hard-mounted NFS export whose server stopped answering
        release.wait(60)
        raise OSError(errno.EIO, "late")
    # A directory tier opens its objects itself (never through a symlink, D33): the open is what hangs.
    monkeypatch.setattr(store_directory, "_open_object", stuck)
    try:
        t0 = time.monotonic()
        with pytest.raises(SharedTimeoutError) as ei:
            store.get("cas/a")
        assert time.monotonic() - t0 < 15
        _assert_clear(ei.value, SharedTimeoutError, "shared_timeout", str(tmp_path / "shared"))
    finally:
        release.set()


def test_time_limit_setting(monkeypatch, tmp_path):
    monkeypatch.setenv(store_fsspec.ENV_TIMEOUT, "7.5")
    store = FsspecStore(str(tmp_path))
    assert store.timeout_s == 7.5
    assert pickle.loads(pickle.dumps(store)).timeout_s == 7.5 and store.with_read_only().timeout_s == 7.5
    assert FsspecStore(str(tmp_path), timeout_s=3).timeout_s == 3
    for bad in ("0", "-1", "nan", "inf", "soon"):
        monkeypatch.setenv(store_fsspec.ENV_TIMEOUT, bad)
        with pytest.raises(ConfigError):
            FsspecStore(str(tmp_path))


# --- D27: read-only, forbidden ---------------------------------------------------------------------------
# Running as root, chmod does not stop us and bind mounts are not available: the filesystem's answer is
# simulated at the call the store makes (publish_bytes for writes, the fs for reads).
@pytest.mark.parametrize("err, cls, kind", [
    (OSError(errno.EROFS, "Read-only file system"), ReadOnlyFilesystemError, "read_only_fs"),
    (PermissionError(errno.EACCES, "Permission denied"), PermissionDeniedError, "permission_denied"),
    (OSError(errno.ENOSPC, "No space left on device"), NoSpaceError, "no_space"),
    (OSError(errno.EIO, "Input/output error"), StoreError, "store"),
])
def test_directory_write_failures_are_named(tmp_path, monkeypatch, err, cls, kind):
    store = FsspecStore(str(tmp_path / "shared"))

    def fail(*a, **kw):
        raise err
    monkeypatch.setattr(store_directory, "publish_bytes", fail)
    for write in (lambda: store.set_many({"cas/x": b"1"}), lambda: store.set_if_not_exists("meta/tier", b"1")):
        with pytest.raises(cls) as ei:
            write()
        _assert_clear(ei.value, cls, kind, str(tmp_path / "shared"))
    if kind == "read_only_fs":
        assert isinstance(ei.value, ReadOnlyStoreError)    # what callers already catch for a read-only store
    if kind == "permission_denied":
        assert isinstance(ei.value, PermissionError)


def test_directory_read_denied_is_named_and_a_miss_is_still_a_miss(tmp_path, monkeypatch):
    store = FsspecStore(str(tmp_path / "shared"))
    assert store.get("cas/x") is None and store.exists_many(["cas/x"]) == [False] and store.size("cas/x") is None

    def denied(*a, **kw):
        raise PermissionError(errno.EACCES, "Permission denied")
    monkeypatch.setattr(store.fs, "info", denied)
    with pytest.raises(PermissionDeniedError):          # fs.isfile would have answered False
        store.exists_many(["cas/x"])


# --- D23: a full shared tier is no_space (a real full filesystem) ------------------------------------------
def test_full_directory_tier_is_no_space_and_leaves_no_partial(tiny_disk):
    store = FsspecStore(str(tiny_disk / "shared"))
    with pytest.raises(NoSpaceError) as ei:
        store.set_many({"cas/big": os.urandom(3 << 20)})
    _assert_clear(ei.value, NoSpaceError, "no_space", str(tiny_disk / "shared"))
    assert store.get("cas/big") is None and store.usage()["partial_files"] == 0


# --- local hits never touch the shared tier --------------------------------------------------------------
def test_local_hits_work_while_the_shared_tier_is_refused(tmp_path, refused):
    t = TieredStore(LMDBStore(tmp_path / "l"), _s3_store(refused))
    t.local.set_many({"cas/a": b"blob", "ac/m": b"manifest"})
    t0 = time.monotonic()
    assert t.get("cas/a") == b"blob"
    with t.read("ac/m") as v:
        assert bytes(v) == b"manifest"
    assert t.exists_many(["cas/a", "ac/m"]) == [True, True] and t.size("cas/a") == 4
    assert time.monotonic() - t0 < 5        # one refused attempt takes about a second: none was made
    with pytest.raises(SharedUnavailableError):   # a key not held locally: the outage, never a miss
        t.get("cas/b")


# --- D20: a full local disk serves sound shared values ---------------------------------------------------
@pytest.fixture
def warned(monkeypatch, caplog):
    monkeypatch.setattr(errors, "_WARNED", set())      # errors.warn_once: once per process
    caplog.set_level(logging.WARNING, logger="vidcache")
    return lambda: [r for r in caplog.records if "out of space" in r.getMessage()]


def test_full_local_disk_serves_shared_values_without_backfill(tiny_disk, tmp_path, warned):
    local = LMDBStore(tiny_disk / "l")
    local.set_many({"cas/small": b"s"})
    _fill(tiny_disk)
    values = {f"cas/{i}": os.urandom(512 << 10) for i in range(3)}
    t = TieredStore(local, FsspecStore(str(tmp_path / "shared")))
    t.shared.set_many(values)
    for k, v in values.items():
        assert t.get(k) == v
        with t.read(k) as view:
            assert bytes(view) == v
    assert len(warned()) == 1                       # once per process, not once per read
    assert "out of space" in warned()[0].getMessage()


class _FullLocal(MemoryStore):
    """A local tier whose writes fail as a full disk does."""

    def __init__(self, err):
        super().__init__()
        self.err = err

    def set_many(self, items):
        raise self.err

    def set_if_not_exists(self, key, value):
        raise self.err


@pytest.mark.parametrize("err", [
    lmdb.MapFullError("mdb_put: MDB_MAP_FULL: Environment mapsize limit reached"),
    lmdb.DiskError("mdb_txn_commit: No space left on device"),
    OSError(errno.ENOSPC, "No space left on device"),
    NoSpaceError("local tier is full"),
])
def test_backfill_out_of_space_is_skipped(err, warned):
    t = TieredStore(_FullLocal(err), MemoryStore({"cas/x": b"sound"}))
    assert t.get("cas/x") == b"sound"
    with t.read("cas/x") as v:
        assert bytes(v) == b"sound"
    t.set_many({"cas/y": b"published"})             # published: the local copy is a convenience
    assert t.shared.get("cas/y") == b"published"
    assert t.set_if_not_exists("cas/z", b"once") is True
    assert len(warned()) == 1


@pytest.mark.parametrize("err", [lmdb.Error("mdb_txn_commit: Input/output error"),   # EIO, with room left
                                 lmdb.CorruptedError("mdb_get: MDB_CORRUPTED"), RuntimeError("bug")])
def test_other_local_failures_still_fail(err, warned, tmp_path):
    local = _FullLocal(err)
    local.path = str(tmp_path)                      # a disk with room: EIO here is not a full disk
    t = TieredStore(local, MemoryStore({"cas/x": b"sound"}))
    with pytest.raises(type(err)):
        t.get("cas/x")
    assert not warned()


def test_out_of_space_reads_the_error_it_was_raised_from():
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as e:
            raise StoreError("local write failed") from e
    except StoreError as wrapped:
        assert out_of_space(wrapped)
    assert not out_of_space(StoreError("other"))


# --- D25: partial files of killed writers are swept --------------------------------------------------------
def test_sweep_removes_old_partials_only(tmp_path):
    store = FsspecStore(str(tmp_path / "shared"))
    store.set_many({"cas/a": b"blob", "ac/m": b"manifest"})
    d = os.path.dirname(store._path("cas/b"))
    os.makedirs(d, exist_ok=True)
    old, young = os.path.join(d, ".b.1111.partial"), os.path.join(d, ".b.2222.partial")
    for p in (old, young):
        with open(p, "wb") as f:
            f.write(b"half")
    two_hours_ago = time.time() - 7200
    os.utime(old, (two_hours_ago, two_hours_ago))
    assert store.usage()["partial_files"] == 2
    assert store.sweep_partials() == {"partial_files_removed": 1, "partial_bytes_removed": 4}
    assert not os.path.exists(old) and os.path.exists(young)       # perhaps another node's live write
    assert list(store.keys()) == ["ac/m", "cas/a"] and store.get("cas/a") == b"blob"
    assert store.sweep_partials(older_than_s=0) == {"partial_files_removed": 1, "partial_bytes_removed": 4}
    assert store.usage()["partial_files"] == 0
    with pytest.raises(ReadOnlyStoreError):
        store.with_read_only().sweep_partials()


def test_a_node_serves_what_it_holds_while_its_shared_tier_is_down(tmp_path, s3, videos, monkeypatch):
    """D21 at the cache: a node that once read its tier's identity keeps serving its own entries, the plugin's
    path (``cache_for(identity)``) included, while the S3 endpoint refuses every connection; a node that
    never read it gets the specific error, never a hang."""
    import vidcache
    from vidcache import VideoCache, VideoOptions
    from vidcache.node import cache_for
    shared = "s3://cache/" + uuid.uuid4().hex
    up = {"endpoint_url": s3.endpoint, **S3_OPTS}
    a = VideoCache(tmp_path / "a", shared=shared, shared_storage_options=up)
    h = vidcache.get(videos["mjpeg_24"], VideoOptions(), a)
    want, ident = h.frames(), a.identity
    monkeypatch.setenv(store_fsspec.ENV_TIMEOUT, "5")
    down = {"endpoint_url": f"http://127.0.0.1:{free_port()}", **S3_OPTS}
    again = VideoCache(tmp_path / "a", shared=shared, shared_storage_options=down)      # a new process's view
    assert again.identity == ident and torch.equal(again.frames(h.key), want)
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "a"))
    monkeypatch.setenv("VIDCACHE_SHARED", shared)
    assert torch.equal(vidcache.from_key(h.key, again).frames(), want)
    assert cache_for(ident) is again                        # what the plugin resolves a reference through
    with pytest.raises(SharedUnavailableError):
        VideoCache(tmp_path / "fresh", shared=shared, shared_storage_options=down).identity


@pytest.mark.parametrize("endpoint_kind", ["refused", "hung"])
def test_every_command_is_bounded_and_named_when_the_s3_tier_is_down(tmp_path, request, endpoint_kind, videos):
    """D21 from the CLI, on a fresh node with nothing but VIDCACHE_DIR + VIDCACHE_SHARED (and the endpoint, as
    a user sets it): stats, verify and prewarm end with one [shared_*] line, no traceback, within a bound."""
    endpoint = request.getfixturevalue(endpoint_kind)
    ds = tmp_path / "d.jsonl"
    ds.write_text('{"prompt": "<video>", "videos": ["%s"]}\n' % videos["mjpeg_24"])
    env = {"FSSPEC_S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1", store_fsspec.ENV_TIMEOUT: "3"}
    for args in (["stats"], ["verify", "--shared"], ["prewarm", str(ds)]):
        t = time.monotonic()
        r = run_cli(args, tmp_path / "node", "s3://cache/down", env=env, timeout=240)
        took = time.monotonic() - t
        assert r.returncode == 1 and "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        assert "vidcache: error: [shared_" in r.stderr, (args, r.stderr[-2000:])
        assert took < 120, (args, took)            # bounded: 3 s per call, a few calls, plus start-up


def test_a_full_local_disk_fails_prewarm_rows_as_no_space(tiny_disk, tmp_path, videos):
    """D23: ENOSPC on the node's own disk is its own kind, not `internal` or a bare `store` error."""
    import json as _json
    from vidcache import VideoCache, VideoOptions
    from vidcache.prewarming import prewarm
    ds = tmp_path / "d.jsonl"
    ds.write_text("".join(_json.dumps({"prompt": "<video>", "videos": [videos[n]]}) + "\n"
                          for n in ("h264_30", "mjpeg_24", "hevc_25")))
    s = prewarm(str(ds), VideoCache(tiny_disk / "node"), VideoOptions(), progress=False)
    kinds = {f["kind"] for f in s.failures}
    assert s.failed >= 1 and kinds == {"no_space"}, s.failures
