"""The commands on what a cache holds: ``ls``, ``stats``, ``verify`` (and ``--repair``/``--upgrade``),
``evict``, ``gc`` and ``inspect``."""
from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import threading

from .common import (add_cache_flags, add_option_flags, cache_of, check_local_budget, command, has_local, node_dir,
                     options_of, parse_size)
from .datasets import _positive
from .prefixes import MIN_PREFIX, full_key, key_stem, streamed_prefixes

# Entries checked at once by ``verify`` (not ``--repair``): a shared tier's check is round trips (the manifest, the
# object: GETs on S3) and a decode that lets go of the GIL; one after another, S3 (moto) took 40 ms an entry.
VERIFY_WORKERS = 8


def _add_ls(sub) -> None:
    p = command(sub, "ls", help="list entries: source, family, T x H x W, tokens, bytes, tier")
    add_cache_flags(p)
    p.add_argument("--json", action="store_true", help="one JSON list instead of a table")
    p.set_defaults(fn=cmd_ls)


def cmd_ls(args) -> int:
    from operator import itemgetter

    from .. import catalog
    run = _ThisNodeIfTierDown(cache_of(args, read_only=True), "listing")
    if args.json:                                       # the same text as json.dumps(list, indent=2)
        first = True
        # Rows are printed as their manifests are read (issue 50: at 10^5 entries nothing came before all were read).
        for r in run(lambda c: catalog.iter_listing(c, catalog.tiered_entries(c))):
            body = json.dumps(r, indent=2).replace("\n", "\n  ")
            print(("[\n  " if first else ",\n  ") + body, end="")
            first = False
        print("[]" if first else "\n]")
        return 0
    # KEY: the shortest prefix unique among every key `inspect` / `evict` complete over (one clip under two option
    # sets shares its first 32 digits: 16 alone could not tell them apart), made as the merged listing passes (a
    # key's prefix needs only its neighbours).  The column's width is the longest of them: a first walk of the
    # names, so that neither walk holds them (issue 50: ~1.3 kB an entry before, its names, sets and table).
    width = run(lambda c: max([MIN_PREFIX] + [len(p) for _, p in streamed_prefixes(
        catalog.tiered_entries(c), key=itemgetter(0))])) + 2
    print(f"{'KEY':<{width}} {'FAMILY':<10} {'T x H x W':>16} {'FPS':>5} {'TOKENS':>7} {'BYTES':>9} {'TIER':<12} "
          "SOURCE", flush=True)

    def rows(c):        # the listings are made in the call (run's fallback sees a tier that is down), read after
        entries, srcs = catalog.tiered_entries(c), catalog.sources_by_digest(c.store)
        return ((short, r) for (key, tiers), short in streamed_prefixes(entries, key=itemgetter(0))
                if (r := catalog.entry_record(c, key, tiers, srcs)) is not None)
    count = total = 0
    for short, r in run(rows):
        src = ", ".join(r["sources"]) or "-"
        fps = f"{r['fps']:.3g}" if r.get("fps") is not None else "-"
        print(f"{short + '..':<{width}} {r['family']:<10} {r['frames']:>4} x {r['height']:>4} x "
              f"{r['width']:>4} {fps:>5} {r['tokens']:>7} {_human(r['bytes']):>9} {'+'.join(r['tiers']):<12} {src}")
        count, total = count + 1, total + r["bytes"]
    print(f"{count} entr{'y' if count == 1 else 'ies'}, {_human(total)}")
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
        self._lock = threading.Lock()     # verify's threads call it at once: one identity lookup, one warning

    def __call__(self, fn):
        from ..errors import SharedUnavailableError
        if self.alone is None:
            try:
                with self._lock:
                    self.cache.identity   # where the tier is down, the remembered one (shared_unreachable set)
                if (e := self.cache.shared_unreachable) is None:
                    return fn(self.cache)
            except SharedUnavailableError as err:
                e = err
            if self.cache.shared is None or not has_local(self.cache.path):    # a fresh node has none
                raise e
            with self._lock:
                if self.alone is None:
                    print(f"vidcache: warning: {e}; {self.doing} this node's own copies only", file=sys.stderr)
                    self.alone = self.cache.with_settings(shared=None)
        return fn(self.alone)


def _add_stats(sub) -> None:
    p = command(sub, "stats",
                help="entries, blobs and sizes of the local and the shared tier (a table; --json: every field)")
    add_cache_flags(p)
    p.add_argument("--json", action="store_true", help="every field as JSON instead of a table")
    p.set_defaults(fn=cmd_stats)


