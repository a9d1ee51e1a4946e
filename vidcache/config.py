"""A node's cache configuration, and the store tiers it assembles.

A node is configured by two settings, as environment variables, CLI flags or
``VideoCache`` arguments:

  ``VIDCACHE_DIR``     node-local: the LMDB tier and local frozen-file copies.  Never on NFS.
  ``VIDCACHE_SHARED``  the cluster's shared tier: an NFS path, ``s3://bucket/prefix`` or any fsspec URL.

What crosses a node boundary names the cache by its identity, never by either path: ``vidcache.identity``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError, NoSpaceError
from .keys import LOCAL_ONLY
from .loader.fetch import FetchLimits
from .options import DEFAULT_DECODER
from .store.base import Store
from .store.lmdb_env import DATA_FILE
from .store.publish import publish_bytes

ENV_DIR = "VIDCACHE_DIR"
ENV_SHARED = "VIDCACHE_SHARED"
# What a serving node must set of the two, as a pasted shell fragment says it (``export_line``): each node its own
# directory (required); the shared tier (may be set empty on a single node, but not forgotten).
NODE_ENV_HELP = {ENV_DIR: (":?", "set VIDCACHE_DIR to a node-local directory on this node (never NFS)"),
                 ENV_SHARED: ("?", "set VIDCACHE_SHARED to the shared tier of the cluster (an NFS path or "
                                   "s3://bucket/prefix), or to an empty value on a single node")}
VERIFY_READS = ("first", "always", "never")
# How entries are written to the shared tier: "compact", one lossless MagicYUV object per entry (frozen/,
# also what stock SGLang reads); "raw", the frames' bytes (cas/), as vidcache 0.1 wrote.  Both are read.
SHARED_LAYOUTS = ("compact", "raw")
NODE_FILE = "config.json"


@dataclass(frozen=True)
class NodeLayout:
    """What a node directory (``VIDCACHE_DIR``) holds: the one place that names its parts."""
    root: str

    lmdb_dir = property(lambda self: os.path.join(self.root, "lmdb"))          # the local tier (LMDB)
    lmdb_file = property(lambda self: os.path.join(self.root, "lmdb", DATA_FILE))
    # the embedding tier's own LMDB (vidcache.embeddings): its own budget, so embeddings never evict frames
    embeddings_dir = property(lambda self: os.path.join(self.root, "embeddings"))
    tmp_dir = property(lambda self: os.path.join(self.root, "tmp"))            # per-process downloads
    frozen_dir = property(lambda self: os.path.join(self.root, "frozen"))      # this node's frozen files
    quarantine_dir = property(lambda self: os.path.join(self.root, "quarantine"))   # bad frozen files, aside
    locks_dir = property(lambda self: os.path.join(self.root, "locks"))        # one fetch per key (single_flight)
    node_file = property(lambda self: os.path.join(self.root, NODE_FILE))      # shared tier, identity

    def has_local_tier(self) -> bool:
        """Whether this node has made its local tier yet (read-only commands create nothing)."""
        return os.path.exists(self.lmdb_file)
def export_line(name: str, value: str) -> str:
    """``export NAME=VALUE`` for a shell fragment a user pastes or evals.  A placeholder value (``<...>``) is never
    exported as text (it would become every later command's setting): it becomes ``${NAME:?why}``, which keeps the
    node's own value and stops the fragment, saying what to set, where there is none."""
    import shlex
    if not value.startswith("<"):
        return f"export {name}={shlex.quote(value)}"
    test, why = NODE_ENV_HELP.get(name, (":?", f"set {name} first"))
    why = "".join(c for c in why if c not in "\"'`$}")        # literal inside "${...}"
    return f'export {name}="${{{name}{test}{why}}}"'


_SECRET_KEYS = {"key", "secret", "token", "password", "aws_access_key_id", "aws_secret_access_key",
                "aws_session_token"}


def default_cache_dir() -> str:
    return os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "vidcache")


def _abs(path) -> str:
    return str(Path(path).expanduser().absolute())


def configured_shared(path: str) -> str | None:
    """The shared tier a node directory uses when none is given: ``$VIDCACHE_SHARED``, else the one it recorded."""
    return os.environ.get(ENV_SHARED) or read_node_file(path).get("shared") or None


def _placeholder(text: str) -> bool:
    """Text such as ``<a node-local directory ...>``: a template's blank pasted as a value."""
    return text.startswith("<") and text.rstrip("/").endswith(">")


