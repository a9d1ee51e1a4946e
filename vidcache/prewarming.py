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
import contextlib
import importlib.util
import json
import logging
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
from .digest import Digest
from .config import ENV_DIR
from .dataset import (InlineBytes, check_columns, check_format, check_media_roots, is_hf_dataset, is_parquet,
                      iter_jsonl, media_items, open_rows)
from .errors import (INSTALL_RAY, BackendUnavailableError, BadRowError, ConfigError, NoMediaError, VidcacheError,
                     WorkerError, WorkerMemoryError, WorkerTimeoutError)
from .loader.fetch import canonical_source, scheme_of
from .loader.tmpdirs import sweep_stale
from .options import INPUT_KEY, VIDEO_KEY, VideoOptions

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


@dataclass(frozen=True)
class _Rows:
    """How ``plan`` read a dataset's rows: what an ``InlineRef`` reads its row again with."""
    reader: object = field(repr=False)
    options: VideoOptions
    input_key: str
    video_key: str
    image_key: str | None
    base_dir: str
    media_roots: tuple[str, ...] | None = None


@dataclass(frozen=True)
class InlineRef:
    """A video held as bytes in a dataset (parquet ``binary``, HF ``{"bytes": ...}``), by its place and digest.
    What ``plan`` keeps instead of the bytes (D45: planning a 1000 MiB parquet held all of it, 6.2 GiB of RSS for
    the run): the bytes are read again, one row at a time, when the video is sent to a worker."""
    rows: _Rows = field(repr=False)
    row: int
    nth: int                  # which video of the row
    digest: Digest
    size: int

    def key(self, options: VideoOptions) -> str:
        return keys.cache_key(self.digest, options)

    def load(self) -> InlineBytes:
        r = self.rows
        row = r.reader.raw(self.row)
        media = media_items(row, r.options, input_key=r.input_key, video_key=r.video_key, image_key=r.image_key,
                            base_dir=r.base_dir, media_roots=r.media_roots)
        src = media.videos[self.nth][0] if self.nth < len(media.videos) else None
        if not isinstance(src, InlineBytes) or src.digest != self.digest:
            raise BadRowError(f"row {self.row}'s video {self.nth} is no longer the bytes planned ({self}): the "
                              "dataset changed during the run")
        return src

    def __str__(self) -> str:       # as ``InlineBytes`` shows itself: never the bytes
        return f"<{self.size} inline bytes, {self.digest}>"


@dataclass(frozen=True)
class Task:
    source: "str | InlineBytes | InlineRef | ImageCheck"   # a video's source or bytes, or an image to check
    options: VideoOptions
    rows: tuple[int, ...]


@dataclass(frozen=True)
class ImageCheck:
    """An image of a row.  Images are not cached (they go through Miles' own image path, docs/miles.md); a
    worker reads each one as Miles would (qwen-vl-utils' ``fetch_image``), so an unreadable image is that
    row's failure at prewarm time, not a crash at rollout time."""
    source: str
    patch_size: int

    def __str__(self) -> str:
        return self.source if not self.source.startswith("data:") else f"<inline image, {len(self.source)} chars>"


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
def _is_file_dataset(dataset) -> bool:
    return isinstance(dataset, (str, os.PathLike)) and not os.path.isdir(dataset)


def _dataset_dir(dataset) -> str:
    """Where a dataset's relative media paths are read from: a file's directory, a dataset directory itself, or
    (rows given in memory) the working directory."""
    if _is_file_dataset(dataset):
        return os.path.dirname(os.path.abspath(dataset))
    return os.path.abspath(dataset) if isinstance(dataset, (str, os.PathLike)) else os.getcwd()


def _row_media(row, options, input_key, video_key, image_key, base, media_roots=None) -> list:
    """A row's media items, or the row's own error (``_placed_rows`` yields a row it could not read as its
    ``BadRowError``): one rule for prewarm and pull, the source rule included (``dataset._resolve``)."""
    if isinstance(row, BadRowError):
        raise row
    return media_items(row, options, input_key=input_key, video_key=video_key, image_key=image_key, base_dir=base,
                       media_roots=media_roots)


def _placed_rows(dataset, split, progress: bool, carried: set, desc: str = "prewarm"):
    """``_rows`` with each row's place for its failure records (``{"row": i}``, plus its line in a JSONL file);
    the fields of the first rows go into ``carried``, for the message when no row has media."""
    for i, row, line in _rows(dataset, split, progress, desc=desc):
        if len(carried) < 64 and isinstance(row, dict):
            carried.update(map(str, row))
        yield i, row, ({"row": i, "line": line} if line is not None else {"row": i})


