"""A node's cache configuration, and the store tiers it assembles.

A node is configured by two settings, as environment variables, CLI flags or
``VideoCache`` arguments:

  ``VIDCACHE_DIR``     node-local: the LMDB tier and local frozen-file copies.  Never on NFS.
  ``VIDCACHE_SHARED``  the cluster's shared tier: an NFS path, ``s3://bucket/prefix`` or any fsspec URL.

Everything that crosses a node boundary (handles, plugin references, frozen
URIs) names the shared tier by its *identity*, a random id stored in the tier
itself (``meta/tier``), never by a node-local path: two nodes may mount one NFS
export at different paths, or reach one bucket through different endpoints.
A cache without a shared tier has a node-local identity, which no other node
resolves.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError, NoSpaceError, SharedUnavailableError, StoreError, warn_once
from .keys import LOCAL_ONLY, TIER as TIER_KEY, TIER_ID
from .loader.fetch import FetchLimits
from .store.base import Store
from .store.lmdb_env import DATA_FILE
from .store.publish import publish_bytes

ENV_DIR = "VIDCACHE_DIR"
ENV_SHARED = "VIDCACHE_SHARED"
ENCODINGS = ("raw", "zlib")
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
    tmp_dir = property(lambda self: os.path.join(self.root, "tmp"))            # per-process downloads
    frozen_dir = property(lambda self: os.path.join(self.root, "frozen"))      # this node's frozen files
    quarantine_dir = property(lambda self: os.path.join(self.root, "quarantine"))   # bad frozen files, aside
    locks_dir = property(lambda self: os.path.join(self.root, "locks"))        # one fetch per key (single_flight)
    node_file = property(lambda self: os.path.join(self.root, NODE_FILE))      # identity, shared tier

    def has_local_tier(self) -> bool:
        """Whether this node has made its local tier yet (read-only commands create nothing)."""
        return os.path.exists(self.lmdb_file)
_SECRET_KEYS = {"key", "secret", "token", "password", "aws_access_key_id", "aws_secret_access_key",
                "aws_session_token"}


def default_cache_dir() -> str:
    return os.environ.get(ENV_DIR) or os.path.join(os.path.expanduser("~"), ".cache", "vidcache")


def _abs(path) -> str:
    return str(Path(path).expanduser().absolute())


def configured_shared(path: str) -> str | None:
    """The shared tier a node directory uses when none is given: ``$VIDCACHE_SHARED``, else the one it recorded."""
    return os.environ.get(ENV_SHARED) or read_node_file(path).get("shared") or None


@dataclass(frozen=True)
class CacheConfig:
    """Every setting of a ``VideoCache``; the cache is rebuilt from it in workers (it pickles as this)."""
    path: str                                      # node-local directory
    shared: str | None = None                      # shared tier URL
    shared_storage_options: dict = field(default_factory=dict, compare=False, repr=False)   # may hold credentials
    store: Store | None = field(default=None, compare=False)   # a custom store replaces the tiers
    decoder: str = "decord"
    limits: FetchLimits = field(default_factory=FetchLimits)
    encoding: str = "raw"                          # LMDB values; "zlib" trades reads for size
    max_decoded_bytes: int | None = None           # None: the pipeline's own estimate-based default
    decoder_threads: int = 0                       # 0: FFmpeg's choice; prewarm splits cores among workers
    max_local_bytes: int | None = None             # local tier budget (LRU); the shared tier is never evicted
    verify_reads: str = "first"                    # blob digests: on the first read of a key per process
    shared_layout: str = "compact"                 # what new entries put in the shared tier (SHARED_LAYOUTS)
    read_only: bool = False

    def __post_init__(self) -> None:
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
        p = _abs(path if path is not None else default_cache_dir())
        if shared is None:
            shared = configured_shared(p)
        elif not settings.get("read_only"):
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
                     max_decoded_bytes: int | None = None) -> Store:
    """The shared tier at ``url`` (``s3://...``, or a plain path such as an NFS mount): the one way every command
    opens it, so each gets the same storage options and object-size cap."""
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
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise NoSpaceError(f"no space left for the node directory {path!r} ({e.strerror}): free space on that "
                           "disk, or point the cache (--cache, VIDCACHE_DIR) at a disk with room") from e


def _write_node_file(path: str, record: dict) -> None:
    with node_dir_writes(path):
        publish_bytes(NodeLayout(path).node_file, json.dumps(record, sort_keys=True).encode())


def record_shared(path: str, shared: str, storage_options: dict) -> None:
    """Remember the shared tier in the node directory.  Credentials are never written."""
    rec = read_node_file(path)
    clean = {k: v for k, v in storage_options.items() if k not in _SECRET_KEYS}
    if rec.get("shared") != shared or rec.get("shared_storage_options") != clean:
        _write_node_file(path, {**rec, "shared": shared, "shared_storage_options": clean})


def remembered_identity(path: str, shared: str) -> str | None:
    """The identity this node last read from ``shared`` (``config.json``): what lets a node serve the entries
    it holds while the shared tier is unreachable."""
    rec = read_node_file(path)
    return rec.get("shared_identity") if rec.get("shared") == shared else None


def remember_identity(path: str, shared: str, identity: str) -> None:
    """Record it for ``remembered_identity`` (a writable open).  The node directory is made if it is not there
    yet: a fresh node's first command (a prewarm) reads the identity before it opens its LMDB, and a node
    that never recorded it could not serve its own entries while the tier is down."""
    rec = read_node_file(path)
    if (rec.get("shared"), rec.get("shared_identity")) != (shared, identity):
        with node_dir_writes(path):
            os.makedirs(path, exist_ok=True)
        _write_node_file(path, {**rec, "shared": shared, "shared_identity": identity})


def local_identity(path: str, create: bool) -> str | None:
    """The identity of a cache without a shared tier: node-local by construction."""
    rec = read_node_file(path)
    if "local_id" not in rec and create:
        rec["local_id"] = "local-" + uuid.uuid4().hex
        _write_node_file(path, rec)
        rec = read_node_file(path)
    return rec.get("local_id")


def missing_local_identity(path: str) -> str:
    """Why a read-only open of ``path`` without a shared tier finds no identity, and what to do about it."""
    rec = read_node_file(path)
    if rec.get("shared"):       # a node of a cluster, opened without its tier: the tier is what is missing
        return (f"has no node-local identity: it was last used with the shared tier {rec['shared']} (identity "
                f"{rec.get('shared_identity')}); set VIDCACHE_SHARED={rec['shared']} (or pass --shared), or "
                "open it writable once to give it a node-local identity of its own")
    return "has no identity yet (made by an older vidcache?): open it writable once"


def _parse_tier_record(store: Store, raw: bytes) -> str:
    try:
        tier_id = json.loads(raw)["tier_id"]
    except (ValueError, KeyError, TypeError):
        tier_id = None
    if not isinstance(tier_id, str) or not TIER_ID.fullmatch(tier_id):
        raise StoreError(f"{store!r} has a corrupt {TIER_KEY} record; restore the tier's identity (it is in "
                         "every handle and plugin reference made from it) with "
                         "`vidcache tier-id --shared URL --restore tier-<32 hex>`")
    return tier_id


def tier_record(tier_id: str) -> bytes:
    if not TIER_ID.fullmatch(tier_id):
        raise ConfigError(f"not a tier identity: {tier_id[:80]!r} (expected tier-<32 hex>)")
    return json.dumps({"tier_id": tier_id}).encode()


def tier_holds_objects(store: Store) -> bool:
    """Whether the tier holds anything besides its identity record."""
    from .keys import META
    return any(not k.startswith(META) for k in store.keys())


def node_tier(path: str) -> tuple[str, str] | None:
    """The shared tier this node belongs to, as its ``config.json`` records it: (URL, identity), or None."""
    rec = read_node_file(path)
    return (rec["shared"], rec["shared_identity"]) if rec.get("shared") and rec.get("shared_identity") else None


def shared_identity(store: Store, create: bool, remembered: str | None = None,
                    belongs_to: tuple[str, str] | None = None) -> str:
    """The shared tier's identity, created once in the tier itself.

    Race-safe when many nodes open a new tier at once: the record is written with an exclusive
    create (``link`` on a filesystem, a conditional ``If-None-Match: *`` PUT on S3), and every
    node then uses the record it reads back, never the one it proposed.  A tier that already
    holds objects but has no record lost it: that is an error naming the repair, never a new
    identity (a new one would orphan every handle made from the tier).  ``remembered``: the identity this
    node read from the tier before; to a read-only open, a tier without a record is then one this node
    cannot see, not a new one.  ``belongs_to``: the tier this node belongs to (``node_tier``); a writable open
    never makes a new tier silently on a node that belongs to one (an empty directory is what an NFS export
    that is not mounted looks like): ``vidcache tier-id --init`` starts one on purpose.
    """
    raw = store.get(TIER_KEY)
    if raw is None and remembered is not None and not create:
        # A read of a tier this node knows, now without a record: an NFS export not mounted here (an empty
        # mount point), a wrong bucket or prefix.  An outage, not "nothing prewarmed yet".  (A writable open
        # goes on as before: it makes the record, or names the restore when the tier holds objects.)
        raise SharedUnavailableError(
            f"{store!r} has no {TIER_KEY}, but this node read the identity {remembered} from it before: the "
            "tier is not mounted or not reachable here, or it was emptied (then restore its identity with "
            f"`vidcache tier-id --shared URL --restore {remembered}`)")
    if raw is None and tier_holds_objects(store):
        # Prewarm makes the record before any object, so objects without it mean it was lost -- unless
        # another node created it between our read and the listing: read it once more.
        if (raw := store.get(TIER_KEY)) is None:
            raise StoreError(
                f"{store!r} holds cache objects but has no {TIER_KEY} (deleted?). A new identity would orphan "
                "every handle made from it. Restore the old one (it is the `tier` of any handle or plugin "
                "reference, and `identity` in an old `vidcache stats`): `vidcache tier-id --shared URL "
                "--restore tier-<32 hex>`; or start a new identity with `vidcache tier-id --shared URL --new`")
    if raw is None and create and belongs_to is not None:
        url, ident = belongs_to
        raise ConfigError(
            f"{store!r} holds no vidcache tier, but this node belongs to the tier {ident} at {url}: refusing to "
            "start a new tier silently (an NFS export that is not mounted leaves an empty directory). Mount or "
            f"point VIDCACHE_SHARED at {url}; or, to start a new tier there on purpose: `vidcache tier-id "
            "--shared URL --init`")
    if raw is None and create:
        store.set_if_not_exists(TIER_KEY, tier_record("tier-" + uuid.uuid4().hex))
        raw = store.get(TIER_KEY)       # read back: whoever won, every node uses the stored record
    if raw is None:
        raise StoreError(f"{store!r} is not an initialised vidcache shared tier (no {TIER_KEY}): nothing "
                         "was prewarmed into it yet. `vidcache prewarm DATASET --shared URL` creates it")
    return _parse_tier_record(store, raw)


def resolve_identity(config: "CacheConfig", shared: Store | None, who: str) -> tuple[str, SharedUnavailableError | None]:
    """The cluster-wide name of the cache ``config`` describes (``who``: its repr, for errors): the shared tier's
    id, or a node-local one without a shared tier; and the tier's failure when it could not be read and the
    identity this node remembered was used instead (None otherwise).

    Remembered in the node directory by writable opens: while the tier is down, a node that read it before still
    serves the entries it holds (the plugin included) instead of failing them."""
    if shared is None:
        ident = local_identity(config.path, create=not config.read_only)
        if ident is None:
            raise ConfigError(f"{who} {missing_local_identity(config.path)}")
        return ident, None
    known = remembered_identity(config.path, config.shared)
    try:
        ident = shared_identity(shared, create=not config.read_only, remembered=known,
                                belongs_to=node_tier(config.path))
    except SharedUnavailableError as e:
        if known is None:
            raise
        warn_once("identity", f"{e}; serving this node's own entries under the identity it last read ({known})")
        return known, e
    if not config.read_only:
        remember_identity(config.path, config.shared, ident)
    return ident, None


def set_shared_identity(store: Store, tier_id: str | None) -> str:
    """Write a tier's identity record explicitly (``vidcache tier-id``): ``tier_id`` restores a lost one,
    None makes a new one.  Refused when the tier already has a record."""
    record = tier_record(tier_id or "tier-" + uuid.uuid4().hex)
    if not store.set_if_not_exists(TIER_KEY, record):
        have = _parse_tier_record(store, store.get(TIER_KEY))
        raise ConfigError(f"{store!r} already has identity {have}; it is never replaced")
    return _parse_tier_record(store, store.get(TIER_KEY))
