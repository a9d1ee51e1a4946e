"""What the commands share: the help format, the cache and video-option flags, sizes, and the node's cache
as the flags and the node's settings (``vidcache.config``) name it."""
from __future__ import annotations

import argparse
import os
import re
import sys


class Help(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default (unless the help already states it)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if (action.default not in (None, False, argparse.SUPPRESS) and "default" not in h
                and action.option_strings):
            h += f" (default: {action.default})"
        return h


def command(sub, name: str, **kw) -> argparse.ArgumentParser:
    """A subcommand's parser, its flags' help ending with their defaults (``Help``)."""
    return sub.add_parser(name, formatter_class=Help, **kw)


def family_arg(text: str) -> str:
    """``--family``: a family, or a model type (``qwen3_5``, ``qwen3_5_moe``...) taken as its family and said so
    (vidcache.families' table), so a user who knows only the checkpoint's model type is never refused."""
    from ..families import FAMILIES, FAMILY_OF_MODEL_TYPE
    if text in FAMILIES:
        return text
    if text in FAMILY_OF_MODEL_TYPE:
        family = FAMILY_OF_MODEL_TYPE[text]
        print(f"vidcache: --family {text}: model type {text} is served as family {family}", file=sys.stderr)
        return family
    raise argparse.ArgumentTypeError(f"unknown family or model type {text!r}: families {', '.join(FAMILIES)}; "
                                     f"model types {', '.join(sorted(FAMILY_OF_MODEL_TYPE))} (mapped to their family)")


def family_help(what: str) -> str:
    from ..families import FAMILIES, FAMILY_OF_MODEL_TYPE
    types = ", ".join(t for t in FAMILY_OF_MODEL_TYPE if t not in FAMILIES)
    return f"{what}: {', '.join(FAMILIES)}, or a model type ({types}: Qwen3.5 and others, mapped to their family)"


def add_option_flags(p: argparse.ArgumentParser) -> None:
    # One place for the video options' help and defaults: vidcache.options (Miles' flags use it too).
    from ..options import OPTION_HELP, VideoOptions
    g = p.add_argument_group("video options (qwen-vl-utils semantics; defaults resolved explicitly)")
    g.add_argument("--family", type=family_arg, metavar="FAMILY",
                   help=family_help(OPTION_HELP["family"]) + f" (default: --model's, else {VideoOptions.family})")
    g.add_argument("--model", metavar="DIR", help=MODEL_HELP)
    for name, typ in VideoOptions.flag_fields():
        g.add_argument("--" + name.replace("_", "-"), type=typ, dest=name, help=OPTION_HELP.get(name))


_UNITS = {"": 1, "B": 1, "K": 10**3, "KB": 10**3, "M": 10**6, "MB": 10**6, "G": 10**9, "GB": 10**9,
          "T": 10**12, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str) -> int:
    """``20GB`` (10**9), ``1.5TiB`` (2**40), ``500M`` or plain bytes -> bytes.  A sign is parsed (not refused
    here) so that a negative budget gets the same [config] error as 0 (``check_local_budget``)."""
    m = re.fullmatch(r"\s*([-+]?[0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 20GB, 500MiB, 1073741824)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def check_local_budget(size: int | None) -> None:
    """--max-local-bytes must leave room for entries: 0 would evict every entry as it is written (D30).
    (Refused here, as a [config] error, not in the argparse type, whose errors are usage errors.)"""
    if size is not None and size <= 0:
        from ..errors import ConfigError
        raise ConfigError(f"--max-local-bytes {size}: a local budget must be above 0 bytes (this one would keep "
                          "nothing); give a size above the largest entry, e.g. 200GB (prewarm: leave the flag out "
                          "for no budget)")


MODEL_HELP = ("a checkpoint directory: the family is derived from its processor classes and vision config "
              "(vidcache.families; an unknown model type is refused unless --family names it)")


def family_of(args) -> str | None:
    """--family, or the family derived from --model DIR (both given: they must agree)."""
    if not getattr(args, "model", None):
        return args.family
    from ..families import derive
    d = derive(args.model, args.family)
    # Named either way, so the user sees which model type the checkpoint declared and what it maps to.
    print(f"{'warning' if not d.verified else 'vidcache'}: --model {args.model}: {d.reason}", file=sys.stderr)
    return d.family


def options_of(args):
    from ..options import VideoOptions
    names = [n for n, _ in VideoOptions.flag_fields()]
    kw = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
    family = family_of(args)
    return VideoOptions(**kw, **({"family": family} if family else {}))


def mode_default_help() -> str:
    from ..families import FAMILIES
    from ..sglang_facts import default_mode
    return "default: " + ", ".join(f"{default_mode(f)} for {f}" for f in sorted(FAMILIES))


def add_cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR or "
                                                  "~/.cache/vidcache); never on a network filesystem")
    p.add_argument("--shared", metavar="URL", help="the cluster's shared tier: an NFS path or s3://bucket/prefix "
                                                   "(default: $VIDCACHE_SHARED, else what the directory recorded)")


def node_dir(args) -> str:
    from ..config import default_cache_dir
    return os.path.abspath(os.path.expanduser(args.cache or default_cache_dir()))


def has_local(path: str) -> bool:
    from ..config import NodeLayout
    return NodeLayout(path).has_local_tier()


def shared_url(args, path: str) -> str | None:
    from ..config import configured_shared
    s = getattr(args, "shared", None)
    return (s if isinstance(s, str) else None) or configured_shared(path)


def cache_of(args, read_only: bool = False, **settings):
    """The node's cache.  Read-only on a fresh node (no local directory yet) with a shared tier: the
    shared tier behind an empty local tier, and nothing is created on the node."""
    from ..cache import VideoCache
    from ..config import ENV_DIR, CacheConfig, check_node_dir
    given = getattr(args, "cache", None)      # a placeholder or a file is named before any "no cache there"
    check_node_dir(given or os.environ.get(ENV_DIR), "--cache" if given else ENV_DIR)
    path = node_dir(args)
    if read_only and not has_local(path) and not shared_url(args, path):
        from ..errors import ConfigError
        raise ConfigError(f"no vidcache cache at {path} and no shared tier; nothing was created there. Point at "
                          "a cache with --cache DIR or VIDCACHE_DIR=DIR (the README's demo: --cache demo/cache), "
                          "or at a shared tier with --shared URL or VIDCACHE_SHARED")
    shared = getattr(args, "shared", None)
    cache = VideoCache(path, shared=shared if isinstance(shared, str) else None, read_only=read_only,
                       decoder=getattr(args, "decoder", CacheConfig.decoder), **settings)
    if read_only and cache.shared is not None:
        cache.identity        # a tier that is not one (a typo, a lost meta/tier) is named now, not as "0 entries"
    return cache
