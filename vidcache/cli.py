"""The ``vidcache`` command: prewarm, ls, stats, verify, inspect, evict, gc, sglang-config, doctor, ...

Thin commands over the library (the node's settings, VIDCACHE_DIR and VIDCACHE_SHARED, are read by
``vidcache.config``; prewarm draws its own bar).  It imports lazily: commands that
only read manifests (``--help``, ``stats``, ``ls``, ``verify``, ``inspect``, ``sglang-config``, ``evict``,
``gc``, ``doctor``) never import torch, so they answer in a fraction of torch's import time
(benchmarks/cli_speed.py).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys

EXAMPLES = """examples:
  vidcache demo --dir demo && vidcache prewarm demo/dataset.jsonl --cache demo/cache --workers 2
  VIDCACHE_DIR=/local/vidcache VIDCACHE_SHARED=s3://bucket/vidcache vidcache prewarm train.jsonl --ray
  vidcache ls && vidcache stats && vidcache doctor
  VIDCACHE_SHARED=s3://bucket/vidcache vidcache pull train.jsonl     # a fresh node, before the job starts
  vidcache prewarm train.jsonl --family qwen2_5_vl --fps 2 --max-pixels 200704 --failures failures.jsonl
  vidcache inspect clip.mp4 --family qwen3_vl --contact-sheet clip.png
  vidcache sglang-config --family qwen2_5_vl --mode plugin
"""


class _Help(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default (unless the help already states it)."""

    def _get_help_string(self, action):
        h = action.help or ""
        if (action.default not in (None, False, argparse.SUPPRESS) and "default" not in h
                and action.option_strings):
            h += f" (default: {action.default})"
        return h


def _add_option_flags(p: argparse.ArgumentParser) -> None:
    # One place for the video options' help and defaults: vidcache.options (Miles' flags use it too).
    from .options import OPTION_HELP, PATCH_SIZE, VideoOptions
    g = p.add_argument_group("video options (qwen-vl-utils semantics; defaults resolved explicitly)")
    g.add_argument("--family", choices=sorted(PATCH_SIZE),
                   help=OPTION_HELP["family"] + f" (default: --model's, else {VideoOptions.family})")
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
        from .errors import ConfigError
        raise ConfigError(f"--max-local-bytes {size}: a local budget must be above 0 bytes (this one would keep "
                          "nothing); give a size above the largest entry, e.g. 200GB (prewarm: leave the flag out "
                          "for no budget)")


def source_arg(text: str) -> str:
    """A source as prewarm records it: local paths absolute and normalised (``./a.mp4``, ``a.mp4`` and
    ``file:///abs/a.mp4`` name one file); URLs as given."""
    if text[:7].lower() == "file://":
        text = text[7:]
    elif "://" in text:
        return text
    return os.path.normpath(os.path.abspath(os.path.expanduser(text)))


MODEL_HELP = ("a checkpoint directory: the family is derived from its processor classes and vision config "
              "(vidcache.rollout.models; an unknown model type is refused unless --family names it)")


def _family(args) -> str | None:
    """--family, or the family derived from --model DIR (both given: they must agree)."""
    if not getattr(args, "model", None):
        return args.family
    from .rollout.models import derive
    d = derive(args.model, args.family)
    if not d.verified:
        print(f"warning: {d.reason}", file=sys.stderr)
    return d.family


def _options(args):
    from .options import VideoOptions
    names = [n for n, _ in VideoOptions.flag_fields()]
    kw = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
    family = _family(args)
    return VideoOptions(**kw, **({"family": family} if family else {}))


def _mode_default_help() -> str:
    from .options import PATCH_SIZE
    from .sglang.facts import default_mode
    return "default: " + ", ".join(f"{default_mode(f)} for {f}" for f in sorted(PATCH_SIZE))


def _add_cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR or "
                                                  "~/.cache/vidcache); never on a network filesystem")
    p.add_argument("--shared", metavar="URL", help="the cluster's shared tier: an NFS path or s3://bucket/prefix "
                                                   "(default: $VIDCACHE_SHARED, else what the directory recorded)")


def _node_dir(args) -> str:
    from .config import default_cache_dir
    return os.path.abspath(os.path.expanduser(args.cache or default_cache_dir()))


def _has_local(path: str) -> bool:
    from .config import NodeLayout
    return NodeLayout(path).has_local_tier()


def _shared_url(args, path: str) -> str | None:
    from .config import configured_shared
    s = getattr(args, "shared", None)
    return (s if isinstance(s, str) else None) or configured_shared(path)


def _cache(args, read_only: bool = False, **settings):
    """The node's cache.  Read-only on a fresh node (no local directory yet) with a shared tier: the
    shared tier behind an empty local tier, and nothing is created on the node."""
    from .cache import VideoCache
    from .config import CacheConfig
    path = _node_dir(args)
    if read_only and not _has_local(path) and not _shared_url(args, path):
        from .errors import ConfigError
        raise ConfigError(f"no vidcache cache at {path} and no shared tier (set VIDCACHE_SHARED or pass --shared "
                          "URL); nothing was created there")
    shared = getattr(args, "shared", None)
    cache = VideoCache(path, shared=shared if isinstance(shared, str) else None, read_only=read_only,
                       decoder=getattr(args, "decoder", CacheConfig.decoder), **settings)
    if read_only and cache.shared is not None:
        cache.identity        # a tier that is not one (a typo, a lost meta/tier) is named now, not as "0 entries"
    return cache


DEFAULT_MEDIA_KEYS = {"video": "videos", "image": "images"}   # Miles' own row fields for each (its data docs)


def _multimodal_keys(text: str | None, dataset: str | None = None) -> dict:
    """``--multimodal-keys``; without it, ``videos`` and ``images`` (Miles rows carry both).  Of a dataset that
    knows its columns (parquet, HF), a default key it has no column for is dropped (only a key asked for must
    name one)."""
    from .errors import ConfigError
    if not text:
        keys = dict(DEFAULT_MEDIA_KEYS)
        if dataset is not None and (cols := _columns(dataset)) is not None:
            keys = {k: v for k, v in keys.items() if v in cols} or {"video": DEFAULT_MEDIA_KEYS["video"]}
        return keys
    try:
        keys = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"--multimodal-keys is not JSON ({e}); expected e.g. '{{\"video\": \"videos\"}}'") from None
    if not isinstance(keys, dict) or not all(isinstance(v, str) for v in keys.values()):
        raise ConfigError(f"--multimodal-keys must be a JSON object of strings, e.g. '{{\"video\": \"videos\"}}', "
                          f"got {text[:80]!r}")
    return keys


