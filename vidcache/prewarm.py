"""Prewarm: build every (source, options) of a dataset into the cache, in worker processes.

Decoding runs in pebble worker processes, each with a wall-clock timeout and
an RSS watchdog, so a hung or ballooning decoder costs one row, not the run.
Each worker writes its own entries (one LMDB transaction per video).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from .cache import VideoCache, cache_key
from .errors import VidcacheError
from .loader.dataset import iter_jsonl, video_items
from .loader.fetch import FetchLimits
from .options import VideoOptions

MEMORY_EXIT_CODE = 86


@dataclass
class PrewarmSummary:
    new: int = 0
    hit: int = 0
    failed: int = 0
    bytes: int = 0
    seconds: float = 0.0
    failures: list = field(default_factory=list)

    def line(self) -> str:
        rate = (self.new + self.hit) / self.seconds if self.seconds else 0.0
        return (f"prewarm: {self.new} new, {self.hit} hit, {self.failed} failed, "
                f"{self.bytes / 1e6:.1f} MB new frames, {self.seconds:.1f} s ({rate:.2f} videos/s)")


# --- worker side ---------------------------------------------------------------
_WORKER_CACHE: VideoCache | None = None


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _watchdog(limit: int) -> None:
    # The limit is on growth: a forked worker starts out sharing the parent's pages.
    base = _rss_bytes()
    while True:
        if _rss_bytes() - base > limit:
            os._exit(MEMORY_EXIT_CODE)   # the parent reports it as a memory failure for this row
        time.sleep(0.05)


def _init_worker(cache_kwargs: dict, memory_limit: int | None) -> None:
    global _WORKER_CACHE
    import torch
    # One intra-op thread: workers are the parallelism, and a forked child must not enter
    # the parent's OpenMP thread pool (GNU libgomp is not fork-safe; it deadlocks).
    torch.set_num_threads(1)
    _WORKER_CACHE = VideoCache(**cache_kwargs)
    if memory_limit:
        threading.Thread(target=_watchdog, args=(memory_limit,), daemon=True).start()


def _build_one(source: str, options: dict) -> dict:
    """Runs in a worker.  Returns a plain dict: errors are reported, not pickled."""
    try:
        res = _WORKER_CACHE.ensure(source, VideoOptions.from_dict(options))
        return {"status": res.status, "key": res.key, "bytes": res.frame_bytes if res.status == "new" else 0}
    except VidcacheError as e:
        return {"status": "failed", "kind": e.kind, "error": str(e)}
    except Exception as e:  # a decoder bug must not take the run down
        return {"status": "failed", "kind": "internal", "error": f"{type(e).__name__}: {e}"}


def _outcome(future, timeout_s: float, max_worker_memory: int | None) -> dict:
    """A pebble future's result as a plain dict; timeouts and dead workers become row failures."""
    from pebble.common import ProcessExpired
    try:
        return future.result()
    except FutureTimeout:
        return {"status": "failed", "kind": "timeout",
                "error": f"decoding did not finish within {timeout_s}s; the worker was killed"}
    except ProcessExpired as e:
        if e.exitcode == MEMORY_EXIT_CODE:
            return {"status": "failed", "kind": "memory",
                    "error": f"worker exceeded {max_worker_memory} bytes of RSS and was killed"}
        return {"status": "failed", "kind": "worker_crash", "error": f"worker died with exit code {e.exitcode}"}


def _pool(workers: int, cache_kwargs: dict, max_worker_memory: int | None):
    import decord  # noqa: F401  (imported before fork so workers inherit it)
    from pebble import ProcessPool
    # fork: workers inherit the imported torch/decord instead of paying the import again.
    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    return ProcessPool(max_workers=max(1, workers), initializer=_init_worker,
                       initargs=(cache_kwargs, max_worker_memory), context=ctx)


def _tally(summary: PrewarmSummary, failures: list, res: dict, src: str, rows: list[int]) -> None:
    if res["status"] == "failed":
        summary.failed += 1
        failures.extend({"row": r, "source": src, "kind": res["kind"], "error": res["error"]} for r in rows)
    else:
        summary.new += res["status"] == "new"
        summary.hit += res["status"] == "hit"
        summary.bytes += res["bytes"]


def _finish(summary: PrewarmSummary, failures: list, n_bad_rows: int, failures_path: str | None,
            t0: float) -> PrewarmSummary:
    summary.failed += n_bad_rows
    summary.failures = failures
    if failures_path:
        with open(failures_path, "w") as f:
            for rec in failures:
                f.write(json.dumps(rec) + "\n")
    summary.seconds = time.monotonic() - t0
    return summary


