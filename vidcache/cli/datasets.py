"""The commands that read a dataset's rows: ``prewarm`` (decode every video into the cache), ``pull`` (bring a
dataset's entries from the shared tier onto this node) and ``demo`` (write a small dataset to try them on)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from ..errors import INSTALL_RAY
from .common import (add_cache_flags, add_option_flags, cache_of, check_local_budget, command, options_of,
                     parse_size)


def _dataset_command(sub, name: str, help: str,
                     dataset_help: str = "the prompt file or dataset directory prewarm was given"):
    """A job over a dataset's rows (prewarm, pull, embed): the dataset and its split, the cache, the options."""
    p = command(sub, name, help=help)
    p.add_argument("dataset", help=dataset_help)
    p.add_argument("--split", help="the split of a Hugging Face dataset directory (default: train)")
    add_cache_flags(p)
    add_option_flags(p)
    return p


def _add_prewarm(sub) -> None:
    p = _dataset_command(sub, "prewarm",
                         "decode, sample and resize every video of a dataset into the cache (images: checked)",
                         "Miles' prompt file (.jsonl, or .parquet) or a Hugging Face dataset directory "
                         "(save_to_disk or load_dataset); videos and images under --multimodal-keys")
    p.add_argument("--max-local-bytes", type=parse_size, metavar="SIZE",
                   help="budget of the local tier, e.g. 200GB (LRU eviction; the shared tier is never evicted; "
                        "default: unlimited)")
    p.add_argument("--workers", type=int, default=1, help="decoding processes on this node")
    p.add_argument("--ray", action="store_true", help="spread the work over a Ray cluster (use with a shared tier; "
                                                      f"needs Ray: {INSTALL_RAY})")
    p.add_argument("--ray-address", help="Ray cluster address (default: start or join a local one)")
    p.add_argument("--ray-logs", action="store_true", help="show Ray's own raylet/gcs/worker log lines here "
                                                           "(default: they stay in Ray's log directory)")
    from ..loader.fetch import FetchLimits
    from ..prewarming import DEFAULT_TIMEOUT_S
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per video before its worker is killed")
    p.add_argument("--max-worker-memory-mb", type=float,
                   help="RSS a worker may add while decoding one video before it is killed "
                        "(default: 80%% of this machine's RAM split among the workers)")
    p.add_argument("--max-source-mb", type=float, default=FetchLimits.max_bytes // 2**20,
                   help="largest source file fetched, in MiB")
    p.add_argument("--fetch-timeout", type=float, default=FetchLimits.timeout_s, help="seconds to fetch one source")
    from ..config import CacheConfig
    from ..options import DECODERS
    p.add_argument("--decoder", default=CacheConfig.decoder, choices=DECODERS, help="video decoder")
    p.add_argument("--failures", metavar="PATH", help="per-row failures JSONL, written only when a row fails "
                                                      "(default: <dataset>.failures.jsonl, or in the current directory when the "
                        "dataset's is read-only)")
    p.add_argument("--allow-failures", action="store_true", help="exit 0 even when rows failed")
    _add_row_flags(p, 'Miles\' --multimodal-keys: which row fields hold the videos and images, e.g. '
                      '\'{"video": "clips", "image": "pictures"}\' (default: {"video": "videos", "image": "images"}, '
                      'a default without a column in a parquet/HF dataset dropped; images are checked as Miles '
                      'reads them, not cached)')
    p.add_argument("--no-progress", action="store_true", help="neither a bar nor progress lines")
    p.add_argument("--progress", action="store_true", help="draw the bar even when stderr is not a terminal")
    p.add_argument("--log-interval", type=float, default=30.0, metavar="S",
                   help="without a terminal (ray job submit, k8s logs): one progress line every S seconds")
    p.set_defaults(fn=cmd_prewarm)


def cmd_prewarm(args) -> int:
    from ..errors import BackendUnavailableError, ConfigError
    from ..loader.fetch import FetchLimits
    from ..options import VIDEO_KEY
    from ..planning import check_failures_path, default_failures_path
    from ..prewarming import default_worker_memory, prewarm

    # Every mistake the user can make is refused before any work is done, and creates nothing.
    check_local_budget(args.max_local_bytes)
    from ..dataset import check_media_roots
    check_media_roots(args.media_root)
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
                                          f"{INSTALL_RAY}") from None
    failures = os.path.abspath(args.failures) if args.failures else default_failures_path(args.dataset)
    check_failures_path(failures)
    options = options_of(args)
    cache = cache_of(args, limits=FetchLimits(max_bytes=int(args.max_source_mb * 2**20), timeout_s=args.fetch_timeout),
                     max_local_bytes=args.max_local_bytes)
    ident = cache.identity            # a new shared tier gets its identity now, before any work (race-safe)
    print(f"prewarm: cache {ident}" + (f" (shared tier {cache.config.shared})" if cache.config.shared else
                                      f" (node-local: {cache.path})"), file=sys.stderr)
    print(f"prewarm: {_path_note(options)}", file=sys.stderr)
    from ..sglang.versions import installed_transformers
    from ..token_layout import unverified_warning
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
                ray_logs=args.ray_logs, media_roots=args.media_root)
    print(s.line())
    if s.failed:
        print(f"failures: {failures}")
        _print_failures(s.failures, failures)
    if s.was_interrupted:
        return 130                        # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C
    if s.new or s.hit or s.published:
        print(_next_steps(args), file=sys.stderr)
    return 0 if (s.failed == 0 or args.allow_failures) else 1


