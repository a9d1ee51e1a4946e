"""The prewarm job (``vidcache.prewarm``, ``vidcache prewarm``): build every (source, options) of a dataset into
the cache.  Named for the job, not the function, so that ``vidcache.prewarm`` is the function alone.

One driver, two submitters:
  ``LocalSubmitter``  pebble worker processes on this machine;
  ``RaySubmitter``    Ray tasks over a cluster, each node building into its own ``VIDCACHE_DIR``
                      (behind the shared tier), each video still in a forked child.
Either way every video runs under a wall-clock timeout and an RSS watchdog, so a
hung or ballooning decoder costs one row, not the run; the driver keeps a bounded
number of videos in flight (a 100k-row dataset never holds 100k pending futures),
skips entries already present and sound (resume), and writes one failures report.
Every row is its own fate: a malformed row or source is a failure record, never a
traceback in the driver.
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field

from . import keys
from .cache import VideoCache
from .config import ENV_DIR
from .dataset import InlineBytes
from .prompt_files import is_parquet
from .errors import (INSTALL_RAY, BackendUnavailableError, ConfigError, VidcacheError, WorkerError,
                     WorkerMemoryError, WorkerTimeoutError)
from .loader.fetch import scheme_of
from .loader.tmpdirs import sweep_stale
from .options import INPUT_KEY, VIDEO_KEY, VideoOptions
from .planning import (ImageCheck, InlineRef, Task, check_failures_path, in_row_order, is_file_dataset, plan,
                       write_failures)

DEFAULT_TIMEOUT_S = 600.0     # a video's worker is killed after this long (a hung decoder costs one row)
_KILLED = {WorkerError.kind, WorkerTimeoutError.kind, WorkerMemoryError.kind}   # a killed worker: sweep its downloads

MEMORY_EXIT_CODE = 86


@dataclass
class PrewarmSummary:
    new: int = 0
    hit: int = 0
    failed: int = 0
    published: int = 0      # local hits the configured shared tier lacked, now published there
    bytes: int = 0
    seconds: float = 0.0
    failures: list = field(default_factory=list)
    interrupted: int = 0    # videos not built because of Ctrl-C (0: the run was not interrupted)
    images: int = 0         # images read and found sound (not cached: Miles' own image path reads them)
    was_interrupted: bool = False

    def line(self) -> str:
        # A rate only where something was built: hits cost one stat each, so a run of hits alone would show
        # an absurd one (222,969 videos/s), which says nothing about how fast videos are built.
        done = self.new + self.hit + self.published
        rate = f" ({done / self.seconds:.2f} videos/s)" if self.new and self.seconds else ""
        pub = f"{self.published} published, " if self.published else ""
        pub += f"{self.images} images checked, " if self.images else ""
        stop = f", interrupted ({self.interrupted} not built; run it again to resume)" if self.was_interrupted else ""
        return (f"prewarm: {self.new} new, {self.hit} hit, {pub}{self.failed} failed, "
                f"{self.bytes / 1e6:.1f} MB new frames, {self.seconds:.1f} s{rate}{stop}")


def _check_image(img: ImageCheck) -> dict:
    from qwen_vl_utils import fetch_image

    from .errors import DecodeError, SourceError
    from .loader.fetch import check_image_source, image_failure
    try:
        fetch_image({"image": check_image_source(img.source)}, image_patch_size=img.patch_size)
    except SourceError as e:
        return _failed(e)
    except Exception as e:  # noqa: BLE001  PIL, requests and qwen-vl-utils raise many types; one row's failure
        if (why := image_failure(str(img)[:200], e)) is not None:
            return _failed(why)
        return _failed(DecodeError(f"image is not readable by Miles' image path (qwen-vl-utils fetch_image): "
                                   f"{type(e).__name__}: {str(e)[:200]}"))
    return {"status": "image", "key": None, "bytes": 0}


def _failed(err: VidcacheError) -> dict:
    return {"status": "failed", "kind": err.kind, "error": str(err)}


def default_worker_memory(workers: int) -> int:
    """The RSS growth a worker may reach before its watchdog kills it: 80% of RAM split among workers."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(0.8 * total / max(1, workers))


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