def cmd_stats(args) -> int:
    st = cache_of(args, read_only=True).stats()
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


def _add_verify(sub) -> None:
    p = command(sub, "verify", help="check manifests and re-hash frames in every tier; OK/BAD per key")
    p.add_argument("keys", nargs="*", metavar="KEY", help="default: every entry of the local tier")
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR)")
    p.add_argument("--shared", nargs="?", const=True, metavar="URL",
                   help="check every entry of the shared tier (URL, or the configured $VIDCACHE_SHARED)")
    p.add_argument("--sample", type=_positive, metavar="N",
                   help="check N entries drawn at random from the tier instead of every one (a spot check whose "
                        "cost does not grow with the tier's size beyond its listing)")
    p.add_argument("--workers", type=_positive, default=VERIFY_WORKERS, metavar="N",
                   help=f"entries checked at once, printed in order (default {VERIFY_WORKERS}; --repair: one at a "
                        "time)")
    p.add_argument("--repair", action="store_true", help="quarantine bad copies; restore from a sound tier or "
                                                         "rebuild from the source")
    p.add_argument("--upgrade", action="store_true",
                   help="convert entries an older vidcache wrote to the shared tier as raw frames into one compact "
                        "object each (raw frames are deleted there only when no other entry needs them); nothing "
                        "is converted without this flag")
    p.add_argument("--embeddings", action="store_true",
                   help="check the embedding tier's records too (`vidcache embed`): this node's, and the shared "
                        "tier's with --shared; --repair moves bad copies aside and restores them from a sound one")
    p.set_defaults(fn=cmd_verify)


def cmd_verify(args) -> int:
    from ..errors import VidcacheError
    whole_shared = args.shared is not None
    if args.shared is True:
        args.shared = None              # bare --shared: the configured tier
    if args.sample is not None and (args.keys or args.upgrade):
        from ..errors import ConfigError
        raise ConfigError("--sample draws from every entry of a tier: give it without KEYs and without --upgrade")
    if args.upgrade and not whole_shared:
        from ..errors import ConfigError
        raise ConfigError("--upgrade converts the shared tier: give it with --shared (and VIDCACHE_SHARED or a URL)")
    cache = cache_of(args, read_only=not (args.repair or args.upgrade))
    if args.keys:
        todo = args.keys
    else:
        tier = cache.shared if whole_shared else cache.local
        if whole_shared and tier is None:
            from ..errors import ConfigError
            raise ConfigError("--shared: this cache has no shared tier (give --shared URL or set VIDCACHE_SHARED)")
        if whole_shared:
            cache.identity                     # reads the tier's record; where the tier is not there, ...
            if cache.shared_unreachable is not None:
                raise cache.shared_unreachable     # ... an empty listing of it would verify nothing
        from .. import keys as k
        todo, listed = [], 0
        draw = random.Random()
        for sk in tier.keys(k.AC):
            try:
                key = k.entry_key(sk)
            except VidcacheError:
                print(f"BAD {sk!r}: not a key of the cache's format")
                continue
            listed += 1
            if args.sample is None:
                todo.append(key)
            elif len(todo) < args.sample:          # reservoir sampling: N keys in memory, each equally likely
                todo.append(key)
            elif (j := draw.randrange(listed)) < args.sample:
                todo[j] = key
        if args.sample is not None:
            print(f"verify: checking {len(todo)} of {listed} entries, drawn at random")
    bad, run = 0, (lambda fn: fn(cache)) if whole_shared else _ThisNodeIfTierDown(cache, "checking")
    # one listing of the frozen files for the walk, not one per entry (a repair changes them: listed per entry)
    with contextlib.nullcontext() if args.repair else cache.frozen.listed():
        bad = _verify_each(cache, todo, run, args.repair, args.workers)
    print(f"verify: {len(todo) - bad} ok, {bad} bad" + (" (repair attempted)" if args.repair and bad else ""))
    if args.embeddings:
        bad += _verify_embeddings(cache, args.repair, whole_shared)
    if args.upgrade:
        from ..prewarming import Interrupt
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


def _verify_embeddings(cache, repair: bool, shared: bool) -> int:
    """``verify --embeddings``: every record's copies (``EmbeddingTier.verify``); the count of bad ones."""
    from ..embeddings.tier import EmbeddingTier
    tier = EmbeddingTier(cache)
    found = tier.verify(repair=repair, shared=shared)
    bad = 0
    for emb_id, problems in found.items():
        if problems:
            bad += 1
            after = (" -> repaired" if not tier.verify([emb_id])[emb_id] else " -> still bad") if repair else ""
            print(f"BAD emb {emb_id}: {'; '.join(problems)}{after}")
        else:
            print(f"OK  emb {emb_id}")
    print(f"verify embeddings: {len(found) - bad} ok, {bad} bad")
    return bad


