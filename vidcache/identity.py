"""A cache's identity: the one name of it that crosses a node boundary.

Everything that crosses a node boundary (handles, plugin references, frozen
URIs) names the shared tier by its *identity*, a random id stored in the tier
itself (``meta/tier``, the object ``meta/c1/tier``), never by a node-local path: two nodes may mount one NFS
export at different paths, or reach one bucket through different endpoints.
A cache without a shared tier has a node-local identity (in the node's
``config.json``), which no other node resolves.

Here: what an identity looks like (the one statement of its patterns), how it is made (once, race-safe), read,
remembered by the node (so a node serves its own entries while the tier is down) and restored.
"""
from __future__ import annotations

import json
import os
import re
import uuid
from typing import TYPE_CHECKING

from .config import node_dir_writes, read_node_file, write_node_file
from .errors import ConfigError, SharedUnavailableError, StoreError, warn_once
from .keys import TIER as TIER_KEY
from .keys import TIER_OBJECT
from .store.base import Store

if TYPE_CHECKING:
    from .config import CacheConfig

SHARED_PREFIX, LOCAL_PREFIX = "tier-", "local-"
# A shared tier's identity, as its record holds it: what `vidcache tier-id --restore` accepts.
SHARED_ID = re.compile(re.escape(SHARED_PREFIX) + r"[0-9a-f]{32}")
# The shape of any identity a reference may name (a shared tier's, a node-local one, another version's), checked
# before any lookup; whether it is this node's cache is the lookup's answer (``vidcache.node.cache_for``), so this
# only keeps a hostile reference short and plain.
ANY_ID = re.compile(r"[A-Za-z0-9._-]{1,80}")


def new_shared_id() -> str:
    return SHARED_PREFIX + uuid.uuid4().hex


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
        write_node_file(path, {**rec, "shared": shared, "shared_identity": identity})


def local_identity(path: str, create: bool) -> str | None:
    """The identity of a cache without a shared tier: node-local by construction."""
    rec = read_node_file(path)
    if "local_id" not in rec and create:
        rec["local_id"] = LOCAL_PREFIX + uuid.uuid4().hex
        write_node_file(path, rec)
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
    if not isinstance(tier_id, str) or not SHARED_ID.fullmatch(tier_id):
        raise StoreError(f"{store!r} has a corrupt {TIER_OBJECT} record; restore the tier's identity (it is in "
                         "every handle and plugin reference made from it) with "
                         "`vidcache tier-id --shared URL --restore tier-<32 hex>`")
    return tier_id


def tier_record(tier_id: str) -> bytes:
    if not SHARED_ID.fullmatch(tier_id):
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
            f"{store!r} has no {TIER_OBJECT}, but this node read the identity {remembered} from it before: the "
            "tier is not mounted or not reachable here, or it was emptied (then restore its identity with "
            f"`vidcache tier-id --shared URL --restore {remembered}`)")
    if raw is None and tier_holds_objects(store):
        # Prewarm makes the record before any object, so objects without it mean it was lost -- unless
        # another node created it between our read and the listing: read it once more.
        if (raw := store.get(TIER_KEY)) is None:
            raise StoreError(
                f"{store!r} holds cache objects but has no {TIER_OBJECT} (deleted?). A new identity would orphan "
                "every handle made from it. Restore the old one (it is the `identity` of any handle, the `tier` of "
                "any plugin reference, and the `cache:` line of an old `vidcache stats`, `identity` in its --json): `vidcache tier-id --shared URL "
                "--restore tier-<32 hex>`; or start a new identity with `vidcache tier-id --shared URL --new`")
    if raw is None and create and belongs_to is not None:
        url, ident = belongs_to
        raise ConfigError(
            f"{store!r} holds no vidcache tier, but this node belongs to the tier {ident} at {url}: refusing to "
            "start a new tier silently (an NFS export that is not mounted leaves an empty directory). Mount or "
            f"point VIDCACHE_SHARED at {url}; or, to start a new tier there on purpose: `vidcache tier-id "
            "--shared URL --init`")
    if raw is None and create:
        store.set_if_not_exists(TIER_KEY, tier_record(new_shared_id()))
        raw = store.get(TIER_KEY)       # read back: whoever won, every node uses the stored record
    if raw is None:
        raise StoreError(f"{store!r} is not an initialised vidcache shared tier (no {TIER_OBJECT}): nothing "
                         "was prewarmed into it yet. `vidcache prewarm DATASET --shared URL` creates it")
    return _parse_tier_record(store, raw)


def resolve_identity(config: "CacheConfig", shared: Store | None,
                     who: str) -> tuple[str, SharedUnavailableError | None]:
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
    record = tier_record(tier_id or new_shared_id())
    if not store.set_if_not_exists(TIER_KEY, record):
        have = _parse_tier_record(store, store.get(TIER_KEY))
        raise ConfigError(f"{store!r} already has identity {have}; it is never replaced")
    return _parse_tier_record(store, store.get(TIER_KEY))