_WORKER_DEADLINE_S: float | None = None
# A worker's own limit on a row: the driver's timeout plus this grace (the driver, when alive, kills it first and
# reports the row; this is for the driver that cannot: stopped, or gone before its death signal arrived).
def _own_deadline(timeout_s: float | None) -> float | None:
    return None if not timeout_s else timeout_s + min(30.0, max(2.0, 0.1 * timeout_s))


def _die_with(parent: int) -> None:
    """Be killed when the driver dies, however it dies (SIGKILL, an OOM kill, SIGTERM, SIGHUP): Linux's
    ``PR_SET_PDEATHSIG`` (as the CLI's forked walks do); exit now if it died before the call (fork race)."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)     # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):         # not Linux: the worker's own deadline still ends a hung row
        return
    if os.getppid() != parent:
        os._exit(1)


def _init_worker(cache: VideoCache, memory_limit: int | None, parent: int | None = None,
                 timeout_s: float | None = None) -> None:
    global _WORKER_CACHE, _WORKER_DEADLINE_S
    # D44: a worker must not outlive its driver (a hung decode spun at 98% CPU for 10+ minutes after the driver
    # was killed, since only the driver enforced the row timeout): it dies with it, and times its own rows out.
    if parent is not None:
        _die_with(parent)
    _WORKER_DEADLINE_S = _own_deadline(timeout_s)
    # SIGALRM's default action ends the process in the kernel: it needs no GIL, so a decoder hung inside C code
    # holding it is stopped too (the driver reports a worker death for that row).
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    # Ctrl-C reaches the whole process group: the parent decides (finish in-flight rows, or stop them), and a
    # worker interrupted mid-row would only turn it into a failure.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch
    # One intra-op thread: workers are the parallelism, and a forked child must not enter
    # the parent's OpenMP thread pool (GNU libgomp is not fork-safe; it deadlocks).
    torch.set_num_threads(1)
    _WORKER_CACHE = cache
    if memory_limit:
        threading.Thread(target=_watchdog, args=(memory_limit,), daemon=True).start()


def _build_one(source: str, options: dict) -> dict:
    """Runs in a worker.  Returns a plain dict: errors are reported, not pickled."""
    if _WORKER_DEADLINE_S:
        signal.setitimer(signal.ITIMER_REAL, _WORKER_DEADLINE_S)
    try:
        return _build(source, options)
    finally:
        if _WORKER_DEADLINE_S:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _build(source, options: dict) -> dict:
    try:
        if isinstance(source, ImageCheck):
            return _check_image(source)
        if isinstance(source, InlineBytes):      # through fetch's data: path, into the cache's temp directory
            from .dataset import ensure_inline
            res = ensure_inline(_WORKER_CACHE, source, VideoOptions.from_dict(options))
        else:
            res = _WORKER_CACHE.ensure(source, VideoOptions.from_dict(options))
        return {"status": res.status, "key": res.key, "bytes": res.frame_bytes if res.status == "new" else 0}
    except VidcacheError as e:
        return _failed(e)
    except Exception as e:  # noqa: BLE001  a decoder or library bug must cost one row, not the run
        return {"status": "failed", "kind": "internal", "error": f"{type(e).__name__}: {e}"}


def _outcome(future, timeout_s: float, max_worker_memory: int | None) -> dict:
    """A pebble future's result as a plain dict; timeouts and dead workers become row failures."""
    from pebble.common import ProcessExpired
    try:
        return future.result()
    except FutureTimeout:
        return _failed(WorkerTimeoutError(f"the row (fetch, decode, write) did not finish within {timeout_s}s "
                                          "(--timeout); the worker was killed"))
    except ProcessExpired as e:
        if e.exitcode == MEMORY_EXIT_CODE:
            return _failed(WorkerMemoryError(f"worker exceeded {max_worker_memory} bytes of RSS growth "
                                             "and was killed"))
        return _failed(WorkerError(f"worker died with exit code {e.exitcode}"))