def _checked_in_order(check, todo: list[str], workers: int):
    """(key, its problems) for each key of ``todo`` in order, ``check`` running in ``workers`` threads at most
    ``2 * workers`` keys ahead of the one printed (a window, not a future per entry: 10^6 keys are 10^6 futures)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor
    if workers <= 1:
        yield from ((key, check(key)) for key in todo)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="vidcache-verify") as pool:
        window: deque = deque()
        for key in todo:
            window.append((key, pool.submit(check, key)))
            if len(window) >= 2 * workers:
                k, fut = window.popleft()
                yield k, fut.result()
        while window:
            k, fut = window.popleft()
            yield k, fut.result()


def _verify_each(cache, todo: list[str], run, repair: bool, workers: int = VERIFY_WORKERS) -> int:
    """``OK``/``BAD`` per key, in order, as each is checked (``workers`` at once; one at a time under
    ``--repair``, whose repairs change what the next check reads); the number bad."""
    from ..errors import VidcacheError

    def check(key: str) -> list[str]:
        try:       # during a tier outage this node's copies are still checked; `verify --shared` fails
            return run(lambda c: c.verify(key, repair=repair))
        except VidcacheError as e:
            return [f"[{e.kind}] {e}"]

    bad = 0
    for key, problems in _checked_in_order(check, todo, 1 if repair else workers):
        if problems and repair and any("frozen file" in p for p in problems):
            from ..sglang.frozen import repair_frozen      # remakes frozen files from the frames (imports torch)
            with contextlib.suppress(VidcacheError):
                repair_frozen(cache, key)
        if problems:
            bad += 1
            after = (" -> repaired" if not cache.verify(key) else " -> still bad") if repair else ""
            print(f"BAD {key}: {'; '.join(problems)}{after}")
        else:
            print(f"OK  {key}")
    return bad


def _add_evict(sub) -> None:
    p = command(sub, "evict", help="drop entries from this node (manifest, unshared frames, frozen files); "
                                   "--shared: from the whole cluster")
    p.add_argument("keys", nargs="+", metavar="KEY")
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR)")
    p.add_argument("--shared", action="store_true",
                   help="also delete from the cluster's shared tier ($VIDCACHE_SHARED): every node loses the "
                        "entries (asks first)")
    p.add_argument("--yes", action="store_true", help="with --shared: do not ask")
    p.set_defaults(fn=cmd_evict)


def cmd_evict(args) -> int:
    from .. import keys as k
    for key in args.keys:
        if key_stem(key) is None:
            k.check_key(key)
    path = node_dir(args)
    if not args.shared and not has_local(path):
        for key in args.keys:            # a fresh node holds nothing: nothing to evict, nothing created
            print(f"absent  {key}")
        return 0
    cache = cache_of(args)
    args.keys = [full_key(cache, key) for key in args.keys]
    if args.shared:
        from ..errors import ConfigError
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


def _add_gc(sub) -> None:
    p = command(sub, "gc",
                help="evict least-recently-used local entries down to a byte budget (never the shared tier)")
    add_cache_flags(p)
    p.add_argument("--max-local-bytes", type=parse_size, required=True, metavar="SIZE",
                   help="budget of the local tier: 20GB, 500MiB or bytes")
    p.add_argument("--json", action="store_true", help="the counts as JSON (evicted: local objects, frames and "
                                                       "manifests; entries_evicted: entries gone from this node)")
    p.set_defaults(fn=cmd_gc)


def cmd_gc(args) -> int:
    check_local_budget(args.max_local_bytes)
    path = node_dir(args)
    if not has_local(path):
        out = {"evicted": 0, "freed_bytes": 0, "used_bytes": 0, "entries_evicted": 0}
    else:
        out = cache_of(args).gc(args.max_local_bytes)
    print(json.dumps(out, indent=2) if args.json else gc_line(out, args.max_local_bytes))
    return 0


def gc_line(out: dict, budget: int) -> str:
    """``gc`` for a person: entries are what a user counts; ``evicted`` counts local objects (frames, records),
    and with a shared tier only frames may go, the entry staying readable from there."""
    within = f"the local tier uses {_human(out['used_bytes'])} of its {_human(budget)} budget"
    if not out["evicted"]:
        return f"gc: nothing evicted: {within}"
    gone, n = out["entries_evicted"], out["evicted"]
    what = (f"{gone} entr{'y' if gone == 1 else 'ies'} ({n} local objects)" if gone else
            f"{n} local objects (their entries stay readable from the shared tier)")
    return f"gc: evicted {what}, freed {_human(out['freed_bytes'])}; {within}"


def _add_inspect(sub) -> None:
    p = command(sub, "inspect", help="metadata of a cached SOURCE or KEY, with its aspect distortion")
    p.add_argument("target", metavar="SOURCE|KEY", help="a path (relative, ./, file://), a URL, or a cache key")
    add_cache_flags(p)
    add_option_flags(p)
    p.add_argument("--contact-sheet", metavar="OUT.png", help="write a PNG of the cached frames")
    p.add_argument("--json", action="store_true", help="the whole manifest as JSON instead of the summary")
    p.set_defaults(fn=cmd_inspect)


def cmd_inspect(args) -> int:
    import dataclasses

    from ..errors import InvalidKeyError
    from ..loader.fetch import canonical_source
    cache = cache_of(args, read_only=True)
    target = args.target
    as_key = not os.path.exists(target) and key_stem(target) is not None
    try:
        if not as_key:
            m = cache.manifest(target)
        else:                              # a key, or a prefix of one as `ls` prints it: its errors are the answer
            m = cache.manifest(full_key(cache, target))
            if m is None:
                raise InvalidKeyError(f"no cached entry has the key {target}")
    except InvalidKeyError:
        if as_key:
            raise
        m = None
        options = options_of(args)        # the core spells the source one way (loader.fetch.canonical_source)
        if (key := cache.find(target, options)) is not None:
            m = cache.manifest(key)
        else:
            cached = cache.options_cached_for(target)
            if cached:
                shown = "; ".join(_option_flags(o) for o in cached)
                print(f"{target} is not cached for these options; it is cached under: {shown}", file=sys.stderr)
                return 1
    if m is None:
        print(f"{target!r} is neither a cached key nor a cached source for these options "
              f"(prewarm it first)", file=sys.stderr)
        return 1
    s = m.source
    aspect = {"source": f"{s.width_from_decoder}x{s.height_from_decoder} "
                        f"({s.width_from_decoder / s.height_from_decoder:.3f}:1)",
              "stored": f"{m.width}x{m.height} ({m.width / m.height:.3f}:1)",
              "distortion": round(m.aspect_distortion, 4)}
    if args.json:
        out = dataclasses.asdict(m)
        idx = out["sampling"]["frame_indices"]
        out["sampling"]["frame_indices"] = list(idx[:16]) + (["..."] if len(idx) > 16 else [])
        print(json.dumps({**out, "aspect": aspect}, indent=2))
    else:
        print(_inspect_summary(m, aspect, None if as_key else canonical_source(target)))
    if args.contact_sheet:
        from ..contact_sheet import contact_sheet
        contact_sheet(cache.frames(m.key), m).save(args.contact_sheet)
        print(f"contact sheet: {args.contact_sheet}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _inspect_summary(m, aspect: dict, source: str | None) -> str:
    """``inspect`` for a person: what a trainer or an engine gets from the entry, in a few lines."""
    s, t = m.source, m.tokens
    decoder = m.provenance.get("decoder")
    lines = [f"key:      {m.key}"] + ([f"source:   {source}"] if source else []) + [
        f"family:   {m.family}, sampled at {m.sampling.sample_fps:.3g} fps",
        f"frames:   {m.num_frames} x {m.height} x {m.width} (T x H x W) of {s.num_frames_from_decoder} "
        f"{s.codec} frames at {s.average_fps_from_decoder:.3g} fps",
        f"tokens:   {t.video_pad_tokens} video tokens (grid {' x '.join(map(str, t.video_grid_thw))})",
        f"aspect:   source {aspect['source']}, stored {aspect['stored']}, distortion {aspect['distortion']}",
        f"decoder:  {decoder or '?'} {m.provenance.get('decoder_version', '')}".rstrip(),
        "(--json: the whole manifest)"]
    return "\n".join(lines)


def _option_flags(opts: dict) -> str:
    """Options as the CLI flags that select them (only those that differ from the defaults)."""
    from ..options import VideoOptions
    default = VideoOptions(family=opts.get("family", "qwen2_5_vl")).resolved().to_dict()
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in opts.items()
                    if v is not None and (k == "family" or v != default.get(k)))
