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
    g = p.add_argument_group("video options (qwen-vl-utils semantics; defaults resolved explicitly)")
    g.add_argument("--family", default="qwen2_5_vl", choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    g.add_argument("--fps", type=float)
    g.add_argument("--nframes", type=int)
    g.add_argument("--min-frames", type=int)
    g.add_argument("--max-frames", type=int)
    g.add_argument("--min-pixels", type=int)
    g.add_argument("--max-pixels", type=int)
    g.add_argument("--total-pixels", type=float)
    g.add_argument("--size-factor", type=int, help="resize grid (default: 28, or 224 for qwen3_vl; see README)")


def _options(args):
    from .options import VideoOptions
    keys = ("family", "fps", "nframes", "min_frames", "max_frames", "min_pixels", "max_pixels", "total_pixels",
            "size_factor")
    return VideoOptions(**{k: getattr(args, k) for k in keys if getattr(args, k) is not None})


def _cache(args, read_only: bool = False):
    from .cache import VideoCache, default_cache_dir
    return VideoCache(args.cache or default_cache_dir(), decoder=getattr(args, "decoder", "decord"),
                      shared=getattr(args, "shared", None), read_only=read_only)


def cmd_prewarm(args) -> int:
    from .loader.fetch import FetchLimits
    from .prewarm import prewarm

    keys = json.loads(args.multimodal_keys) if args.multimodal_keys else {"video": "videos"}
    cache = _cache(args)
    cache.limits = FetchLimits(max_bytes=int(args.max_source_mb * 2**20), timeout_s=args.fetch_timeout)
    failures = args.failures or os.path.splitext(os.path.abspath(args.dataset))[0] + ".failures.jsonl"
    common = dict(timeout_s=args.timeout, failures_path=failures, input_key=args.input_key,
                  max_worker_memory=int(args.max_worker_memory_mb * 2**20) if args.max_worker_memory_mb else None,
                  progress=not args.no_progress and sys.stderr.isatty() or args.progress,
                  video_key=keys.get("video", "videos"))
    if args.ray:
        from .prewarm import prewarm_ray
        s = prewarm_ray(args.dataset, cache, _options(args), ray_address=args.ray_address, **common)
    else:
        s = prewarm(args.dataset, cache, _options(args), workers=args.workers, **common)
    print(s.line())
    if s.failed:
        print(f"failures: {failures}")
        for f in s.failures[:5]:
            print(f"  row {f['row']}: [{f['kind']}] {f['error']}")
    return 0 if (s.failed == 0 or args.allow_failures) else 1


def cmd_stats(args) -> int:
    print(json.dumps(_cache(args, read_only=True).stats(), indent=2))
    return 0


def cmd_verify(args) -> int:
    from .errors import VidcacheError
    cache = _cache(args, read_only=True)
    keys = args.keys or [k[3:] for k in cache.store.keys("ac/")]
    bad = 0
    for key in keys:
        try:
            cache.verify(key)
        except VidcacheError as e:
            bad += 1
            print(f"BAD {key}: [{e.kind}] {e}")
    print(f"verify: {len(keys) - bad} ok, {bad} bad")
    return 1 if bad else 0


def cmd_inspect(args) -> int:
    cache = _cache(args)
    target = args.target
    m = cache.manifest(target)
    if m is None:
        key = cache.lookup(target, _options(args))
        if key is None:
            print(f"{target!r} is neither a cached key nor a cached source for these options "
                  f"(prewarm it first)", file=sys.stderr)
            return 1
        m = cache.manifest(key)
    out = {k: m[k] for k in ("key", "source_digest", "options", "frames", "tokens", "provenance")}
    out["video"] = {k: v for k, v in m["video"].items() if k != "frame_indices"}
    out["video"]["frame_indices"] = m["video"]["frame_indices"][:16] + (["..."] if m["video"]["num_frames"] > 16 else [])
    print(json.dumps(out, indent=2))
    if args.contact_sheet:
        from .contact_sheet import contact_sheet
        contact_sheet(cache.frames(m["key"]), m).save(args.contact_sheet)
        print(f"contact sheet: {args.contact_sheet}")
    return 0


def cmd_sglang_config(args) -> int:
    from .sglang.config import sglang_config
    print(json.dumps(sglang_config(args.family, args.mode, args.cache), indent=2))
    return 0


def cmd_serve(args) -> int:
    from .server import make_server
    srv = make_server(_cache(args), args.host, args.port)
    host, port = srv.server_address[:2]
    print(f"serving frozen files of {args.cache or 'the default cache'} at http://{host}:{port}/frozen/<key>.mkv",
          flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
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
    cache_help = "cache directory (default: $VIDCACHE_DIR or ~/.cache/vidcache)"

    p = sub.add_parser("prewarm", help="decode, sample and resize every video of a JSONL dataset into the cache")
    p.add_argument("dataset")
    p.add_argument("--cache", help=cache_help)
    _add_option_flags(p)
    p.add_argument("--shared", metavar="URL",
                   help="shared tier (NFS path or s3://bucket/prefix) behind the local LMDB; remembered by the cache")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--ray", action="store_true", help="spread the work over a Ray cluster (use with --shared)")
    p.add_argument("--ray-address", help="Ray cluster address (default: start or join a local one)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per video before its worker is killed")
    p.add_argument("--max-worker-memory-mb", type=float, default=16384,
                   help="RSS a worker may add while decoding one video before it is killed")
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
    p.add_argument("--cache", help=cache_help)
    p.set_defaults(fn=cmd_stats)

    p = sub.add_parser("verify", help="re-hash cached frames against their digests")
    p.add_argument("keys", nargs="*", metavar="KEY", help="default: every entry")
    p.add_argument("--cache", help=cache_help)
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("inspect", help="metadata of a cached SOURCE or KEY")
    p.add_argument("target", metavar="SOURCE|KEY")
    p.add_argument("--cache", help=cache_help)
    _add_option_flags(p)
    p.add_argument("--contact-sheet", metavar="OUT.png")
    p.set_defaults(fn=cmd_inspect)

    p = sub.add_parser("sglang-config", help="SGLang server flags that reproduce the cache")
    p.add_argument("--cache", help=cache_help)
    p.add_argument("--family", required=True, choices=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    p.add_argument("--mode", default="stock", choices=["stock", "plugin"])
    p.set_defaults(fn=cmd_sglang_config)

    p = sub.add_parser("serve", help="serve frozen files over HTTP (for SGLang nodes without a shared filesystem)")
    p.add_argument("--cache", help=cache_help)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8765)
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