def _pool(workers: int, cache: VideoCache, max_worker_memory: int | None, timeout_s: float | None = None):
    # Imported before fork so workers inherit them: the decode pipeline (torch, decord, PyAV) is no longer
    # imported with the cache (the CLI stays fast), and an import inside a worker would count against its
    # RSS watchdog and be paid by every replacement worker.
    if importlib.util.find_spec("decord") is not None:     # absent where it has no wheel (aarch64): PyAV decodes
        import decord  # noqa: F401
    from .loader import build  # noqa: F401
    from pebble import ProcessPool
    # fork: workers inherit the imported torch/decord instead of paying the import again.
    ctx = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn")
    return ProcessPool(max_workers=max(1, workers), initializer=_init_worker,
                       initargs=(cache, max_worker_memory, os.getpid(), timeout_s), context=ctx)


class LocalSubmitter:
    """Worker processes on this machine (pebble: per-task timeout, dead workers replaced)."""

    def __init__(self, cache: VideoCache, workers: int, timeout_s: float, max_worker_memory: int | None):
        self.timeout_s, self.max_worker_memory = timeout_s, max_worker_memory
        self.max_in_flight = 4 * max(1, workers)
        self._args = (workers, cache, max_worker_memory, timeout_s)
        self._pool = None        # made at the first row to build: a fully cached resume never imports the decoders

    def submit(self, task: Task):
        if self._pool is None:
            self._pool = _pool(*self._args)
        return self._pool.schedule(_build_one, args=(task.source, task.options.to_dict()), timeout=self.timeout_s)

    def wait(self, futures: list, timeout: float | None = None) -> list:
        done, _ = concurrent.futures.wait(futures, timeout=timeout, return_when=concurrent.futures.FIRST_COMPLETED)
        return list(done)

    def outcome(self, future) -> dict:
        return _outcome(future, self.timeout_s, self.max_worker_memory)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool.join()

    def abort(self, futures: list = ()) -> None:
        """Stop every worker now (their rows are left unbuilt: a write is one transaction, never partial)."""
        if self._pool is not None:
            self._pool.stop()
            self._pool.join(timeout=10)


# --- Ray ---------------------------------------------------------------------------
_RAY_POOL = None


def _ray_build(cache: VideoCache, source: str, options: dict, timeout_s: float,
               max_worker_memory: int | None) -> dict:
    """Runs in a Ray worker: one forked child per video, so a hung decoder is still killed.
    The node's own ``VIDCACHE_DIR`` (set in its environment) replaces the driver's local path."""
    global _RAY_POOL
    if _RAY_POOL is None:
        cache = node_cache(cache)
        _RAY_POOL = _pool(1, cache, max_worker_memory, timeout_s)
    return _outcome(_RAY_POOL.schedule(_build_one, args=(source, options), timeout=timeout_s),
                    timeout_s, max_worker_memory)


class RaySubmitter:
    """Ray tasks.  A worker or node that dies re-runs its videos (Ray's ``max_retries`` retries
    system failures only); a deterministic decode error is a returned record, never retried."""

    def __init__(self, cache: VideoCache, timeout_s: float, max_worker_memory: int | None,
                 num_cpus_per_task: float = 1.0, max_retries: int = 3, max_in_flight: int | None = None):
        import ray
        self._ray = ray
        self.timeout_s, self.max_worker_memory = timeout_s, max_worker_memory
        self._remote = ray.remote(num_cpus=num_cpus_per_task, max_retries=max_retries)(_ray_build)
        self._cache_ref = ray.put(_worker_cache(cache, max_worker_memory))
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.max_in_flight = max_in_flight or max(2, 2 * cpus)

    def submit(self, task: Task):
        return self._remote.remote(self._cache_ref, task.source, task.options.to_dict(), self.timeout_s,
                                   self.max_worker_memory)

    def wait(self, refs: list, timeout: float | None = None) -> list:
        done, _ = self._ray.wait(refs, num_returns=1, timeout=timeout)
        return done

    def outcome(self, ref) -> dict:
        from ray.exceptions import RayError
        try:
            return self._ray.get(ref)
        except RayError as e:          # retries exhausted: the worker or its node kept dying
            return _failed(WorkerError(f"Ray task failed after retries: {type(e).__name__}: {str(e)[:300]}"))

    def close(self) -> None:
        pass

    def abort(self, refs: list = ()) -> None:
        for ref in refs:
            self._ray.cancel(ref, force=True)