def _rows(dataset, split: str | None = None, progress: bool = False, desc: str = "prewarm"):
    """(row index, row or its BadRowError, line number or None) of a JSONL or parquet path, an HF dataset (or its
    directory), or an iterable of rows.  ``progress``: a tqdm bar over the rows of a sized dataset.  A row index
    is None for what is not one row (a shard of an HF dataset that cannot be read)."""
    if _is_file_dataset(dataset) and not is_parquet(dataset):
        check_format(os.fspath(dataset))
        for i, row in iter_jsonl(os.fspath(dataset)):
            yield i, row, i + 1          # the index counts every line, so the line number is index + 1
        return
    if isinstance(dataset, (str, os.PathLike)) or is_hf_dataset(dataset):
        dataset = open_rows(dataset, split)
    records = dataset.records() if hasattr(dataset, "records") else enumerate(dataset)
    if progress and hasattr(dataset, "__len__"):
        from tqdm import tqdm
        records = tqdm(records, total=len(dataset), unit="row", desc=f"{desc}: reading rows", dynamic_ncols=True)
    for i, row in records:
        yield i, row if isinstance(row, (dict, BadRowError)) else BadRowError(
            f"a row must be a dict, got {type(row).__name__}"), None


def _check_keys(dataset, input_key: str, video_key: str, image_key: str | None, split: str | None):
    """A parquet file or HF dataset knows its columns: keys that name none are refused before any work."""
    if isinstance(dataset, (str, os.PathLike)) and not (is_parquet(dataset) or os.path.isdir(dataset)):
        return dataset
    if not (isinstance(dataset, (str, os.PathLike)) or is_hf_dataset(dataset)):
        return dataset
    rows = open_rows(dataset, split)
    check_columns(rows.columns, getattr(rows, "path", None) or "the dataset", input_key=input_key,
                  video_key=video_key, image_key=image_key, text_prompt=input_key in rows.text_columns)
    return rows


def plan(dataset, options: VideoOptions, input_key: str = INPUT_KEY, video_key: str = VIDEO_KEY,
         image_key: str | None = None, split: str | None = None, progress: bool = False,
         media_roots=None):
    """Unique tasks of a dataset (a JSONL or parquet path, an HF dataset or its directory, or an iterable of row
    dicts), with the rows that need each, and row-level failures.  A task is a video (by source, or by content
    for bytes) under its options, or an image to check.  Relative paths resolve against the file's directory
    (rows: the current directory), and must stay under it unless ``media_roots`` (``--media-root``) name the
    directories local media may come from (``dataset._resolve``, D54)."""
    media_roots = check_media_roots(media_roots)
    tasks: dict[tuple[str, str], tuple[object, VideoOptions, list[int]]] = {}
    bad_rows = []
    base = _dataset_dir(dataset)
    patch = options.patch_size
    reader = _check_keys(dataset, input_key, video_key, image_key, split)
    # Videos held as bytes are planned by digest and place, where the rows can be read again one at a time
    rows_again = (_Rows(reader, options, input_key, video_key, image_key, base, media_roots)
                  if hasattr(reader, "raw") else None)
    n_rows, seen_keys = 0, set()
    for i, row, where in _placed_rows(reader, split, progress, seen_keys):
        n_rows += 1
        try:
            media = _row_media(row, options, input_key, video_key, image_key, base, media_roots)
            items = [(src if not (isinstance(src, InlineBytes) and rows_again is not None) else
                      InlineRef(rows_again, i, nth, src.digest, len(src.data)),
                      opts, (str(src.digest) if isinstance(src, InlineBytes) else src, opts.digest))
                     for nth, (src, opts) in enumerate(media.videos)]
            items += [(ImageCheck(img, patch), options, (img, "image")) for img in media.images]
            del media, row               # a row's bytes go now: the plan keeps digests
        except BadRowError as e:
            bad_rows.append({**where, "source": None, "kind": e.kind, "error": str(e)})
            continue
        except Exception as e:  # noqa: BLE001  a parsing bug must cost one row, not the run (as in _build_one)
            bad_rows.append({**where, "source": None, "kind": "internal", "error": f"{type(e).__name__}: {e}"})
            continue
        for src, opts, k in items:
            t = tasks.setdefault(k, (src, opts, []))
            t[2].append(i)
    _release_arrow_memory()
    if not tasks and not bad_rows:
        # Every row read, none with media under the keys asked for (D41: rows of {"messages": ...} gave "0 new,
        # 0 hit, 0 failed"): the keys are wrong, for JSONL, parquet and HF alike, so the run fails and says where
        # it looked and what the rows carry.
        raise NoMediaError(_no_media_message(n_rows, video_key, image_key, sorted(seen_keys)))
    return [Task(s, o, tuple(r)) for s, o, r in tasks.values()], bad_rows