def _columns(dataset: str) -> list | None:
    """The columns of a parquet file or dataset directory (None for JSON Lines, whose rows name their own)."""
    from .dataset import is_parquet, open_rows
    if not (os.path.isdir(dataset) or is_parquet(dataset)):
        return None
    return list(getattr(open_rows(dataset), "columns", None) or [])


def _where(rec: dict) -> str:
    if rec.get("row") is None:
        return "dataset"
    return f"row {rec['row']}" + (f" (line {rec['line']})" if rec.get("line") is not None else "")


SHOWN_FAILURES = 5


def _print_failures(failures: list, report: str | None = None) -> None:
    for f in failures[:SHOWN_FAILURES]:
        print(f"  {_where(f)}: [{f['kind']}] {f['error']}")
    if len(failures) > SHOWN_FAILURES:
        print(f"  ... and {len(failures) - SHOWN_FAILURES} more" + (f" (every one in {report})" if report else ""))


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _positive_size(text: str) -> int:
    n = parse_size(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive size, got {text!r}")
    return n


def cmd_prewarm(args) -> int:
    from .errors import BackendUnavailableError, ConfigError
    from .loader.fetch import FetchLimits
    from .options import VIDEO_KEY
    from .prewarming import check_failures_path, default_failures_path, default_worker_memory, prewarm

    # Every mistake the user can make is refused before any work is done, and creates nothing.
    check_local_budget(args.max_local_bytes)
    if not (os.path.isfile(args.dataset) or os.path.isdir(args.dataset)):
        raise ConfigError(f"dataset not found: {args.dataset}" if not os.path.exists(args.dataset)
                          else f"dataset is not a file or a dataset directory: {args.dataset}")
    _check_format(args.dataset)       # a video, a JSON array, a CSV: one error, before anything is written
    keys = _multimodal_keys(args.multimodal_keys, args.dataset)
    unknown = sorted(set(keys) - {"video", "image"})
    if unknown:      # Miles' audio and other types are not read by vidcache: refuse rather than ignore them
        raise ConfigError(f"--multimodal-keys: vidcache reads the 'video' and 'image' entries, got {unknown}")
    if args.ray:
        try:
            import ray  # noqa: F401
        except ImportError as e:
            raise BackendUnavailableError(f"--ray needs Ray, which does not import here ({e}): "
                                          "pip install 'vidcache[ray]'") from None
    failures = os.path.abspath(args.failures) if args.failures else default_failures_path(args.dataset)
    check_failures_path(failures)
    options = _options(args)
    cache = _cache(args, limits=FetchLimits(max_bytes=int(args.max_source_mb * 2**20), timeout_s=args.fetch_timeout),
                   max_local_bytes=args.max_local_bytes)
    ident = cache.identity            # a new shared tier gets its identity now, before any work (race-safe)
    print(f"prewarm: cache {ident}" + (f" (shared tier {cache.config.shared})" if cache.config.shared else
                                      f" (node-local: {cache.path})"), file=sys.stderr)
    print(f"prewarm: {_path_note(options)}", file=sys.stderr)
    from .sglang.versions import installed_transformers
    from .token_layout import unverified_warning
    warn = unverified_warning(options.family, installed_transformers())
    if warn:
        print(f"prewarm: warning: {warn}", file=sys.stderr)
    memory = int(args.max_worker_memory_mb * 2**20) if args.max_worker_memory_mb else default_worker_memory(
        args.workers)
    bar = args.progress or (not args.no_progress and sys.stderr.isatty())
    if args.ray:        # Ray takes seconds to start or connect, with nothing else on the screen meanwhile
        print("prewarm: " + (f"connecting to the Ray cluster at {args.ray_address}" if args.ray_address else
                             "starting Ray (or joining the one running on this machine)") + ": a few seconds",
              file=sys.stderr, flush=True)
    s = prewarm(args.dataset, cache, options, workers=args.workers, timeout_s=args.timeout, failures_path=failures,
                input_key=args.input_key, max_worker_memory=memory, progress=bar,
                log_every_s=None if (bar or args.no_progress) else args.log_interval,
                video_key=keys.get("video", VIDEO_KEY), image_key=keys.get("image"), split=args.split,
                ray=args.ray, ray_address=args.ray_address,
                ray_logs=args.ray_logs)
    print(s.line())
    if s.failed:
        print(f"failures: {failures}")
        _print_failures(s.failures, failures)
    if s.was_interrupted:
        return 130                        # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
    return 0 if (s.failed == 0 or args.allow_failures) else 1


def _check_format(dataset: str) -> None:
    from .dataset import check_format, is_parquet
    if os.path.isfile(dataset) and not is_parquet(dataset):
        check_format(dataset)


def cmd_pull(args) -> int:
    """Bring the entries a dataset's rows name from the shared tier into this node's local tier, in row order
    (``vidcache.prewarming.pull``); every video that is not pulled is listed with its reason."""
    from .errors import ConfigError
    from .options import VIDEO_KEY
    from .prewarming import pull
    if not (os.path.isfile(args.dataset) or os.path.isdir(args.dataset)):
        raise ConfigError(f"dataset not found: {args.dataset}")
    _check_format(args.dataset)
    keys = _multimodal_keys(args.multimodal_keys, args.dataset)
    cache = _cache(args)
    if cache.shared is None:
        raise ConfigError(f"{cache!r} has no shared tier to pull from (set VIDCACHE_SHARED or pass --shared URL)")
    print(f"pull: {args.dataset} from {cache.config.shared} into {cache.path}", file=sys.stderr)
    s = pull(args.dataset, cache, _options(args), input_key=args.input_key, video_key=keys.get("video", VIDEO_KEY),
             image_key=keys.get("image"), split=args.split, depth=args.depth, max_bytes=args.max_bytes,
             progress=sys.stderr.isatty())
    cache.sync()
    print(s.line())
    if s.failures:
        _print_failures(s.failures)
    return 1 if s.failed else 0


def _path_note(options) -> str:
    """Which SGLang path these options allow (issue: say it before the work, not at serving time)."""
    from .sglang.facts import stock_sglang_problems
    r = options.resolved()
    if stock_sglang_problems(options.family, r.size_factor):
        return (f"{options.family} on the {r.size_factor}-pixel grid (faithful aspect ratios): SGLang plugin mode "
                "only (`vidcache sglang-config --mode plugin`); stock SGLang would resize these frames")
    return f"{options.family} on the {r.size_factor}-pixel grid: SGLang stock and plugin modes"


def cmd_stats(args) -> int:
    st = _cache(args, read_only=True).stats()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(stats_table(st))
    return 0


def stats_table(st: dict) -> str:
    """``stats`` for a person: one row per tier.  An entry is a video under one option set; a blob its frames
    (the shared tier's compact layout holds frozen objects instead); BYTES is what the tier takes on disk."""
    lines = [f"cache:  {st['identity']}", f"node:   {st['path']}"]
    sh = st.get("shared")
    if sh:
        lines.append(f"shared: {sh['url']}")
    cols = ("entries", "blobs", "sources", "frozen_files", "quarantined")
    lines += ["", f"{'TIER':<8} {'ENTRIES':>8} {'BLOBS':>8} {'SOURCES':>8} {'FROZEN':>8} {'QUARANTINED':>12} "
                  f"{'BYTES':>10}"]
    store = st.get("store") or {}
    local_store = store.get("local", store) if isinstance(store.get("local"), dict) else store
    rows = [("local", st["local"], local_store.get("used_bytes"))]
    if sh:
        rows.append(("shared", sh, sh.get("bytes")))
    rows.append(("all", st, None))
    for name, r, nbytes in rows:
        cells = [("-" if r.get(c) is None else str(r[c])) for c in cols]
        size = "-" if nbytes is None else _human(nbytes)
        lines.append(f"{name:<8} {cells[0]:>8} {cells[1]:>8} {cells[2]:>8} {cells[3]:>8} {cells[4]:>12} {size:>10}")
    extra = []
    if local_store.get("max_bytes"):
        extra.append(f"local budget {_human(local_store['max_bytes'])}")
    if st.get("tmp_bytes"):
        extra.append(f"{_human(st['tmp_bytes'])} of temp files")
    if sh and sh.get("partial_files"):
        extra.append(f"{sh['partial_files']} partial upload(s) in the shared tier ({_human(sh['partial_bytes'])})")
    if extra:
        lines += ["", "; ".join(extra)]
    lines.append("(`vidcache stats --json` for every field)")
    return "\n".join(lines)


def cmd_verify(args) -> int:
    from .errors import VidcacheError
    whole_shared = args.shared is not None
    if args.shared is True:
        args.shared = None              # bare --shared: the configured tier
    if args.upgrade and not whole_shared:
        from .errors import ConfigError
        raise ConfigError("--upgrade converts the shared tier: give it with --shared (and VIDCACHE_SHARED or a URL)")
    cache = _cache(args, read_only=not (args.repair or args.upgrade))
    if args.keys:
        todo = args.keys
    else:
        tier = cache.shared if whole_shared else cache.local
        if whole_shared and tier is None:
            from .errors import ConfigError
            raise ConfigError("--shared: this cache has no shared tier (give --shared URL or set VIDCACHE_SHARED)")
        if whole_shared:
            cache.identity                     # reads the tier's record; where the tier is not there, ...
            if cache.shared_unreachable is not None:
                raise cache.shared_unreachable     # ... an empty listing of it would verify nothing
        from . import keys as k
        todo = []
        for sk in tier.keys(k.AC):
            try:
                todo.append(k.entry_key(sk))
            except VidcacheError:
                print(f"BAD {sk!r}: not a key of the cache's format")
    bad, run = 0, (lambda fn: fn(cache)) if whole_shared else _ThisNodeIfTierDown(cache, "checking")
    for key in todo:
        try:       # during a tier outage this node's copies are still checked; `verify --shared` fails
            problems = run(lambda c: c.verify(key, repair=args.repair))
        except VidcacheError as e:
            problems = [f"[{e.kind}] {e}"]
        if problems and args.repair and any("frozen file" in p for p in problems):
            from .sglang.frozen import repair_frozen      # remakes frozen files from the frames (imports torch)
            with contextlib.suppress(VidcacheError):
                repair_frozen(cache, key)
        if problems:
            bad += 1
            after = (" -> repaired" if not cache.verify(key) else " -> still bad") if args.repair else ""
            print(f"BAD {key}: {'; '.join(problems)}{after}")
        else:
            print(f"OK  {key}")
    print(f"verify: {len(todo) - bad} ok, {bad} bad" + (" (repair attempted)" if args.repair and bad else ""))
    if args.upgrade:
        from .prewarming import Interrupt
        stop = Interrupt("verify --upgrade", "finishing the entry under way")   # an entry converts whole or not
        try:
            up = cache.upgrade_shared(todo, stop=lambda: stop.requested)
        finally:
            stop.restore()
        left = f", interrupted ({up['interrupted']} left: run it again to convert them)" if up["interrupted"] else ""
        print(f"upgrade: {up['converted']} converted to compact objects, {up['already']} already compact, "
              f"{up['kept_raw']} kept raw, {_human(up['freed_bytes'])} of raw frames deleted from the shared tier"
              + left)
        if up["interrupted"]:
            return 130
    return 1 if bad else 0


_PREFIX = re.compile(r"[0-9a-f]{4,32}(\.[0-9]{0,20}(\.[0-9a-f]{0,32})?)?")


def _key_stem(given: str) -> str | None:
    """``given`` without the ``..`` that `vidcache ls` prints, when it is a key or a prefix of one; else None."""
    stem = given[:-2] if given.endswith("..") else given
    return stem if _PREFIX.fullmatch(stem) else None


def _full_key(cache, given: str) -> str:
    """``given`` as a whole entry key: a key as it is, or a prefix of one (``vidcache ls`` prints 16 hex digits
    and ``..``) completed over the entries of every tier, as git completes object names: refused when no entry or
    more than one starts with it."""
    from . import keys as k
    from .errors import InvalidKeyError
    stem = _key_stem(given)
    if stem is None:
        k.check_key(given)               # the usual "not a vidcache key" error
    if k.is_key(stem):
        return stem
    found = [e for e in _entry_keys(cache) if e.startswith(stem)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise InvalidKeyError(f"no cached entry's key starts with {stem!r}")
    raise InvalidKeyError(f"{stem!r} is ambiguous: {len(found)} entries start with it ({', '.join(found[:4])}"
                          f"{', ...' if len(found) > 4 else ''}); give more of the key")


def _entry_keys(cache) -> list[str]:
    """Every entry key of every tier, sorted: what a prefix is completed over (and made unique against)."""
    from . import keys as k
    from .errors import InvalidKeyError
    names = set(cache.local.keys(k.AC)) | (set(cache.shared.keys(k.AC)) if cache.shared is not None else set())
    out = set()
    for n in names:
        with contextlib.suppress(InvalidKeyError):        # a stray name in a tier: not an entry
            out.add(k.entry_key(n))
    return sorted(out)


MIN_PREFIX = 16      # hex digits `ls` shows at least (git's core.abbrev, for 128-bit digests)


def unique_prefixes(all_keys: list[str], minimum: int = MIN_PREFIX) -> dict[str, str]:
    """Each key's shortest prefix that no other key shares, at least ``minimum`` characters (git's rule for
    abbreviated object names), never ending on a ``.``: what ``inspect`` and ``evict`` complete back."""
    ks = sorted(set(all_keys))
    out = {}
    for i, key in enumerate(ks):
        common = max((len(os.path.commonprefix([key, o])) for o in (ks[i - 1:i] + ks[i + 1:i + 2])), default=0)
        n = min(len(key), max(minimum, common + 1))
        while n < len(key) and key[n - 1] == ".":
            n += 1
        out[key] = key[:n]
    return out


def cmd_evict(args) -> int:
    from . import keys as k
    for key in args.keys:
        if _key_stem(key) is None:
            k.check_key(key)
    path = _node_dir(args)
    if not args.shared and not _has_local(path):
        for key in args.keys:            # a fresh node holds nothing: nothing to evict, nothing created
            print(f"absent  {key}")
        return 0
    cache = _cache(args)
    args.keys = [_full_key(cache, key) for key in args.keys]
    if args.shared:
        from .errors import ConfigError
        if cache.shared is None:
            raise ConfigError("--shared: this cache has no shared tier (set VIDCACHE_SHARED or pass --shared URL)")
        what = f"{len(args.keys)} entr{'y' if len(args.keys) == 1 else 'ies'} from the shared tier " \
               f"{cache.config.shared} ({cache.identity}): every node loses {'it' if len(args.keys) == 1 else 'them'}"
        if not args.yes:
            if not sys.stdin.isatty():
                raise ConfigError(f"refusing to delete {what}, without confirmation: pass --yes")
            if input(f"delete {what}? [y/N] ").strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 1
    for key in args.keys:
        print(f"{'evicted' if cache.evict(key, shared=args.shared) else 'absent '} {key}")
    return 0


def cmd_gc(args) -> int:
    check_local_budget(args.max_local_bytes)
    path = _node_dir(args)
    if not _has_local(path):
        print(json.dumps({"evicted": 0, "freed_bytes": 0, "used_bytes": 0, "entries_evicted": 0}, indent=2))
        return 0
    cache = _cache(args)
    print(json.dumps(cache.gc(args.max_local_bytes), indent=2))
    return 0


def _human(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)


class _ThisNodeIfTierDown:
    """Runs a command's step on the cache or, once the shared tier proves unreachable, on this node's own tier
    (one warning that says so, and no more waits on the tier): a node's copies can be listed and checked
    during an outage."""

    def __init__(self, cache, doing: str) -> None:
        self.cache, self.doing, self.alone = cache, doing, None

    def __call__(self, fn):
        from .errors import SharedUnavailableError
        if self.alone is None:
            try:
                self.cache.identity       # where the tier is down, the remembered one (shared_unreachable set)
                if (e := self.cache.shared_unreachable) is None:
                    return fn(self.cache)
            except SharedUnavailableError as err:
                e = err
            if self.cache.shared is None or not _has_local(self.cache.path):    # a fresh node has none
                raise e
            print(f"vidcache: warning: {e}; {self.doing} this node's own copies only", file=sys.stderr)
            self.alone = self.cache.with_settings(shared=None)
        return fn(self.alone)


def cmd_ls(args) -> int:
    rows, names = _ThisNodeIfTierDown(_cache(args, read_only=True), "listing")(
        lambda c: (c.listing(), _entry_keys(c)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    # KEY: the shortest prefix unique among every key `inspect` / `evict` complete over (one clip under two option
    # sets shares its first 32 digits: 16 alone could not tell them apart)
    short = unique_prefixes(names + [r["key"] for r in rows])
    width = max([16] + [len(short[r["key"]]) for r in rows]) + 2
    print(f"{'KEY':<{width}} {'FAMILY':<10} {'T x H x W':>16} {'FPS':>5} {'TOKENS':>7} {'BYTES':>9} {'TIER':<12} "
          "SOURCE")
    for r in rows:
        src = ", ".join(r["sources"]) or "-"
        fps = f"{r['fps']:.3g}" if r.get("fps") is not None else "-"
        print(f"{short[r['key']] + '..':<{width}} {r['family']:<10} {r['frames']:>4} x {r['height']:>4} x "
              f"{r['width']:>4} {fps:>5} {r['tokens']:>7} {_human(r['bytes']):>9} {'+'.join(r['tiers']):<12} {src}")
    print(f"{len(rows)} entr{'y' if len(rows) == 1 else 'ies'}, {_human(sum(r['bytes'] for r in rows))}")
    return 0


def cmd_inspect(args) -> int:
    import dataclasses

    from .errors import InvalidKeyError
    cache = _cache(args, read_only=True)
    target = args.target
    as_key = not os.path.exists(target) and _key_stem(target) is not None
    try:
        if not as_key:
            m = cache.manifest(target)
        else:                              # a key, or a prefix of one as `ls` prints it: its errors are the answer
            m = cache.manifest(_full_key(cache, target))
            if m is None:
                raise InvalidKeyError(f"no cached entry has the key {target}")
    except InvalidKeyError:
        if as_key:
            raise
        m = None
        target = source_arg(target)
        candidates = [target] + (["file://" + target] if target.startswith("/") else [])
        options = _options(args)
        for src in candidates:             # prewarm records a dataset's source as written: path or file:// URL
            if (key := cache.find(src, options)) is not None:
                m = cache.manifest(key)
                break
        if m is None:
            cached = [o for src in candidates for o in cache.options_cached_for(src)]
            if cached:
                shown = "; ".join(_option_flags(o) for o in cached)
                print(f"{target} is not cached for these options; it is cached under: {shown}", file=sys.stderr)
                return 1
    if m is None:
        print(f"{target!r} is neither a cached key nor a cached source for these options "
              f"(prewarm it first)", file=sys.stderr)
        return 1
    out = dataclasses.asdict(m)
    idx = out["sampling"]["frame_indices"]
    out["sampling"]["frame_indices"] = list(idx[:16]) + (["..."] if len(idx) > 16 else [])
    s = m.source
    out["aspect"] = {"source": f"{s.width_from_decoder}x{s.height_from_decoder} "
                               f"({s.width_from_decoder / s.height_from_decoder:.3f}:1)",
                     "stored": f"{m.width}x{m.height} ({m.width / m.height:.3f}:1)",
                     "distortion": round(m.aspect_distortion, 4)}
    print(json.dumps(out, indent=2))
    if args.contact_sheet:
        from .contact_sheet import contact_sheet
        contact_sheet(cache.frames(m.key), m).save(args.contact_sheet)
        print(f"contact sheet: {args.contact_sheet}")
    return 0


def _option_flags(opts: dict) -> str:
    """Options as the CLI flags that select them (only those that differ from the defaults)."""
    from .options import VideoOptions
    default = VideoOptions(family=opts.get("family", "qwen2_5_vl")).resolved().to_dict()
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in opts.items()
                    if v is not None and (k == "family" or v != default.get(k)))


def cmd_sglang_config(args) -> int:
    from .sglang.config import render, sglang_config
    path = _node_dir(args)
    # The cache (identity, largest frozen file) when this node has one or reaches a shared tier; on a fresh
    # node without either, the config alone.
    cache = _cache(args, read_only=True) if (_has_local(path) or _shared_url(args, path)) else None
    family = _family(args)
    if family is None:
        from .errors import ConfigError
        raise ConfigError("sglang-config needs --family or --model DIR (the checkpoint)")
    cfg = sglang_config(family, args.mode, cache, args.sglang_version)
    sys.stdout.write(render(cfg, args.format))
    if family == "qwen3_vl" and cfg["mode"] == "stock":
        print("note: stock mode serves Qwen3-VL only on the 224 grid (VideoOptions.for_stock_sglang), which "
              "distorts aspect ratios; the default 32-grid frames need --mode plugin", file=sys.stderr)
    return 0


def cmd_vllm_config(args) -> int:
    from .vllm.config import MM_PROCESSOR_KWARGS, engine_kwargs, serve_flags
    if args.family is None:     # the loader then hands plain (uncached) files to opencv, not the model's own loader
        print("note: without --family, plain (uncached) video files go to VLLM_VIDEO_LOADER_BACKEND (opencv), not "
              "the model's own loader", file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"engine_kwargs": engine_kwargs(args.family), "serve_flags": serve_flags(args.family),
                          "mm_processor_kwargs": MM_PROCESSOR_KWARGS}, indent=2))
    else:               # shell-quoted: pasted into a shell, the JSON reaches vLLM with its quotes
        import shlex
        print(f"vllm serve MODEL {shlex.join(serve_flags(args.family))}")
    return 0


def cmd_check_server(args) -> int:
    cache = _cache(args) if (args.cache or args.shared) else None       # default: this node's configuration
    if args.engine == "vllm":           # one path (vidcache's loader): --mode and the SGLang-only flags do not apply
        from .vllm.check import check_server as check_vllm
        res = check_vllm(args.url, args.family, args.processor, args.allow_unverified_vllm, cache=cache,
                         token_layout=args.token_layout)
        print("\n".join(res.lines()))
        return 0 if res.ok else 1
    from .sglang.check import check_server
    res = check_server(args.url, args.family, args.mode, args.processor, args.allow_unverified_sglang,
                       args.server_torchcodec, cache=cache, token_layout=args.token_layout)
    print("\n".join(res.lines()))
    return 0 if res.ok else 1


def cmd_check_trainer(args) -> int:
    """Does this environment's transformers compute the engine's M-RoPE positions?  (No GPU, no weights.)"""
    from .positions import trainer_rule_problem
    bad = 0
    from .positions import TRAINER_MODEL_TYPES
    for family in args.family or TRAINER_MODEL_TYPES:
        problem = trainer_rule_problem(family, args.engine)
        print(f"OK   {family}: transformers' own positions are {args.engine}'s" if problem is None
              else f"FAIL [positions] {family}: {problem}")
        bad += problem is not None
    return 1 if bad else 0


def cmd_serve(args) -> int:
    from .sglang.server import make_server
    limits = {k: v for k, v in (("workers", args.workers), ("timeout_s", args.timeout),
                                ("header_timeout_s", args.header_timeout), ("min_rate", args.min_rate),
                                ("max_per_client", args.max_per_client),
                                ("max_workers_per_client", args.max_workers_per_client)) if v is not None}
    srv = make_server(_cache(args), args.host, args.port, **limits)
    host, port = srv.server_address[:2]
    from .sglang.frozen import FORMATS
    from .serving import SERVING_FORMAT
    print(f"serving frozen files of {args.cache or 'the default cache'} at "
          f"http://{host}:{port}/frozen/<key>{FORMATS[SERVING_FORMAT].suffix} "
          f"({srv.workers} workers, {srv.timeout_s:g} s timeout)", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0


def cmd_demo(args) -> int:
    print(f"demo: writing {args.videos} generated clips and a {args.rows}-row dataset into {args.dir}",
          file=sys.stderr, flush=True)         # before the encoder's imports: the first words come at once
    from .testing.demo import make_demo_dataset
    path = make_demo_dataset(args.dir, n_videos=args.videos, n_rows=args.rows,
                             log=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"demo dataset: {path}")
    return 0


def cmd_tier_id(args) -> int:
    """Print the shared tier's identity; --init makes it on a new tier, --restore/--new repair a lost one."""
    from .config import open_shared_tier, set_shared_identity, shared_identity
    from .errors import ConfigError
    url = _shared_url(args, _node_dir(args))
    if not url:
        raise ConfigError("no shared tier: set VIDCACHE_SHARED or pass --shared URL")
    store = open_shared_tier(url, read_only=not (args.init or args.restore or args.new))
    if args.restore or args.new:
        print(set_shared_identity(store, args.restore))
    else:
        print(shared_identity(store, create=args.init))
    return 0


def cmd_doctor(args) -> int:
    from .doctor import run_checks
    ok = True
    for line in run_checks(cache_dir=_node_dir(args), shared=_shared_url(args, _node_dir(args)),
                           imports=not args.fast):
        print(line.text())
        ok &= line.ok
    print("doctor: all checks passed" if ok else "doctor: some checks failed (see FIX above)")
    return 0 if ok else 1


def _version() -> str:
    from . import __version__
    return f"vidcache {__version__} ({os.path.dirname(os.path.abspath(__file__))})"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vidcache", description="Content-addressed video frame cache for VLM RL.",
                                 epilog=EXAMPLES, formatter_class=_Help)
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="cmd", required=True)
    add = lambda name, **kw: sub.add_parser(name, formatter_class=_Help, **kw)   # noqa: E731
    from .options import INPUT_KEY

    p = add("check-trainer", help="does this environment's transformers put every token at the rollout engine's "
                                  "M-RoPE position? (else: pass vidcache.rope_positions)")
    p.add_argument("--family", action="append", metavar="MODEL_TYPE",
                   help="a model type: qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_5_moe, qwen4_exp (repeatable; "
                        "default: all)")
    p.add_argument("--engine", default="sglang", choices=["sglang", "vllm"], help="the rollout engine")
    p.set_defaults(fn=cmd_check_trainer)

    p = add("prewarm", help="decode, sample and resize every video of a dataset into the cache (images: checked)")
    p.add_argument("dataset", help="Miles' prompt file (.jsonl, or .parquet) or a Hugging Face dataset directory "
                                   "(save_to_disk or load_dataset); videos and images under --multimodal-keys")
    p.add_argument("--split", help="the split of a Hugging Face dataset directory (default: train)")
    _add_cache_flags(p)
    _add_option_flags(p)
    p.add_argument("--max-local-bytes", type=parse_size, metavar="SIZE",
                   help="budget of the local tier, e.g. 200GB (LRU eviction; the shared tier is never evicted; "
                        "default: unlimited)")
    p.add_argument("--workers", type=int, default=1, help="decoding processes on this node")
    p.add_argument("--ray", action="store_true", help="spread the work over a Ray cluster (use with a shared tier; "
                                                      "needs pip install 'vidcache[ray]')")
    p.add_argument("--ray-address", help="Ray cluster address (default: start or join a local one)")
    p.add_argument("--ray-logs", action="store_true", help="show Ray's own raylet/gcs/worker log lines here "
                                                           "(default: they stay in Ray's log directory)")
    from .loader.fetch import FetchLimits
    from .prewarming import DEFAULT_TIMEOUT_S
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per video before its worker is killed")
    p.add_argument("--max-worker-memory-mb", type=float,
                   help="RSS a worker may add while decoding one video before it is killed "
                        "(default: 80%% of this machine's RAM split among the workers)")
    p.add_argument("--max-source-mb", type=float, default=FetchLimits.max_bytes // 2**20,
                   help="largest source file fetched, in MiB")
    p.add_argument("--fetch-timeout", type=float, default=FetchLimits.timeout_s, help="seconds to fetch one source")
    from .config import CacheConfig
    from .options import DECODERS
    p.add_argument("--decoder", default=CacheConfig.decoder, choices=DECODERS, help="video decoder")
    p.add_argument("--failures", metavar="PATH", help="per-row failures JSONL, written only when a row fails "
                                                      "(default: <dataset>.failures.jsonl, or in the current directory when the "
                        "dataset's is read-only)")
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even when rows failed")
    p.add_argument("--input-key", default=INPUT_KEY, help="the row's prompt field (Miles' --input-key)")
    p.add_argument("--multimodal-keys", metavar="JSON",
                   help='Miles\' --multimodal-keys: which row fields hold the videos and images, e.g. '
                        '\'{"video": "clips", "image": "pictures"}\' (default: {"video": "videos", "image": "images"}, '
                        'a default without a column in a parquet/HF dataset dropped; images are checked as Miles '
                        'reads them, not cached)')
    p.add_argument("--no-progress", action="store_true", help="neither a bar nor progress lines")
    p.add_argument("--progress", action="store_true", help="draw the bar even when stderr is not a terminal")
    p.add_argument("--log-interval", type=float, default=30.0, metavar="S",
                   help="without a terminal (ray job submit, k8s logs): one progress line every S seconds")
    p.set_defaults(fn=cmd_prewarm)

    from . import readahead
    p = add("pull", help="bring the entries of a dataset's rows from the shared tier into this node's local tier "
                         "(before a job starts on a fresh node)")
    p.add_argument("dataset", help="the prompt file or dataset directory prewarm was given")
    p.add_argument("--split", help="the split of a Hugging Face dataset directory (default: train)")
    _add_cache_flags(p)
    _add_option_flags(p)
    p.add_argument("--input-key", default=INPUT_KEY, help="the row's prompt field (Miles' --input-key)")
    p.add_argument("--multimodal-keys", metavar="JSON", help="as for prewarm")
    p.add_argument("--depth", type=_positive, default=readahead.DEPTH, help="entries pulled at once, at most")
    p.add_argument("--max-bytes", type=_positive_size, default=readahead.MAX_BYTES, metavar="SIZE",
                   help="frames in flight at once, at most (e.g. 2GiB)")
    p.set_defaults(fn=cmd_pull)

    p = add("ls", help="list entries: source, family, T x H x W, tokens, bytes, tier")
    _add_cache_flags(p)
    p.add_argument("--json", action="store_true", help="one JSON list instead of a table")
    p.set_defaults(fn=cmd_ls)

    p = add("stats", help="entries, blobs and sizes of the local and the shared tier (a table; --json: every field)")
    _add_cache_flags(p)
    p.add_argument("--json", action="store_true", help="every field as JSON instead of a table")
    p.set_defaults(fn=cmd_stats)

    p = add("verify", help="check manifests and re-hash frames in every tier; OK/BAD per key")
    p.add_argument("keys", nargs="*", metavar="KEY", help="default: every entry of the local tier")
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR)")
    p.add_argument("--shared", nargs="?", const=True, metavar="URL",
                   help="check every entry of the shared tier (URL, or the configured $VIDCACHE_SHARED)")
    p.add_argument("--repair", action="store_true", help="quarantine bad copies; restore from a sound tier or "
                                                         "rebuild from the source")
    p.add_argument("--upgrade", action="store_true",
                   help="convert entries an older vidcache wrote to the shared tier as raw frames into one compact "
                        "object each (raw frames are deleted there only when no other entry needs them); nothing "
                        "is converted without this flag")
    p.set_defaults(fn=cmd_verify)

    p = add("evict", help="drop entries from this node (manifest, unshared frames, frozen files); --shared: "
                          "from the whole cluster")
    p.add_argument("keys", nargs="+", metavar="KEY")
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR)")
    p.add_argument("--shared", action="store_true",
                   help="also delete from the cluster's shared tier ($VIDCACHE_SHARED): every node loses the "
                        "entries (asks first)")
    p.add_argument("--yes", action="store_true", help="with --shared: do not ask")
    p.set_defaults(fn=cmd_evict)

    p = add("gc", help="evict least-recently-used local entries down to a byte budget (never the shared tier)")
    _add_cache_flags(p)
    p.add_argument("--max-local-bytes", type=parse_size, required=True, metavar="SIZE",
                   help="budget of the local tier: 20GB, 500MiB or bytes")
    p.set_defaults(fn=cmd_gc)

    p = add("inspect", help="metadata of a cached SOURCE or KEY, with its aspect distortion")
    p.add_argument("target", metavar="SOURCE|KEY", help="a path (relative, ./, file://), a URL, or a cache key")
    _add_cache_flags(p)
    _add_option_flags(p)
    p.add_argument("--contact-sheet", metavar="OUT.png", help="write a PNG of the cached frames")
    p.set_defaults(fn=cmd_inspect)

    p = add("sglang-config", help="SGLang server flags that reproduce the cache")
    _add_cache_flags(p)
    from .options import PATCH_SIZE
    from .sglang.facts import MODES
    p.add_argument("--family", choices=sorted(PATCH_SIZE), help="model family (or --model DIR)")
    p.add_argument("--model", metavar="DIR", help=MODEL_HELP)
    p.add_argument("--mode", choices=sorted(MODES), help=_mode_default_help())
    p.add_argument("--sglang-version", metavar="VERSION", help="the SGLang release the server runs (default: the "
                   "one installed here, else the newest verified)")
    p.add_argument("--format", choices=("json", "miles", "shell"), default="json",
                   help="json: the whole record; miles: a bash fragment for a Miles launch script (the SGLang "
                        "servers' env_vars as VIDCACHE_SGLANG_ENV, train.py's flags as the array "
                        "VIDCACHE_MILES_ARGS); shell: the env exported and SGLANG_ARGS, for a server started by hand")
    p.set_defaults(fn=cmd_sglang_config)

    p = add("vllm-config", help="the vLLM engine settings that reproduce the cache (docs/vllm.md)")
    p.add_argument("--format", choices=("shell", "json"), default="shell",
                   help="shell: the `vllm serve` flags, shell-quoted; json: engine kwargs, flags and per-request kwargs")
    p.add_argument("--family", choices=("qwen2_vl", "qwen2_5_vl", "qwen3_vl"),
                   help="the served model's family: plain (uncached) video files then go to vLLM's own loader for it")
    p.set_defaults(fn=cmd_vllm_config)

    p = add("tier-id", help="the shared tier's identity; --init / --restore / --new write it")
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR)")
    p.add_argument("--shared", metavar="URL", help="the shared tier (default: $VIDCACHE_SHARED)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--init", action="store_true", help="give a new, empty tier its identity (what prewarm does)")
    g.add_argument("--restore", metavar="ID", help="write back a lost identity (tier-<32 hex>: the tier of any "
                                                   "handle, plugin reference or earlier `vidcache stats`)")
    g.add_argument("--new", action="store_true", help="give a tier that lost its identity a new one (orphans "
                                                      "every handle made from it)")
    p.set_defaults(fn=cmd_tier_id)

    p = add("doctor", help="check this node: versions, settings, shared tier, decoders, SGLang plugin, Miles")
    _add_cache_flags(p)
    p.add_argument("--fast", action="store_true", help="skip importing the SGLang plugin and the Miles adapters "
                                                       "(each takes a child interpreter importing torch)")
    p.set_defaults(fn=cmd_doctor)

    from .options import PATCH_SIZE
    p = add("check-server", help="check that a live SGLang server reproduces the trainer's inputs "
                                            "(exit 0 only when parity is established)")
    p.add_argument("url", metavar="URL", help="the SGLang server, e.g. http://127.0.0.1:30000")
    _add_cache_flags(p)
    p.add_argument("--family", choices=sorted(PATCH_SIZE), help="default: derived from --processor DIR (its "
                   "processor classes and vision config) and the server's model_type")
    p.add_argument("--mode", choices=sorted(MODES), help=_mode_default_help())
    p.add_argument("--processor", metavar="DIR", help="the checkpoint's processor (default: the server's "
                                                      "tokenizer_path, when it exists here)")
    p.add_argument("--allow-unverified-sglang", metavar="VERSION",
                   help="accept this exact SGLang version although vidcache is not verified with it")
    p.add_argument("--server-torchcodec", metavar="VERSION",
                   help="stock mode on a GPU server: the torchcodec version installed there")
    p.add_argument("--token-layout", metavar="LAYOUT", help="the token layout the trainer's ids are in (default: "
                   "$VIDCACHE_TOKEN_LAYOUT, else the model's own in plugin mode and this transformers' in stock mode)")
    p.add_argument("--engine", choices=("sglang", "vllm"), default="sglang",
                   help="the server's engine (default: sglang; vllm: a vLLM OpenAI server with vidcache's loader, "
                        "docs/vllm.md)")
    p.add_argument("--allow-unverified-vllm", metavar="VERSION",
                   help="--engine vllm: accept this exact vLLM version although vidcache is not verified with it")
    p.set_defaults(fn=cmd_check_server)

    p = add("serve", help="serve frozen files over HTTP (for SGLang nodes without a shared filesystem)")
    _add_cache_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8765, help="port to listen on")
    from .sglang import facts as srv     # the server's defaults (a facts module: cheap to import)
    p.add_argument("--workers", type=int, metavar="N",
                   help=f"threads handling requests; idle connections hold none (default {srv.DEFAULT_WORKERS})")
    p.add_argument("--timeout", type=float, metavar="S",
                   help=f"close a connection idle or stalled this many seconds (default {srv.DEFAULT_TIMEOUT_S:g})")
    # A total deadline: --timeout is per read, and a client dripping a byte at a time never trips it.
    p.add_argument("--header-timeout", type=float, metavar="S",
                   help="close a connection whose request line and headers are not all in this many seconds "
                        f"after it connected (default {srv.DEFAULT_HEADER_TIMEOUT_S:g})")
    # Bounds the send of a response: a client reading a trickle would otherwise hold a worker for ever.
    p.add_argument("--min-rate", type=float, metavar="BYTES_PER_S",
                   help="close a connection that reads a response slower than this on average, after --timeout "
                        f"seconds of grace (default {srv.DEFAULT_MIN_RATE})")
    # So that one client cannot take every worker or fill the server's table of connections.
    p.add_argument("--max-per-client", type=int, metavar="N",
                   help="connections one client address may hold at once; more are refused with a 503; raise it "
                        f"for a node that fetches more files in parallel (default {srv.DEFAULT_MAX_PER_CLIENT})")
    # So that one address's slow readers cannot hold every worker (its connection cap is above the pool size).
    p.add_argument("--max-workers-per-client", type=int, metavar="N",
                   help="workers one client address may occupy at once; its further requests wait for one of "
                        "them; raise it when a single node is the only client (default half of --workers, at "
                        f"least 1: {srv.default_max_workers_per_client(srv.DEFAULT_WORKERS)} of "
                        f"{srv.DEFAULT_WORKERS})")
    p.set_defaults(fn=cmd_serve)

    p = add("demo", help="generate a small demo dataset of synthetic videos")
    p.add_argument("--dir", default="demo", help="where to write it")
    p.add_argument("--videos", type=int, default=12, help="synthetic videos")
    p.add_argument("--rows", type=int, default=24, help="dataset rows")
    p.set_defaults(fn=cmd_demo)
    return ap