def init_ray(address: str | None = None, logs: bool = False) -> None:
    """Join (or start) the Ray cluster, once per process: prewarm's and ``vidcache embed``'s one way."""
    try:
        import ray as ray_mod
    except ImportError:
        raise BackendUnavailableError(f"ray=True needs Ray: {INSTALL_RAY}") from None
    if not ray_mod.is_initialized():
        # Ray's own raylet/gcs lines stay in Ray's log directory (/tmp/ray/session_*/logs) unless asked.
        import logging
        ray_mod.init(address=address, ignore_reinit_error=True, log_to_driver=logs,
                     logging_level=logging.INFO if logs else logging.ERROR, configure_logging=True)


def node_cache(cache: VideoCache) -> VideoCache:
    """In a Ray worker: ``cache`` at this node's own ``VIDCACHE_DIR`` (set in its environment), when it has one."""
    node_dir = os.environ.get(ENV_DIR)
    return VideoCache.from_config(cache.config.replace(path=os.path.abspath(node_dir))) if node_dir else cache


def _worker_cache(cache: VideoCache, max_worker_memory: int | None) -> VideoCache:
    """The cache as workers run it: a decode budget inside the watchdog's limit, so that a video too big
    for memory is refused cleanly (``too_large``) before the watchdog would have to kill the worker."""
    if max_worker_memory and cache.config.max_decoded_bytes is None:
        return cache.with_settings(max_decoded_bytes=int(0.9 * max_worker_memory))
    return cache


# --- driver --------------------------------------------------------------------------
def _sweep_shared_partials(cache: VideoCache) -> None:
    """A node killed mid-publish leaves a ``.partial`` file in a directory tier; the next prewarm on any node
    removes those older than an hour (younger ones may be another node's write in progress)."""
    if cache.shared is None or not cache.shared.supports_partial_sweep or cache.read_only:
        return
    try:
        swept = cache.shared.sweep_partials()
    except VidcacheError as e:           # a sweep never fails a prewarm
        print(f"vidcache: could not sweep the shared tier's partial files: {e}", file=sys.stderr)
        return
    if swept.get("partial_files_removed"):
        print(f"vidcache: removed {swept['partial_files_removed']} partial file(s) of killed publishes "
              f"({swept['partial_bytes_removed']} bytes) from the shared tier", file=sys.stderr)


def _already_sound(cache: VideoCache, task: Task) -> bool:
    """Resume check for local sources (one stat); remote sources are fingerprinted in the workers,
    under the timeout, because a hung server must not stall the driver."""
    if isinstance(task.source, ImageCheck):
        return False
    try:
        if isinstance(task.source, (InlineBytes, InlineRef)):     # its key is known from its bytes: no fetch
            key = task.source.key(task.options)
            key = key if cache.sound_manifest(key) is not None else None
        elif scheme_of(task.source) != "file":
            return False
        else:
            # A corrupt entry is quarantined by the check and counts as a miss.
            key = cache.find(task.source, task.options, sound=True)
    except (VidcacheError, OSError, ValueError):
        return False          # reported properly when a worker tries it
    # An entry the configured shared tier lacks goes to a worker, which publishes it.
    return key is not None and (cache.shared is None or cache.shared.exists_many([keys.ac(key)])[0])