def check_node_dir(path, where: str) -> None:
    """A ``ConfigError`` naming ``where`` for a node directory that cannot be one (a placeholder, a file)."""
    if path is None:
        return
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where} is {text!r}: expected a node-local directory")
    if _placeholder(text):
        raise ConfigError(f"{where} is {text!r}, a placeholder: set it to a node-local directory (never NFS)")
    if os.path.exists(text) and not os.path.isdir(text):
        raise ConfigError(f"{where} is {text!r}, a file, not a directory: point it at a node-local directory")


def check_shared_url(url: str | None, where: str) -> None:
    """A ``ConfigError`` naming ``where`` for a shared-tier URL no filesystem opens (``htp://typo``, a
    placeholder, a protocol whose package is missing), before any command reaches fsspec with it."""
    if url is None or url == "":           # none (an empty setting means none, as it always has)
        return
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{where} is {url!r}: expected an NFS path or s3://bucket/prefix")
    if _placeholder(url):
        raise ConfigError(f"{where} is {url!r}, a placeholder: set it to the cluster's shared tier "
                          "(an NFS path or s3://bucket/prefix), or unset it for none")
    import fsspec
    protocol = fsspec.core.split_protocol(url)[0]
    if not protocol:
        return
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        raise ConfigError(f"{where} is {url!r}: unknown protocol {protocol!r}; expected an NFS path, "
                          "s3://bucket/prefix or another fsspec URL") from None
    except ImportError as e:
        raise ConfigError(f"{where} is {url!r}: the {protocol!r} protocol needs a package that is not installed "
                          f"({e})") from None


@dataclass(frozen=True)
class CacheConfig:
    """Every setting of a ``VideoCache``; the cache is rebuilt from it in workers (it pickles as this)."""
    path: str                                      # node-local directory
    shared: str | None = None                      # shared tier URL
    shared_storage_options: dict = field(default_factory=dict, compare=False, repr=False)   # may hold credentials
    store: Store | None = field(default=None, compare=False)   # a custom store replaces the tiers
    decoder: str = DEFAULT_DECODER
    limits: FetchLimits = field(default_factory=FetchLimits)
    encoding: str = "raw"                          # LMDB values; "zlib" trades reads for size
    max_decoded_bytes: int | None = None           # None: the pipeline's own estimate-based default
    decoder_threads: int = 0                       # 0: FFmpeg's choice; prewarm splits cores among workers
    max_local_bytes: int | None = None             # local tier budget (LRU); the shared tier is never evicted
    verify_reads: str = "first"                    # blob digests: on the first read of a key per process
    shared_layout: str = "compact"                 # what new entries put in the shared tier (SHARED_LAYOUTS)
    read_only: bool = False

    def __post_init__(self) -> None:
        from .manifest import ENCODINGS     # the entry format's (imported here: the CLI's light commands skip it)
        if self.encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}")
        if self.verify_reads not in VERIFY_READS:
            raise ValueError(f"verify_reads must be one of {VERIFY_READS}")
        if self.shared_layout not in SHARED_LAYOUTS:
            raise ValueError(f"shared_layout must be one of {SHARED_LAYOUTS}")
        if self.max_local_bytes is not None and self.max_local_bytes <= 0:
            # 0 would evict every entry as it is written: a local tier that silently keeps nothing (D30).
            raise ValueError(f"max_local_bytes must be a positive number of bytes or None for no budget, "
                             f"got {self.max_local_bytes!r} (a budget of 0 keeps nothing)")

    @classmethod
    def resolve(cls, path=None, shared: str | None = None, **settings) -> "CacheConfig":
        """Explicit arguments first, then ``$VIDCACHE_DIR`` / ``$VIDCACHE_SHARED``, then what this node
        directory recorded (``config.json``), so later commands on the node find the same shared tier."""
        check_node_dir(path if path is not None else os.environ.get(ENV_DIR),
                       "--cache (path=)" if path is not None else ENV_DIR)
        p = _abs(path if path is not None else default_cache_dir())
        if shared is None:
            shared = configured_shared(p)
            check_shared_url(shared, ENV_SHARED if os.environ.get(ENV_SHARED)
                             else f"the shared tier recorded in {NodeLayout(p).node_file}")
        else:
            check_shared_url(shared, "--shared (shared=)")   # a typo is never recorded
            if not settings.get("read_only"):
                record_shared(p, shared, settings.get("shared_storage_options") or {})
        return cls(path=p, shared=shared or None, **settings)

    @property
    def layout(self) -> NodeLayout:
        return NodeLayout(self.path)

    def replace(self, **changes) -> "CacheConfig":
        return dataclasses.replace(self, **changes)

    # --- tiers -----------------------------------------------------------------
    def local_store(self) -> Store:
        from .store.lmdb import LMDBStore
        if self.read_only and self.shared and not self.layout.has_local_tier():
            # A fresh node (VIDCACHE_DIR absent or empty) reading through to the shared tier: an empty
            # local tier, and nothing is created on the node.
            from .store.memory import MemoryStore
            return MemoryStore(read_only=True)
        return LMDBStore(self.layout.lmdb_dir, read_only=self.read_only, max_bytes=self.max_local_bytes)

    def shared_store(self) -> Store | None:
        if not self.shared:
            return None
        return open_shared_tier(self.shared, read_only=self.read_only, storage_options=self.shared_storage_options,
                                max_decoded_bytes=self.max_decoded_bytes)

    def build_store(self, check) -> Store:
        """The store this configuration describes: a custom one, LMDB alone, or LMDB in front of the shared tier."""
        if self.store is not None:
            return self.store
        local, shared = self.local_store(), self.shared_store()
        if shared is None:
            return local
        from .store.tiered import TieredStore
        return TieredStore(local, shared, local_only=LOCAL_ONLY, check=check, read_only=self.read_only)