def _release_arrow_memory() -> None:
    """Hand what Arrow's allocator kept of the rows read back to the system (a parquet page of videos held as
    bytes can be hundreds of MiB; the plan keeps none of it)."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        with contextlib.suppress(Exception):
            pa.default_memory_pool().release_unused()


def _no_media_message(n_rows: int, video_key: str, image_key: str | None, carried) -> str:
    if not n_rows:
        return "the dataset has no rows"
    where = " or ".join(repr(k) for k in (video_key, image_key) if k)
    return (f"none of the {n_rows} rows has a video or an image under {where} (the rows carry: "
            f"{', '.join(carried) or 'nothing'}); name the fields with --multimodal-keys "
            "'{\"video\": \"<field>\", \"image\": \"<field>\"}' (Python: video_key=, image_key=)")


def check_failures_path(path: str | None) -> None:
    """Refuse an unwritable failures report before any work is done (nothing is created to find out)."""
    if not path:
        return
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        why = "it is a directory"
    elif not os.path.isdir(parent):
        why = "its directory does not exist"
    elif not os.access(path if os.path.exists(path) else parent, os.W_OK):
        why = "permission denied"
    else:
        return
    raise ConfigError(f"cannot write the failures report {path} ({why}); choose another path with "
                      "--failures PATH (Python: failures_path=)")


FAILURE_FIELDS = ("row", "line", "source", "kind", "error")     # a failure record's keys, in this order


def in_row_order(failures: list) -> list:
    """Failure records sorted by row (workers finish in any order) with their keys in ``FAILURE_FIELDS``'
    order (then any others), so the printed list and the failures file read the same from run to run."""
    def row(rec):
        return rec["row"] if isinstance(rec.get("row"), int) else -1
    return [{**{k: rec[k] for k in FAILURE_FIELDS if k in rec}, **{k: v for k, v in rec.items()
                                                                    if k not in FAILURE_FIELDS}}
            for rec in sorted(failures, key=row)]


def write_failures(path: str | None, failures: list) -> None:
    """The failures report: written only when something failed; a stale report from an earlier run goes."""
    if not path:
        return
    if failures:
        with open(path, "w") as f:
            for rec in failures:
                f.write(json.dumps(rec) + "\n")
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def default_failures_path(dataset) -> str | None:
    """``<dataset>.failures.jsonl`` beside the dataset; in the current directory when the dataset's directory
    is read-only (a mounted data set must not stop a prewarm)."""
    if not isinstance(dataset, (str, os.PathLike)):
        return None
    path = os.path.abspath(os.fspath(dataset))
    name = os.path.splitext(os.path.basename(path))[0] + ".failures.jsonl"
    beside = os.path.join(os.path.dirname(path), name)
    return beside if os.access(os.path.dirname(path), os.W_OK) else os.path.abspath(name)


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
    if _is_file_dataset(dataset) and not is_parquet(dataset):
        for rec in failures:             # rows of a JSONL count every line: line = row + 1
            rec.setdefault("line", rec["row"] + 1)
    summary.failures = failures = in_row_order(failures)
    write_failures(failures_path, failures)
    summary.seconds = time.monotonic() - t0
    return summary


# --- pull: a dataset's entries from the shared tier into this node's local tier (``vidcache pull``) ---------------
PULL_WORKERS = 2              # pulls at once (each overlaps its download and its decode already)


@dataclass
class PullSummary:
    pulled: int = 0           # entries brought into the local tier
    local: int = 0            # entries this node held already
    by_record: int = 0        # of those two, found through the tier's source record (the source not reachable here)
    not_cached: int = 0       # videos no tier holds yet (`vidcache prewarm` builds them)
    failed: int = 0           # videos that could not be pulled, and malformed rows
    failures: list = field(default_factory=list)   # every not-cached video and every failure, with its reason

    def line(self) -> str:
        rec = (f" ({self.by_record} found by the shared tier's source record: their sources are not reachable "
               "here)") if self.by_record else ""
        return (f"pull: {self.pulled} pulled, {self.local} already here{rec}, {self.not_cached} not cached "
                f"(`vidcache prewarm` builds them), {self.failed} failed")


def _pull_key(cache: VideoCache, src, opts: VideoOptions) -> tuple[str | None, bool, VidcacheError | None]:
    """(the entry's key or None, found by record, why not) for one video of a row.  A source is first
    looked up as every read does (its validators must match its record).  Where the source cannot be reached
    from this node, the tier's own record of it names its content: enough to copy that entry here (a pull never
    serves: a read still checks the source, or reads by key as ``from_key`` does)."""
    from .errors import SourceError
    from .manifest import SourceRecord
    if isinstance(src, InlineBytes):
        key = src.key(opts)
        return (key, False, None) if cache.contains([key])[0] else (None, False, None)
    try:
        return cache.find(src, opts), False, None
    except SourceError as e:
        raw = cache.store.get(keys.src(canonical_source(src)))
        rec = None if raw is None else SourceRecord.from_json(raw)
        if rec is None:
            return None, False, e
        key = keys.cache_key(rec.digest, opts)
        return (key, True, None) if cache.contains([key])[0] else (None, True, e)


def pull(dataset, cache: VideoCache, options: VideoOptions, *, input_key: str = INPUT_KEY,
         video_key: str = VIDEO_KEY, image_key: str | None = None, split: str | None = None,
         depth: int = 64, max_bytes: int = 2 << 30, progress: bool = False, media_roots=None) -> PullSummary:
    """Bring the entries ``dataset``'s rows name from the shared tier into ``cache``'s local tier, in row order,
    with at most ``depth`` pulls and ``max_bytes`` of frames in flight.  Every row is its own fate (a malformed
    row, an unreachable source or a corrupt copy is one record in ``failures``, with its reason); a video no
    tier holds yet is counted ``not_cached``.  Never builds, never fetches a video (one stat or HEAD a source).
    ``media_roots``: as for ``prewarm``."""
    media_roots = check_media_roots(media_roots)
    if depth < 1 or max_bytes < 1:
        raise ConfigError(f"depth and max_bytes must be positive, got {depth} and {max_bytes}")
    reader = _check_keys(dataset, input_key, video_key, image_key, split)
    base = _dataset_dir(dataset)
    s = PullSummary()
    seen: set = set()
    pending: dict = {}               # future -> (record, frame bytes)
    in_flight = [0]
    n_rows = n_media = 0
    carried: set = set()

    def settle(block: bool) -> None:
        done, _ = concurrent.futures.wait(list(pending), timeout=None if block else 0,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        for fut in done:
            rec, nbytes = pending.pop(fut)
            in_flight[0] -= nbytes
            try:
                pulled = fut.result()
            except VidcacheError as e:
                s.failed += 1
                s.failures.append({**rec, "kind": e.kind, "error": str(e)})
                continue
            except Exception as e:  # noqa: BLE001  one video's failure, never the run's
                s.failed += 1
                s.failures.append({**rec, "kind": "internal", "error": f"{type(e).__name__}: {e}"})
                continue
            if pulled:
                s.pulled += 1
            else:
                s.local += 1

    pool = concurrent.futures.ThreadPoolExecutor(PULL_WORKERS, thread_name_prefix="vidcache-pull")
    try:
        for i, row, where in _placed_rows(reader, split, progress, carried, desc="pull"):
            n_rows += 1
            try:
                media = _row_media(row, options, input_key, video_key, image_key, base, media_roots)
            except BadRowError as e:
                s.failed += 1
                s.failures.append({**where, "source": None, "kind": e.kind, "error": str(e)})
                continue
            n_media += bool(media.videos or media.images)
            for src, opts in media.videos:
                ident = (str(src.digest) if isinstance(src, InlineBytes) else src, opts.digest)
                if ident in seen:
                    continue
                seen.add(ident)
                rec = {**where, "source": str(src)}
                try:
                    key, by_record, why = _pull_key(cache, src, opts)
                    m = cache.manifest(key) if key is not None else None
                except VidcacheError as e:
                    s.failed += 1
                    s.failures.append({**rec, "kind": e.kind, "error": str(e)})
                    continue
                if m is None:
                    if why is not None:          # nothing to look it up by: the source is the only way to it
                        s.failed += 1
                        s.failures.append({**rec, "kind": why.kind, "error": f"{why}; and no tier records what "
                                           "this source holds, so its entry cannot be found without it"})
                    else:
                        s.not_cached += 1
                        s.failures.append({**rec, "kind": "not_cached", "error": "not cached yet: no tier holds "
                                           "it under these options (`vidcache prewarm` builds it)"})
                    continue
                s.by_record += by_record
                while pending and (len(pending) >= depth or in_flight[0] + m.frames.nbytes > max_bytes):
                    settle(block=True)
                pending[pool.submit(cache.bring_local, key)] = ({**rec, "key": key}, m.frames.nbytes)
                in_flight[0] += m.frames.nbytes
            if pending:
                settle(block=False)
        while pending:
            settle(block=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if n_rows and not n_media and not s.failed:
        raise NoMediaError(_no_media_message(n_rows, video_key, image_key, sorted(carried)))
    s.failures = in_row_order(s.failures)
    return s


__all__ = ["prewarm", "plan", "run", "pull", "PrewarmSummary", "PullSummary", "LocalSubmitter", "RaySubmitter"]