class _ProgressLog:
    """Without a terminal (``ray job submit``, k8s logs) a bar is noise: one plain line every ``every_s``."""

    def __init__(self, total: int, summary: "PrewarmSummary", every_s: float | None, desc: str) -> None:
        self.total, self.summary, self.every_s, self.desc = total, summary, every_s, desc
        self.t0 = self.last = time.monotonic()

    def tick(self, final: bool = False) -> None:
        now = time.monotonic()
        if not self.every_s or (not final and now - self.last < self.every_s):
            return
        self.last = now
        s = self.summary
        done = s.new + s.hit + s.published + s.failed
        rate = done / (now - self.t0) if now > self.t0 else 0.0
        eta = f", ETA {(self.total - done) / rate:.0f} s" if rate and done < self.total else ""
        print(f"{self.desc}: {done}/{self.total} videos ({s.new} new, {s.hit} hit, {s.failed} failed), "
              f"{rate:.2f} videos/s{eta}", file=sys.stderr, flush=True)


def run(tasks: list[Task], cache: VideoCache, submitter, summary: PrewarmSummary, failures: list,
        progress: bool = True, desc: str = "prewarm", log_every_s: float | None = None) -> None:
    """Drive ``tasks`` through ``submitter`` with a bounded number in flight.  ``progress``: a tqdm bar;
    ``log_every_s``: else a plain progress line at that interval."""
    from tqdm import tqdm

    todo = []
    for t in tasks:
        if _already_sound(cache, t):
            summary.hit += 1
        else:
            todo.append(t)
    bar = tqdm(total=len(tasks), initial=summary.hit, unit="video", disable=not progress, dynamic_ncols=True,
               desc=desc)
    log = _ProgressLog(len(tasks), summary, None if progress else log_every_s, desc)
    pending: dict = {}
    it = iter(todo)
    stop = Interrupt(desc)
    try:
        while True:
            while not stop.requested and len(pending) < submitter.max_in_flight and (t := next(it, None)) is not None:
                if isinstance(t.source, InlineRef):      # its bytes, read again now: only rows in flight hold theirs
                    try:
                        t = Task(t.source.load(), t.options, t.rows)
                    except VidcacheError as e:
                        summary.failed += 1
                        failures.extend({"row": r, "source": str(t.source), "kind": e.kind, "error": str(e)}
                                        for r in t.rows)
                        bar.update(1)
                        continue
                pending[submitter.submit(t)] = t
            if not pending:
                break
            if stop.requested and time.monotonic() > stop.deadline:
                break                              # in-flight rows past the grace: abandoned below
            for fut in submitter.wait(list(pending), stop.wait_s()):
                t = pending.pop(fut)
                res = submitter.outcome(fut)
                if res["status"] == "failed":
                    if res["kind"] in _KILLED:
                        sweep_stale(cache.tmp_dir)     # a killed worker's partial downloads go now
                    summary.failed += 1
                    failures.extend({"row": r, "source": str(t.source), "kind": res["kind"], "error": res["error"]}
                                    for r in t.rows)
                elif res["status"] == "image":
                    summary.images += 1
                else:
                    summary.new += res["status"] == "new"
                    summary.hit += res["status"] == "hit"
                    summary.published += res["status"] == "published"
                    summary.bytes += res["bytes"]
                bar.update(1)
                log.tick()
        if not stop.requested:
            log.tick(final=True)
    except KeyboardInterrupt:                      # the second Ctrl-C: stop now
        stop.requested = True
        raise
    finally:
        bar.close()
        if stop.requested:
            summary.was_interrupted = True
            summary.interrupted = len(pending) + sum(1 for _ in it)
            submitter.abort(list(pending))
            sweep_stale(cache.tmp_dir)             # what stopped workers left of their downloads
        else:
            submitter.close()
        stop.restore()
    cache.sync()      # a durability checkpoint: the workers' LMDB commits reach the disk


