"""The commands on this node's settings and the shared tier they name: ``tier-id`` (read, make or repair the
tier's identity) and ``doctor`` (check the node).  Both open the tier through ``vidcache.config.open_shared_tier``,
as a cache does, so they see it with the same storage options and object-size cap."""
from __future__ import annotations

import os

from .common import add_cache_flags, command, node_dir, shared_url


def _add_tier_id(sub) -> None:
    p = command(sub, "tier-id", help="the shared tier's identity; --init / --restore / --new write it")
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR)")
    p.add_argument("--shared", metavar="URL", help="the shared tier (default: $VIDCACHE_SHARED)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--init", action="store_true", help="give a new, empty tier its identity (what prewarm does)")
    g.add_argument("--restore", metavar="ID", help="write back a lost identity (tier-<32 hex>: the tier of any "
                                                   "handle, plugin reference or earlier `vidcache stats`)")
    g.add_argument("--new", action="store_true", help="give a tier that lost its identity a new one (orphans "
                                                      "every handle made from it)")
    p.set_defaults(fn=cmd_tier_id)


def cmd_tier_id(args) -> int:
    """Print the shared tier's identity; --init makes it on a new tier, --restore/--new repair a lost one."""
    from ..config import ENV_SHARED, open_shared_tier
    from ..identity import set_shared_identity, shared_identity
    from ..errors import ConfigError
    url = shared_url(args, node_dir(args))
    if not url:
        raise ConfigError("no shared tier: set VIDCACHE_SHARED or pass --shared URL")
    where = "--shared" if getattr(args, "shared", None) else ENV_SHARED if os.environ.get(ENV_SHARED) \
        else "the shared tier the node recorded"
    store = open_shared_tier(url, read_only=not (args.init or args.restore or args.new), where=where)
    if args.restore or args.new:
        print(set_shared_identity(store, args.restore))
    else:
        print(shared_identity(store, create=args.init))
    return 0


def _add_doctor(sub) -> None:
    p = command(sub, "doctor",
                help="check this node: versions, settings, shared tier, decoders, SGLang plugin, Miles")
    add_cache_flags(p)
    p.add_argument("--fast", action="store_true", help="skip importing the SGLang plugin and the Miles adapters "
                                                       "(each takes a child interpreter importing torch)")
    p.set_defaults(fn=cmd_doctor)


def cmd_doctor(args) -> int:
    from ..doctor import run_checks
    ok = True
    for line in run_checks(cache_dir=node_dir(args), shared=shared_url(args, node_dir(args)),
                           imports=not args.fast):
        print(line.text())
        ok &= line.ok
    print("doctor: all checks passed" if ok else "doctor: some checks failed (see FIX above)")
    return 0 if ok else 1