# Commands that walk the node's LMDB file and end on their own.  A few damaged pages make LMDB's C code read
# past the end of its map and die of SIGBUS, which no Python can catch; run as a program (``entry``), these
# commands work in a forked child, so that death becomes the same one-line [store] error as LMDB's own checks.
WALKS = ("ls", "stats", "verify", "evict", "gc", "inspect", "doctor")


def _walk_in_child(args) -> int | None:
    """Fork: None in the child (it runs the command); in the parent, the child's exit code, with a SIGBUS
    death reported as the damaged LMDB file it is."""
    import signal
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with_parent(parent)
        return None
    # What stops the parent (kill, timeout, a scheduler stopping the pid it started) stops the child (D36: a
    # killed `verify --upgrade` went on deleting); SIGKILL cannot be caught: the child's death signal covers it.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except KeyboardInterrupt:       # Ctrl-C reached the child too: its exit is the answer
            continue
    if not os.WIFSIGNALED(status):
        return os.WEXITSTATUS(status)
    sig = signal.Signals(os.WTERMSIG(status))
    if sig == signal.SIGBUS:
        from .config import NodeLayout
        from .store.lmdb import crash_error
        e = crash_error(NodeLayout(_node_dir(args)).lmdb_dir, sig.name)
        print(f"vidcache: error: [{e.kind}] {e}", file=sys.stderr)
        return 1
    print(f"vidcache: error: [internal] `vidcache {args.cmd}` died of {sig.name}", file=sys.stderr)
    return 128 + sig.value