class Interrupt:
    """Ctrl-C during a run: the first stops scheduling and gives the rows in flight ``GRACE_S`` to finish
    (a row is one transaction: finished or not there, never partial); the second raises KeyboardInterrupt at
    once.  Only where the run owns the main thread (a library caller's own handler is left alone elsewhere)."""

    GRACE_S = 3.0

    def __init__(self, desc: str, finishing: str = f"finishing the rows in flight for up to {GRACE_S:.0f} s"):
        self.desc, self.finishing, self.requested, self.deadline = desc, finishing, False, float("inf")
        self._old = None
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested, self.deadline = True, time.monotonic() + self.GRACE_S
        print(f"\n{self.desc}: interrupted: {self.finishing}, then stopping (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)

    def wait_s(self) -> float | None:
        """How long one wait may block: short while a Ctrl-C can arrive, so it is seen at once."""
        return max(0.0, min(0.5, self.deadline - time.monotonic())) if self.requested else 0.5

    def restore(self) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
            self._old = None


def prewarm(dataset, cache: VideoCache | None = None, options: VideoOptions | None = None, *, workers: int = 1,
            timeout_s: float = DEFAULT_TIMEOUT_S, max_worker_memory: int | None = None, failures_path: str | None = None,
            progress: bool = True, log_every_s: float | None = None, input_key: str = INPUT_KEY,
            video_key: str = VIDEO_KEY, image_key: str | None = None, split: str | None = None,
            ray: bool = False, ray_address: str | None = None,
            num_cpus_per_task: float = 1.0, ray_logs: bool = False, media_roots=None) -> PrewarmSummary:
    """Build every video of ``dataset`` into ``cache``: locally with ``workers`` processes, or over Ray.

    ``dataset``: a JSONL or ``.parquet`` path (Miles' prompt files), a ``datasets.Dataset`` (or ``DatasetDict``
    with ``split``, default ``train``), a ``save_to_disk`` / ``load_dataset`` directory, or an iterable of row
    dicts (``{"prompt": ..., "videos": [...], "images": [...]}``).  ``video_key`` / ``image_key``: Miles'
    ``--multimodal-keys`` ``video`` / ``image`` entries (images are checked, not cached).  A key that names no
    column of a parquet file or HF dataset raises ``UnknownColumnError`` naming the columns found.
    ``cache``: default ``VideoCache()`` (``$VIDCACHE_DIR`` + ``$VIDCACHE_SHARED``); ``options``: default
    ``VideoOptions()``.  Returns a :class:`PrewarmSummary`; ``summary.failures`` lists every failed row
    (``row``, ``line`` for a JSONL, ``source``, ``kind``, ``error``), also written to ``failures_path``
    when given and only when a row failed.  A bad row costs that row only.  ``media_roots``: the directories
    local images and videos may be read from (``--media-root``); without them a relative path must stay under
    the dataset's directory, and a row whose path leaves it fails (``outside_media_root``).
    """
    t0 = time.monotonic()
    check_failures_path(failures_path)
    if isinstance(dataset, (str, os.PathLike)) and not os.path.exists(dataset):
        raise ConfigError(f"dataset not found: {os.fspath(dataset)}")
    cache = cache if cache is not None else VideoCache()
    options = options if options is not None else VideoOptions()
    cache.identity          # a new shared tier gets its identity before any work (race-safe: config.py)
    summary = PrewarmSummary()
    tasks, bad_rows = plan(dataset, options, input_key, video_key, image_key, split, progress=progress,
                           media_roots=media_roots)
    failures = list(bad_rows)
    sweep_stale(cache.tmp_dir)       # temp files of killed workers from earlier runs
    _sweep_shared_partials(cache)
    if ray:
        init_ray(ray_address, ray_logs)
        submitter = RaySubmitter(cache, timeout_s, max_worker_memory, num_cpus_per_task)
    else:
        submitter = LocalSubmitter(_worker_cache(cache, max_worker_memory), workers, timeout_s, max_worker_memory)
    run(tasks, cache, submitter, summary, failures, progress, "prewarm (ray)" if ray else "prewarm", log_every_s)
    summary.failed += len(bad_rows)
    if is_file_dataset(dataset) and not is_parquet(dataset):
        for rec in failures:             # rows of a JSONL count every line: line = row + 1
            rec.setdefault("line", rec["row"] + 1)
    summary.failures = failures = in_row_order(failures)
    write_failures(failures_path, failures)
    summary.seconds = time.monotonic() - t0
    return summary


__all__ = ["prewarm", "plan", "run", "PrewarmSummary", "LocalSubmitter", "RaySubmitter"]
