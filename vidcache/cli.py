"""The ``vidcache`` command: prewarm, stats, inspect, sglang-config, demo.

The only module that reads environment variables or draws progress bars.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

EXAMPLES = """examples:
  vidcache demo --dir demo && vidcache prewarm demo/dataset.jsonl --cache demo/cache --workers 2
  vidcache prewarm train.jsonl --family qwen2_5_vl --fps 2 --max-pixels 200704 --failures failures.jsonl
  vidcache inspect clip.mp4 --family qwen3_vl --contact-sheet clip.png
  vidcache sglang-config --family qwen2_5_vl --mode plugin
"""


def _add_option_flags(p: argparse.ArgumentParser) -> None:
    from .options import PATCH_SIZE, VideoOptions
    g = p.add_argument_group("video options (qwen-vl-utils semantics; defaults resolved explicitly)")
    g.add_argument("--family", default="qwen2_5_vl", choices=sorted(PATCH_SIZE))
    for name, typ in VideoOptions.flag_fields():
        g.add_argument("--" + name.replace("_", "-"), type=typ, dest=name)


def _options(args):
    from .options import VideoOptions
    names = ["family"] + [n for n, _ in VideoOptions.flag_fields()]
    return VideoOptions(**{k: getattr(args, k) for k in names if getattr(args, k, None) is not None})


def _add_cache_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR or "
                                                  "~/.cache/vidcache); never on a network filesystem")
    p.add_argument("--shared", metavar="URL", help="the cluster's shared tier: an NFS path or s3://bucket/prefix "
                                                   "(default: $VIDCACHE_SHARED, else what the directory recorded)")


def _cache(args, read_only: bool = False, **settings):
    from .cache import VideoCache
    from .config import default_cache_dir
    path = os.path.abspath(os.path.expanduser(args.cache or default_cache_dir()))
    if read_only and not os.path.exists(os.path.join(path, "lmdb", "data.mdb")):
        from .errors import ConfigError
        raise ConfigError(f"no vidcache cache at {path} (nothing was created there)")
    return VideoCache(path, shared=getattr(args, "shared", None), read_only=read_only,
                      decoder=getattr(args, "decoder", "decord"), **settings)


def cmd_prewarm(args) -> int:
    from .loader.fetch import FetchLimits
    from .prewarm import default_worker_memory, prewarm

    keys = json.loads(args.multimodal_keys) if args.multimodal_keys else {"video": "videos"}
    cache = _cache(args, limits=FetchLimits(max_bytes=int(args.max_source_mb * 2**20), timeout_s=args.fetch_timeout),
                   max_local_bytes=args.max_local_bytes)
    options = _options(args)
    print(f"prewarm: {_path_note(options)}", file=sys.stderr)
    failures = args.failures or os.path.splitext(os.path.abspath(args.dataset))[0] + ".failures.jsonl"
    memory = int(args.max_worker_memory_mb * 2**20) if args.max_worker_memory_mb else default_worker_memory(
        args.workers)
    s = prewarm(args.dataset, cache, options, workers=args.workers, timeout_s=args.timeout, failures_path=failures,
                input_key=args.input_key, max_worker_memory=memory,
                progress=not args.no_progress and sys.stderr.isatty() or args.progress,
                video_key=keys.get("video", "videos"), ray=args.ray, ray_address=args.ray_address)
    print(s.line())
    if s.failed:
        print(f"failures: {failures}")
        for f in s.failures[:5]:
            print(f"  row {f['row']}: [{f['kind']}] {f['error']}")
    return 0 if (s.failed == 0 or args.allow_failures) else 1


def _path_note(options) -> str:
    """Which SGLang path these options allow (issue: say it before the work, not at serving time)."""
    from .serving import stock_sglang_problems
    r = options.resolved()
    if stock_sglang_problems(options.family, r.size_factor):
        return (f"{options.family} on the {r.size_factor}-pixel grid (faithful aspect ratios): SGLang plugin mode "
                "only (`vidcache sglang-config --mode plugin`); stock SGLang would resize these frames")
    return f"{options.family} on the {r.size_factor}-pixel grid: SGLang stock and plugin modes"


def cmd_stats(args) -> int:
    print(json.dumps(_cache(args, read_only=True).stats(), indent=2))
    return 0


def cmd_verify(args) -> int:
    from .errors import VidcacheError
    whole_shared = args.shared is not None
    if args.shared is True:
        args.shared = None              # bare --shared: the configured tier
    cache = _cache(args, read_only=not args.repair)
    if args.keys:
        todo = args.keys
    else:
        tier = cache.shared if whole_shared else cache.local
        if whole_shared and tier is None:
            from .errors import ConfigError
            raise ConfigError("--shared: this cache has no shared tier (give --shared URL or set VIDCACHE_SHARED)")
        from . import keys as k
        todo = []
        for sk in tier.keys(k.AC):
            try:
                todo.append(k.entry_key(sk))
            except VidcacheError:
                print(f"BAD {sk!r}: not a key of the cache's format")
    bad = 0
    for key in todo:
        try:
            problems = cache.verify(key, repair=args.repair)
        except VidcacheError as e:
            problems = [f"[{e.kind}] {e}"]
        if problems:
            bad += 1
            after = (" -> repaired" if not cache.verify(key) else " -> still bad") if args.repair else ""
            print(f"BAD {key}: {'; '.join(problems)}{after}")
        else:
            print(f"OK  {key}")
    print(f"verify: {len(todo) - bad} ok, {bad} bad" + (" (repair attempted)" if args.repair and bad else ""))
    return 1 if bad else 0


def cmd_evict(args) -> int:
    cache = _cache(args)
    for key in args.keys:
        print(f"{'evicted' if cache.evict(key) else 'absent '} {key}")
    return 0


def cmd_gc(args) -> int:
    cache = _cache(args)
    print(json.dumps(cache.gc(args.max_local_bytes), indent=2))
    return 0


def cmd_inspect(args) -> int:
    import dataclasses

    from .errors import InvalidKeyError
    cache = _cache(args, read_only=True)
    target = args.target
    try:
        m = cache.manifest(target)
    except InvalidKeyError:
        m = None
        key = cache.lookup(target, _options(args))
        m = cache.manifest(key) if key is not None else None
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


def cmd_sglang_config(args) -> int:
    from .sglang.config import sglang_config
    cache = _cache(args, read_only=True) if (args.cache or os.environ.get("VIDCACHE_DIR")) else None
    cfg = sglang_config(args.family, args.mode, cache)
    print(json.dumps(cfg, indent=2))
    if args.family == "qwen3_vl" and cfg["mode"] == "stock":
        print("note: stock mode serves Qwen3-VL only on the 224 grid (VideoOptions.for_stock_sglang), which "
              "distorts aspect ratios; the default 32-grid frames need --mode plugin", file=sys.stderr)
    return 0


def cmd_check_server(args) -> int:
    from .sglang.check import check_server
    cache = _cache(args) if (args.cache or args.shared) else None       # default: this node's configuration
    res = check_server(args.url, args.family, args.mode, args.processor, args.allow_unverified_sglang,
                       args.server_torchcodec, cache=cache)
    print("\n".join(res.lines()))
    return 0 if res.ok else 1


def cmd_serve(args) -> int:
    from .sglang.server import make_server
    limits = {k: v for k, v in (("workers", args.workers), ("timeout_s", args.timeout)) if v is not None}
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
    from .testing.demo import make_demo_dataset
    path = make_demo_dataset(args.dir, n_videos=args.videos, n_rows=args.rows)
    print(f"demo dataset: {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vidcache", description="Content-addressed video frame cache for VLM RL.",
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("prewarm", help="decode, sample and resize every video of a JSONL dataset into the cache")
    p.add_argument("dataset")
    _add_cache_flags(p)
    _add_option_flags(p)
    p.add_argument("--max-local-bytes", type=int, help="byte budget of the local tier (LRU eviction; the shared "
                                                       "tier is never evicted)")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--ray", action="store_true", help="spread the work over a Ray cluster (use with --shared)")
    p.add_argument("--ray-address", help="Ray cluster address (default: start or join a local one)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per video before its worker is killed")
    p.add_argument("--max-worker-memory-mb", type=float,
                   help="RSS a worker may add while decoding one video before it is killed "
                        "(default: 80%% of this machine's RAM split among the workers)")
    p.add_argument("--max-source-mb", type=float, default=4096)
    p.add_argument("--fetch-timeout", type=float, default=300.0)
    p.add_argument("--decoder", default="decord", choices=["decord", "torchcodec"])
    p.add_argument("--failures", help="per-row failures JSONL (default: <dataset>.failures.jsonl)")
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even when rows failed")
    p.add_argument("--input-key", default="prompt")
    p.add_argument("--multimodal-keys", help='JSON, Miles style: {"video": "videos"}')
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--progress", action="store_true", help="draw the bar even when stderr is not a terminal")
    p.set_defaults(fn=cmd_prewarm)

    p = sub.add_parser("stats", help="entries, blobs and sizes of a cache")
    _add_cache_flags(p)
    p.set_defaults(fn=cmd_stats)

    p = sub.add_parser("verify", help="check manifests and re-hash frames in every tier; OK/BAD per key")
    p.add_argument("keys", nargs="*", metavar="KEY", help="default: every entry of the local tier")
    p.add_argument("--cache", metavar="DIR", help="node-local cache directory (default: $VIDCACHE_DIR)")
    p.add_argument("--shared", nargs="?", const=True, metavar="URL",
                   help="check every entry of the shared tier (URL, or the configured $VIDCACHE_SHARED)")
    p.add_argument("--repair", action="store_true", help="quarantine bad copies; restore from a sound tier or "
                                                         "rebuild from the source")
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("evict", help="drop entries (manifest and frames) from every tier")
    p.add_argument("keys", nargs="+", metavar="KEY")
    _add_cache_flags(p)
    p.set_defaults(fn=cmd_evict)

    p = sub.add_parser("gc", help="evict least-recently-used local entries down to a byte budget")
    _add_cache_flags(p)
    p.add_argument("--max-local-bytes", type=int, required=True)
    p.set_defaults(fn=cmd_gc)

    p = sub.add_parser("inspect", help="metadata of a cached SOURCE or KEY, with its aspect distortion")
    p.add_argument("target", metavar="SOURCE|KEY")
    _add_cache_flags(p)
    _add_option_flags(p)
    p.add_argument("--contact-sheet", metavar="OUT.png")
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("sglang-config", help="SGLang server flags that reproduce the cache")
    _add_cache_flags(p)
    p.add_argument("--family", required=True, choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    p.add_argument("--mode", choices=["stock", "plugin"], help="default: plugin for qwen3_vl, stock otherwise")
    p.set_defaults(fn=cmd_sglang_config)

    from .options import PATCH_SIZE
    p = sub.add_parser("check-server", help="check that a live SGLang server reproduces the trainer's inputs "
                                            "(exit 0 only when parity is established)")
    p.add_argument("url", metavar="URL", help="the SGLang server, e.g. http://127.0.0.1:30000")
    _add_cache_flags(p)
    p.add_argument("--family", choices=sorted(PATCH_SIZE), help="default: from the server's model_type")
    p.add_argument("--mode", choices=["stock", "plugin"], help="default: plugin for qwen3_vl, stock otherwise")
    p.add_argument("--processor", metavar="DIR", help="the checkpoint's processor (default: the server's "
                                                      "tokenizer_path, when it exists here)")
    p.add_argument("--allow-unverified-sglang", metavar="VERSION",
                   help="accept this exact SGLang version although vidcache is not verified with it")
    p.add_argument("--server-torchcodec", metavar="VERSION",
                   help="stock mode on a GPU server: the torchcodec version installed there")
    p.set_defaults(fn=cmd_check_server)

    p = sub.add_parser("serve", help="serve frozen files over HTTP (for SGLang nodes without a shared filesystem)")
    _add_cache_flags(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
    # Defaults live in vidcache.sglang.server (not imported here: the CLI imports lazily).
    p.add_argument("--workers", type=int, metavar="N",
                   help="threads handling requests; idle connections hold none (default 16)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="close a connection idle or stalled this many seconds (default 30)")
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("demo", help="generate a small demo dataset of synthetic videos")
    p.add_argument("--dir", default="demo")
    p.add_argument("--videos", type=int, default=12)
    p.add_argument("--rows", type=int, default=24)
    p.set_defaults(fn=cmd_demo)
    return ap


def main(argv: list[str] | None = None) -> int:
    from .errors import VidcacheError
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except VidcacheError as e:
        print(f"vidcache: error: [{e.kind}] {e}", file=sys.stderr)
        if os.environ.get("VIDCACHE_DEBUG"):
            raise
        print("set VIDCACHE_DEBUG=1 for a full traceback", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