def _add_row_flags(p, multimodal_help: str = "as for prewarm") -> None:
    """How a job reads a dataset's rows, the same for prewarm, pull and embed: the prompt and media fields, and
    where local media may come from (the source rule, ``dataset._resolve``)."""
    from ..options import INPUT_KEY
    p.add_argument("--input-key", default=INPUT_KEY, help="the row's prompt field (Miles' --input-key)")
    p.add_argument("--multimodal-keys", metavar="JSON", help=multimodal_help)
    p.add_argument("--media-root", action="append", metavar="DIR",
                   help="a directory the dataset's local images and videos may be read from (repeatable). Without "
                        "it a relative path must stay under the dataset's directory by name (.. resolved; links in "
                        "it are followed); with it every local path, absolute and file:// too, must really lie "
                        "under one of these (links followed)")


def _next_steps(args) -> str:
    """What to do with a cache just filled (a first run ends here: README's command 1), with this run's --cache."""
    import shlex
    at = f" --cache {shlex.quote(args.cache)}" if args.cache else ""
    cache = f"VideoCache({args.cache!r})" if args.cache else "VideoCache()"
    return (f"prewarm: next: `vidcache ls{at}` lists the entries, `vidcache inspect SOURCE{at}` shows one; "
            f"from Python, {cache} reads them (README.md, Python API); `vidcache sglang-config --help` for serving")


def _check_format(dataset: str) -> None:
    from ..prompt_files import check_format, is_parquet
    if os.path.isfile(dataset) and not is_parquet(dataset):
        check_format(dataset)


def _path_note(options) -> str:
    """Which SGLang path these options allow (issue: say it before the work, not at serving time)."""
    from ..sglang_facts import stock_sglang_problems
    r = options.resolved()
    if stock_sglang_problems(options.family, r.size_factor):
        return (f"{options.family} on the {r.size_factor}-pixel grid (faithful aspect ratios): SGLang plugin mode "
                "only (`vidcache sglang-config --mode plugin`); stock SGLang would resize these frames")
    return f"{options.family} on the {r.size_factor}-pixel grid: SGLang stock and plugin modes"


DEFAULT_MEDIA_KEYS = {"video": "videos", "image": "images"}   # Miles' own row fields for each (its data docs)


def _multimodal_keys(text: str | None, dataset: str | None = None) -> dict:
    """``--multimodal-keys``; without it, ``videos`` and ``images`` (Miles rows carry both).  Of a dataset that
    knows its columns (parquet, HF), a default key it has no column for is dropped (only a key asked for must
    name one)."""
    from ..errors import ConfigError
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
    from ..prompt_files import is_parquet, open_rows
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


def _add_pull(sub) -> None:
    from .. import readahead
    p = _dataset_command(sub, "pull", "bring the entries of a dataset's rows from the shared tier into this node's "
                                      "local tier (before a job starts on a fresh node)")
    _add_row_flags(p)
    p.add_argument("--depth", type=_positive, default=readahead.DEPTH, help="entries pulled at once, at most")
    p.add_argument("--max-bytes", type=_positive_size, default=readahead.MAX_BYTES, metavar="SIZE",
                   help="frames in flight at once, at most (e.g. 2GiB)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when any video is not cached in any tier yet, as well as when one fails (a "
                        "pre-job check: every row ready on this node)")
    p.set_defaults(fn=cmd_pull)


def cmd_pull(args) -> int:
    """Bring the entries a dataset's rows name from the shared tier into this node's local tier, in row order
    (``vidcache.pulling.pull``); every video that is not pulled is listed with its reason."""
    from ..errors import ConfigError
    from ..options import VIDEO_KEY
    from ..pulling import pull
    if not (os.path.isfile(args.dataset) or os.path.isdir(args.dataset)):
        raise ConfigError(f"dataset not found: {args.dataset}")
    _check_format(args.dataset)
    from ..dataset import check_media_roots
    check_media_roots(args.media_root)
    keys = _multimodal_keys(args.multimodal_keys, args.dataset)
    cache = cache_of(args)
    if cache.shared is None:
        raise ConfigError(f"{cache!r} has no shared tier to pull from (set VIDCACHE_SHARED or pass --shared URL)")
    print(f"pull: {args.dataset} from {cache.config.shared} into {cache.path}", file=sys.stderr)
    s = pull(args.dataset, cache, options_of(args), input_key=args.input_key, video_key=keys.get("video", VIDEO_KEY),
             image_key=keys.get("image"), split=args.split, depth=args.depth, max_bytes=args.max_bytes,
             progress=sys.stderr.isatty(), media_roots=args.media_root)
    cache.sync()
    print(s.line())
    if s.failures:
        _print_failures(s.failures)
    return 1 if s.failed or (args.strict and s.not_cached) else 0


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