def _die_with_parent(parent: int) -> None:
    """In a forked child: be sent SIGTERM when the parent dies, however it dies (Linux ``PR_SET_PDEATHSIG``),
    and exit now if it already has (the race between fork and the call)."""
    import ctypes
    import signal
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)        # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):                      # not Linux: only the forwarded signals stop it
        return
    if os.getppid() != parent:
        os._exit(1)


def entry() -> None:
    """The ``vidcache`` program (and ``python -m vidcache.cli``)."""
    sys.exit(main(isolate=True))


def main(argv: list[str] | None = None, *, isolate: bool = False) -> int:
    """Run one command; ``isolate`` (the program, not an in-process call) runs LMDB walks in a child."""
    from .errors import VidcacheError
    args = build_parser().parse_args(argv)
    if isolate and args.cmd in WALKS and hasattr(os, "fork") \
            and (code := _walk_in_child(args)) is not None:
        return code
    try:
        return args.fn(args)
    except KeyboardInterrupt:                 # a second Ctrl-C (the first is the command's to handle)
        print(f"\nvidcache {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except VidcacheError as e:
        print(f"vidcache: error: [{e.kind}] {e}", file=sys.stderr)
        if os.environ.get("VIDCACHE_DEBUG"):
            raise
        print("set VIDCACHE_DEBUG=1 for a full traceback", file=sys.stderr)
        return 1


if __name__ == "__main__":
    entry()