def open_shared_tier(url: str, *, read_only: bool, storage_options: dict | None = None,
                     max_decoded_bytes: int | None = None, where: str = "the shared tier") -> Store:
    """The shared tier at ``url`` (``s3://...``, or a plain path such as an NFS mount): the one way every command
    opens it, so each gets the same storage options and object-size cap.  ``where``: the setting that named
    it, for the error a bad URL gets (``check_shared_url``)."""
    check_shared_url(url, where)
    from .store.fsspec import DEFAULT_DECODE_BUDGET, FsspecStore, default_max_object_bytes
    if "://" not in url:
        url = _abs(url)
    # No entry's object is larger than the frames a decode budget allows (D33): this node's, when it allows
    # more than the default; never less, since another node, with the default, may have written the entry.
    budget = max(max_decoded_bytes or 0, DEFAULT_DECODE_BUDGET)
    return FsspecStore(url, read_only=read_only, storage_options=dict(storage_options or {}),
                       max_object_bytes=default_max_object_bytes(budget))


# --- the node directory's small record ----------------------------------------------
def read_node_file(path: str) -> dict:
    try:
        with open(NodeLayout(path).node_file) as f:
            d = json.load(f)
        return d if isinstance(d, dict) else {}
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError, UnicodeDecodeError):
        return {}


@contextlib.contextmanager
def node_dir_writes(path: str):
    """A full disk while the node directory is made or its record written: a NoSpaceError naming the directory,
    as a full LMDB gets (D23), not a raw OSError traceback.  On a brand-new node these are the first writes
    (D41: ``VideoCache()`` and ``prewarm`` ended in an ``OSError`` from ``config.json``'s makedirs)."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT, errno.ENOTDIR):
            # A directory that cannot be made or written (a typo, /proc, a read-only mount): the user's setting.
            raise ConfigError(f"cannot write the node directory {path!r} ({e.strerror}): point the cache "
                              "(--cache, VIDCACHE_DIR) at a writable node-local directory") from e
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise NoSpaceError(f"no space left for the node directory {path!r} ({e.strerror}): free space on that "
                           "disk, or point the cache (--cache, VIDCACHE_DIR) at a disk with room") from e


def write_node_file(path: str, record: dict) -> None:
    with node_dir_writes(path):
        publish_bytes(NodeLayout(path).node_file, json.dumps(record, sort_keys=True).encode())


def record_shared(path: str, shared: str, storage_options: dict) -> None:
    """Remember the shared tier in the node directory.  Credentials are never written."""
    rec = read_node_file(path)
    clean = {k: v for k, v in storage_options.items() if k not in _SECRET_KEYS}
    if rec.get("shared") != shared or rec.get("shared_storage_options") != clean:
        write_node_file(path, {**rec, "shared": shared, "shared_storage_options": clean})