def _add_demo(sub) -> None:
    p = command(sub, "demo", help="generate a small demo dataset of synthetic videos")
    p.add_argument("--dir", default="demo", help="where to write it")
    p.add_argument("--videos", type=int, default=12, help="synthetic videos")
    p.add_argument("--rows", type=int, default=24, help="dataset rows")
    p.set_defaults(fn=cmd_demo)


def cmd_demo(args) -> int:
    print(f"demo: writing {args.videos} generated clips and a {args.rows}-row dataset into {args.dir}",
          file=sys.stderr, flush=True)         # before the encoder's imports: the first words come at once
    from ..testing.demo import make_demo_dataset
    path = make_demo_dataset(args.dir, n_videos=args.videos, n_rows=args.rows,
                             log=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"demo dataset: {path}")
    return 0


def _add_embed(sub) -> None:
    # --model (an option flag): the checkpoint whose tower runs, and whose family the options take
    p = _dataset_command(sub, "embed", "run a checkpoint's frozen vision tower over a dataset's cached entries into "
                                       "the embedding tier (docs/embeddings.md; prewarm first)")
    p.add_argument("--dtype", default="bfloat16", help="the dtype the tower runs in, part of the records' key "
                                                       "(the trainer's: float32, bfloat16, float16)")
    p.add_argument("--device", help="torch device (default: cuda where present, else cpu)")
    p.add_argument("--max-embedding-bytes", type=parse_size, metavar="SIZE",
                   help="budget of this node's embedding tier, its own LMDB (LRU eviction; frames are never "
                        "evicted for embeddings, nor the shared tier's; default: unlimited)")
    _add_row_flags(p)
    p.add_argument("--ray", action="store_true", help="spread the entries over a Ray cluster: one task per GPU (per "
                                                      "CPU without GPUs), each node on its own VIDCACHE_DIR, all "
                                                      f"writing the shared tier (needs Ray: {INSTALL_RAY})")
    p.add_argument("--ray-address", help="Ray cluster address (default: start or join a local one)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_embed)


def cmd_embed(args) -> int:
    """Make every cached entry of a dataset's rows have its embeddings on this node: already here (skipped: a
    resumed run), in the shared tier (read, checked, kept), or computed by ``--model``'s tower."""
    from ..errors import ConfigError
    from ..options import VIDEO_KEY
    if not args.model:
        raise ConfigError("embed needs --model CKPT: the checkpoint whose vision tower computes the embeddings")
    if args.max_embedding_bytes is not None and args.max_embedding_bytes <= 0:
        raise ConfigError(f"--max-embedding-bytes {args.max_embedding_bytes}: a budget must be above 0 bytes")
    if not (os.path.isfile(args.dataset) or os.path.isdir(args.dataset)):
        raise ConfigError(f"dataset not found: {args.dataset}")
    _check_format(args.dataset)
    keys = _multimodal_keys(args.multimodal_keys, args.dataset)
    from ..embeddings.compute import default_device, embed_entries, load_checkpoint, tower_of
    from ..embeddings.jobs import dataset_entries
    from ..embeddings.tier import EmbeddingTier
    cache = cache_of(args)
    entries, missing, failures = dataset_entries(args.dataset, cache, options_of(args), input_key=args.input_key,
                                                 video_key=keys.get("video", VIDEO_KEY), split=args.split,
                                                 media_roots=args.media_root)
    bar = not args.no_progress and sys.stderr.isatty()
    if args.ray:
        from ..embeddings.jobs import embed_over_ray
        from ..prewarming import init_ray
        if cache.shared is None:
            raise ConfigError("embed --ray: the nodes share their records through the shared tier; set "
                              "VIDCACHE_SHARED or pass --shared URL")
        print(f"embed: {len(entries)} cached entries, over Ray", file=sys.stderr, flush=True)
        init_ray(args.ray_address)
        s = embed_over_ray(cache, os.path.abspath(args.model), args.dtype, entries, device=args.device,
                           max_bytes=args.max_embedding_bytes, progress=bar)
    else:
        device = args.device or default_device()
        model, processor = load_checkpoint(args.model, args.dtype, device)
        tower = tower_of(model)
        print(f"embed: {len(entries)} cached entries; tower {tower.code}, {tower.dtype} on {device}, weights "
              f"{tower.weights[:16]}", file=sys.stderr)
        tier = EmbeddingTier(cache, max_bytes=args.max_embedding_bytes)
        if args.max_embedding_bytes is not None:     # a budget lowered since the last run holds before any write
            tier.gc(args.max_embedding_bytes)
        s = embed_entries(tier, tower, processor, entries, progress=bar)
        tier.local.sync()
    print(s.line() + (f"; {missing} videos not cached yet (prewarm them first)" if missing else ""))
    for f in failures + s.failures:
        print(f"failed: {json.dumps(f)}")
    return 1 if (s.failed or failures or missing) else 0