def _cache_kwargs(cache: VideoCache, workers: int = 1) -> dict:
    # Split the cores among workers: FFmpeg's own threads would otherwise compete with the other workers.
    threads = cache.decoder_threads or max(1, (os.cpu_count() or 1) // max(1, workers))
    return {"path": cache.path, "decoder": cache.decoder, "limits": cache.limits, "encoding": cache.encoding,
            "max_decoded_bytes": cache.max_decoded_bytes, "decoder_threads": threads}


# --- parent side ---------------------------------------------------------------
def plan(dataset: str, options: VideoOptions, input_key: str = "prompt", video_key: str = "videos"):
    """Unique (source, options) tasks of a dataset, with the rows that need each, and row-level errors."""
    tasks: dict[tuple[str, str], tuple[str, VideoOptions, list[int]]] = {}
    bad_rows = []
    base = os.path.dirname(os.path.abspath(dataset))
    for i, row in iter_jsonl(dataset):
        try:
            items = video_items(row, options, input_key=input_key, video_key=video_key, base_dir=base)
        except (ValueError, KeyError, TypeError) as e:
            bad_rows.append({"row": i, "source": None, "kind": "bad_row", "error": str(e)})
            continue
        for src, opts in items:
            t = tasks.setdefault((src, opts.digest), (src, opts, []))
            t[2].append(i)
    return list(tasks.values()), bad_rows


def prewarm(dataset: str, cache: VideoCache, options: VideoOptions, *, workers: int = 1, timeout_s: float = 600.0,
            max_worker_memory: int | None = None, failures_path: str | None = None, progress: bool = True,
            input_key: str = "prompt", video_key: str = "videos") -> PrewarmSummary:
    from tqdm import tqdm

    t0 = time.monotonic()
    summary = PrewarmSummary()
    tasks, bad_rows = plan(dataset, options, input_key, video_key)
    failures = list(bad_rows)

    # Resume: one batch existence check over every task whose source digest is already recorded.
    todo = []
    known = []
    for src, opts, rows in tasks:
        try:
            d = cache.known_digest(src)
        except VidcacheError:
            d = None  # reported when the worker tries it
        (known if d is not None else todo).append((src, opts, rows, d))
    present = cache.contains([cache_key(d, o) for _, o, _, d in known]) if known else []
    for (src, opts, rows, d), ok in zip(known, present):
        if ok:
            summary.hit += 1
        else:
            todo.append((src, opts, rows, d))

    bar = tqdm(total=len(tasks), initial=summary.hit, unit="video", disable=not progress, dynamic_ncols=True,
               desc="prewarm")
    if todo:
        with _pool(workers, _cache_kwargs(cache, workers), max_worker_memory) as pool:
            futures = [(pool.schedule(_build_one, args=(src, opts.to_dict()), timeout=timeout_s), src, rows)
                       for src, opts, rows, _ in todo]
            for fut, src, rows in futures:
                res = _outcome(fut, timeout_s, max_worker_memory)
                _tally(summary, failures, res, src, rows)
                bar.update(1)
    bar.close()
    return _finish(summary, failures, len(bad_rows), failures_path, t0)


# --- Ray: the same isolated build, spread over a cluster ------------------------
_RAY_POOL = None


def _ray_build(cache_kwargs: dict, source: str, options: dict, timeout_s: float,
               max_worker_memory: int | None) -> dict:
    """Runs in a Ray worker: one forked child per video, so a hung decoder is still killed."""
    global _RAY_POOL
    if _RAY_POOL is None:
        _RAY_POOL = _pool(1, cache_kwargs, max_worker_memory)
    return _outcome(_RAY_POOL.schedule(_build_one, args=(source, options), timeout=timeout_s),
                    timeout_s, max_worker_memory)


def prewarm_ray(dataset: str, cache: VideoCache, options: VideoOptions, *, timeout_s: float = 600.0,
                max_worker_memory: int | None = None, failures_path: str | None = None, progress: bool = True,
                input_key: str = "prompt", video_key: str = "videos", num_cpus_per_task: float = 1.0,
                ray_address: str | None = None) -> PrewarmSummary:
    """Prewarm over a Ray cluster.  Every node builds into its own local cache at ``cache.path``; give the
    cache a ``shared`` tier (NFS path or S3 URL) so that entries land where every node reads them."""
    import ray
    from tqdm import tqdm

    if not ray.is_initialized():
        ray.init(address=ray_address, ignore_reinit_error=True, log_to_driver=False)
    t0 = time.monotonic()
    summary = PrewarmSummary()
    tasks, bad_rows = plan(dataset, options, input_key, video_key)
    failures = list(bad_rows)
    remote = ray.remote(num_cpus=num_cpus_per_task, max_retries=0)(_ray_build)
    kwargs = {**_cache_kwargs(cache), "decoder_threads": max(1, int(num_cpus_per_task))}
    refs = {remote.remote(kwargs, src, opts.to_dict(), timeout_s, max_worker_memory): (src, rows)
            for src, opts, rows in tasks}
    bar = tqdm(total=len(refs), unit="video", disable=not progress, desc="prewarm (ray)")
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            src, rows = refs[ref]
            try:
                res = ray.get(ref)
            except Exception as e:   # a Ray worker died
                res = {"status": "failed", "kind": "worker_crash", "error": f"{type(e).__name__}: {e}"}
            _tally(summary, failures, res, src, rows)
            bar.update(1)
    bar.close()
    return _finish(summary, failures, len(bad_rows), failures_path, t0)


__all__ = ["prewarm", "prewarm_ray", "plan", "PrewarmSummary", "FetchLimits"]
