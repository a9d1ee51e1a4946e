"""Read-ahead: the entries the next samples will read, brought into this node's local tier before they are asked for.

A fresh node's first read of an entry pulls it from the shared tier (a download, the compact object's decode, a
local commit): a wait on the critical path of every training step that meets a new video.  The reader knows the
order it reads in (the sampler's), so those pulls can run ahead of it in the background, and each read is then
a local hit::

    with vidcache.read_ahead(samples, depth=64) as ahead:   # samples: handles, or lists of one sample's handles
        for sample in ahead:                                  # the same samples, in the same order
            inputs = vidcache.train_inputs(processor, sample)

or, where another loop does the reading, ``ahead.advance(n)`` after each ``n`` samples are taken.

Pulling starts when read-ahead is built, not at the first ``next``: build it (or the dataset's,
``LazyVideoDataset.read_ahead``; Miles' data source builds its own when it is built) before the model loads, and
the first step's entries are local by step 1.  The first step is otherwise most of a run's wait: nothing is local
when it starts, and the pull worker's own start (an interpreter, its imports) is on its path (issue 50).

What stays true:
  * bounded: at most ``depth`` samples ahead of the reader and ``max_bytes`` of frames pulled ahead of it and not
    yet passed.  With a local budget (``max_local_bytes``), at most half of it: LRU eviction takes the least
    recently used entries, so what comes ahead never evicts what the reader is on;
  * one pull per key per node, however many samples, threads or processes ask (``VideoCache.bring_local``);
  * a pull is the cache's own and checked as every pull is: a corrupt copy is quarantined, never kept or served.
    A failed pull is logged and counted, never raised in a thread; the read that needs the entry meets the
    failure itself (it pulls again, and raises the cache's specific error if that fails too);
  * ``close`` (or the end of the ``with`` block) cancels the pulls not started and waits for those under way,
    each bounded by the shared tier's timeout; a killed process leaves the local tier as LMDB left it, sound;
  * read-ahead never builds: an entry not cached yet is left to its read, which builds it as it would have.
"""
from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from typing import Iterable, Mapping

from . import pullworker
from .errors import BadRowError, NotCachedError
from .handle import VideoHandle

log = logging.getLogger("vidcache")

DEPTH = 64                    # samples ahead of the reader
MAX_BYTES = 2 << 30           # frames pulled ahead of the reader and not yet passed
WORKERS = 2                   # pulls at once (each overlaps its download and its decode already)
# Pulls run in a worker process (``vidcache.pullworker``), out of reach of the reader's GIL (issue 50: a trainer's
# busy main thread starved them).  Off, or for a cache the worker cannot rebuild from settings (a custom store),
# they run in this process's threads.
IN_WORKER = True


class _Sample:
    """One sample of the window: its place in the order, what it names, and the pulls it started (their bytes
    are its charge)."""
    __slots__ = ("index", "item", "pulls", "charge")

    def __init__(self, index: int, item) -> None:
        self.index, self.item, self.pulls, self.charge = index, item, [], 0


class ReadAhead:
    """Pulls the entries of upcoming samples into the local tier in a background thread; see the module."""

    def __init__(self, samples: Iterable, *, depth: int = DEPTH, max_bytes: int = MAX_BYTES,
                 workers: int = WORKERS) -> None:
        if depth < 1 or max_bytes < 1 or workers < 1:
            raise ValueError(f"depth, max_bytes and workers must be positive, got {depth}, {max_bytes}, {workers}")
        self.depth, self.max_bytes = depth, max_bytes
        # "pulled" / "local": entries, each counted once, by its first pull that ended well (a later epoch may pull
        # an evicted entry again); "not_cached" / "failed": asks.
        self.counts = {"pulled": 0, "local": 0, "not_cached": 0, "failed": 0}
        self._counted: set[str] = set()
        self._samples = iter(samples)
        self._cond = threading.Condition()
        self._window: collections.deque[_Sample] = collections.deque()   # taken, not yet passed by the reader
        self._taken = 0                  # samples taken from ``samples``
        self._read = 0                   # samples the reader has passed
        self._ahead_bytes = 0
        self._pulls: dict[tuple[str, str], Future] = {}      # (cache identity, key): the pull under way
        self._end: BaseException | None = None                # StopIteration, or what the samples raised
        self._closed = False
        self.workers = workers
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="vidcache-read-ahead")   # IN_WORKER off
        self._asked: dict[int, tuple] = {}    # pull id -> (worker, pull) asked of the pull worker, not ended
        self._close_wait_s = 0.0              # the longest pull bound of those asked (close waits at most this)
        self._thread = threading.Thread(target=self._run, name="vidcache-read-ahead", daemon=True)
        self._thread.start()

    # --- the reader's side ------------------------------------------------------------------------
    def __iter__(self) -> "ReadAhead":
        return self

    def __next__(self):
        """The next sample, once the pulls it started are done, so the read that follows is a local hit (the
        pool takes pulls in order, so the next sample's are under way or next; a failed one is the read's to
        meet)."""
        with self._cond:
            self._cond.wait_for(lambda: self._window or self._end is not None or self._closed)
            if not self._window:
                if isinstance(self._end, StopIteration) or self._end is None:
                    raise StopIteration
                raise self._end
            s = self._window.popleft()
            self._pass(1, [s])
        for f in s.pulls:
            with contextlib.suppress(CancelledError):
                f.exception()          # waits; a failure is the read's to meet
        return s.item

    def advance(self, n: int) -> None:
        """The reader took the next ``n`` samples by itself: read-ahead moves on past them, without waiting
        (pulls of theirs not started are cancelled; one under way finishes, and a read of it waits for it
        rather than pulling again; samples not reached yet are skipped unread)."""
        with self._cond:
            passed = []
            while self._window and self._window[0].index < self._read + n:
                passed.append(self._window.popleft())
            self._pass(n, passed)
        for s in passed:
            for f in s.pulls:
                f.cancel()

    def upcoming_keys(self, n: int) -> list[str]:
        """The keys of the next ``n`` entries the reader will read, as far as read-ahead has taken them (each
        once, in order): what a rollout client names ahead to its server (``prepare(..., ahead=)``)."""
        with self._cond:
            handles = [h for s in self._window for h in _handles(s.item)]
        return list(dict.fromkeys(h.key for h in handles if h.key is not None))[:n]

    def _pass(self, n: int, passed: list[_Sample]) -> None:
        self._read += n
        self._ahead_bytes -= sum(s.charge for s in passed)
        self._cond.notify_all()

    # --- the background side --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or (self._taken - self._read < self.depth
                                                             and self._ahead_bytes < self.max_bytes))
                if self._closed:
                    return
            try:
                item = next(self._samples)
            except BaseException as e:    # noqa: BLE001 -- the end, or the samples' own error: the reader's to see
                with self._cond:
                    self._end = e
                    self._cond.notify_all()
                return
            try:
                handles = _handles(item)
            except BadRowError as e:          # raised to the reader at this sample's place, never a dead thread
                with self._cond:
                    self._end = BadRowError(f"read_ahead: sample {self._taken} {e}")
                    self._cond.notify_all()
                return
            with self._cond:
                s = _Sample(self._taken, item)
                self._taken += 1
                if s.index < self._read:        # the reader passed it before it came: nothing to pull
                    continue
            for h in handles:
                self._schedule(s, h)
            with self._cond:
                if s.index < self._read:        # passed while its pulls were being started
                    for f in s.pulls:
                        f.cancel()
                    continue
                self._window.append(s)
                self._ahead_bytes += s.charge
                self._cond.notify_all()

    def _schedule(self, s: _Sample, h: VideoHandle) -> None:
        try:
            key = h.resolve(build=False)       # a lazy handle's source: one stat or HEAD, never a decode
        except NotCachedError:
            self._count("not_cached")
            return
        except Exception as e:     # noqa: BLE001 -- an unreachable source: the read meets it
            self._failed(h, e)
            return
        settings = pullworker.settings_of(h.cache) if IN_WORKER else None
        if settings is not None:
            self._ask_worker(s, h, key, settings)
            return
        try:
            m = h.cache.manifest(key)
        except NotCachedError:
            m = None
        except Exception as e:     # noqa: BLE001 -- an unreachable tier: the read meets it
            self._failed(h, e)
            return
        if m is None:
            self._count("not_cached")
            return
        ident = (h.identity, key)
        if (under_way := self._pulls.get(ident)) is not None and not under_way.done():
            s.pulls.append(under_way)          # another sample of the window asked already: one pull
            return
        cache = h.cache
        if (budget := cache.config.max_local_bytes) is not None:    # half of it: the other half is the reader's
            self.max_bytes = min(self.max_bytes, max(1, budget // 2))
        with self._cond:           # close() marks itself under this lock before it shuts the pool down
            if self._closed:
                return
            try:
                fut = self._pool.submit(self._pull, cache, key)
            except RuntimeError:   # the interpreter is exiting: concurrent.futures refuses new work; so do we
                self._closed = True
                return
        self._pulls[ident] = fut
        # Only pulls under way are shared (above): once one ends, a later ask pulls again (after a failure, or an
        # eviction before a later epoch), or finds the entry local at once.  Ended ones are dropped, so the map
        # stays the size of what is in flight.
        fut.add_done_callback(lambda f, ident=ident: self._pulls.pop(ident, None) if self._pulls.get(ident) is f
                              else None)
        s.pulls.append(fut)
        s.charge += m.frames.nbytes

    def _ask_worker(self, s: _Sample, h: VideoHandle, key: str, settings: dict) -> None:
        """``_schedule`` through the pull worker (``vidcache.pullworker``): it reads the manifest (the size this
        sample is charged) and pulls; this thread only sends the key and waits for the size."""
        ident = (h.identity, key)
        if (under_way := self._pulls.get(ident)) is not None and not under_way.done():
            s.pulls.append(under_way)          # another sample of the window asked already: one pull
            return
        if (budget := h.cache.config.max_local_bytes) is not None:    # half of it: the other half is the reader's
            self.max_bytes = min(self.max_bytes, max(1, budget // 2))
        with self._cond:
            if self._closed:
                return
            self._close_wait_s = max(self._close_wait_s, h.cache.reads._pull_wait_s)
            try:
                w = pullworker.worker(self.workers)
                p = w.pull(settings, key, lambda pulled, e, c=h.cache: self._ended(c, key, pulled, e))
            except (OSError, pullworker.WorkerDied) as e:   # no worker could start, or it died as it was asked
                self._failed(key, e)
                return
            for n in [n for n, (_, q) in self._asked.items() if q.ended.is_set()]:
                del self._asked[n]                 # answered: close has nothing to wait for
            self._asked[p.id] = (w, p)
        # A sample passed by the reader cancels its pulls (``advance``, ``close``): tell the worker.
        p.done.add_done_callback(lambda f: w.cancel(p) if f.cancelled() else None)
        try:
            size = p.size.result()
        except CancelledError:
            return
        except Exception:     # noqa: BLE001 -- counted and logged by ``_ended``; the read meets it
            return
        if size is None:
            self._count("not_cached")
            return
        self._pulls[ident] = p.done
        p.done.add_done_callback(lambda f, ident=ident: self._pulls.pop(ident, None) if self._pulls.get(ident) is f
                                 else None)
        s.pulls.append(p.done)
        s.charge += size

    def _ended(self, cache, key: str, pulled: bool | None, e: BaseException | None) -> None:
        """The worker's last word on a pull of ``key``: counted as ``_pull`` counts one of this process."""
        if getattr(e, "aside", None):
            cache.reads.note_moved_aside(e.aside, RuntimeError(f"read-ahead's pull worker: {e}"))
        if e is not None:
            self._failed(key, e)
            return
        self._done(key, pulled)

    def _pull(self, cache, key: str) -> None:
        try:
            pulled = cache.bring_local(key)
        except Exception as e:     # noqa: BLE001 -- never raised in this thread: the read that needs it pulls again
            self._failed(key, e)
            return
        self._done(key, pulled)

    def _done(self, key: str, pulled: bool | None) -> None:
        """A pull ended well, counted once per key (a key pulled and already local counts as it came)."""
        with self._cond:
            if key not in self._counted:
                self._counted.add(key)
                self.counts["pulled" if pulled else "local"] += 1

    def _count(self, what: str) -> None:
        with self._cond:
            self.counts[what] += 1

    def _failed(self, what, e: BaseException) -> None:
        self._count("failed")
        log.info("vidcache: read-ahead of %s failed (%s: %s); its read will try again", what, type(e).__name__, e)

    # --- the end ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Cancel the pulls not started, wait for those under way (each bounded by the tier's timeout)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            asked, self._asked = list(self._asked.values()), {}
        self._pool.shutdown(wait=True, cancel_futures=True)
        for _, p in asked:
            p.done.cancel()                      # the worker drops it unless under way
        end = time.monotonic() + self._close_wait_s
        for w, p in asked:
            if not p.ended.wait(max(0.0, end - time.monotonic())):
                log.warning("vidcache: read-ahead's pull worker outlasted %.0f s at close; ended (the next "
                            "read-ahead starts another)", self._close_wait_s)
                w.kill()                         # LMDB stays sound, its locks go with it
        self._thread.join()

    def __enter__(self) -> "ReadAhead":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _handles(item) -> list[VideoHandle]:
    """The handles a sample names: itself, the values of a dict (``{"video": h}``, ``{"videos": [h, ...]}``),
    or the members of a list; ``BadRowError`` for a sample that is none of these (D52: the ``TypeError`` killed
    the background thread and the reader waited for ever; a dict pulled nothing)."""
    if isinstance(item, VideoHandle):
        return [item]
    if isinstance(getattr(item, "handles", None), list):     # a dataset's Row (``LazyVideoDataset.read_ahead``)
        return [h for h in item.handles if isinstance(h, VideoHandle)]
    if isinstance(item, Mapping):
        item = list(item.values())
    elif item is None or isinstance(item, (str, bytes)):
        return []
    try:
        members = list(item)
    except TypeError:
        raise BadRowError(f"is a {type(item).__name__}: expected a VideoHandle, a list of them, or a dict "
                          "holding them") from None
    out = []
    for m in members:
        if isinstance(m, VideoHandle):
            out.append(m)
        elif isinstance(m, (list, tuple)):    # {"videos": [h0, h1]}
            out += [h for h in m if isinstance(h, VideoHandle)]
    return out


def read_ahead(samples: Iterable, *, depth: int = DEPTH, max_bytes: int = MAX_BYTES,
               workers: int = WORKERS) -> ReadAhead:
    """Start pulling the entries of ``samples`` (each a ``VideoHandle`` or a list of one sample's handles, in
    the order they will be read) into this node's local tier, ahead of the reader; see ``vidcache.readahead``."""
    return ReadAhead(samples, depth=depth, max_bytes=max_bytes, workers=workers)


# --- a server's hints: entries its clients will ask for soon (``vidcache.rollout.ref``'s ``ahead``) ---------------
MAX_SOON = 256                # hinted pulls waiting at once, per process; more are dropped (a hint, not a promise)
_SOON: dict = {}              # pid -> _SoonPool
_SOON_LOCK = threading.Lock()


class _SoonPool:
    """``WORKERS`` threads pulling hinted keys.  Not a ThreadPoolExecutor: at interpreter exit that runs every
    queued item before its threads join (D48: 256 queued pulls to a hung tier kept a stopped server alive
    642 s at a 5 s timeout, about 2.1 h at 60 s).  Here, exit drops the queue (a hint, not a promise) and waits
    only for the pulls under way, each bounded by the tier's timeout."""

    def __init__(self) -> None:
        self.cond = threading.Condition(_SOON_LOCK)
        self.queue: collections.deque = collections.deque()
        self.pending: set = set()               # the (identity, key) pairs queued or under way
        self.stopped = False
        try:
            threading._register_atexit(self.stop)        # run before the non-daemon threads are joined
        except RuntimeError:                             # the interpreter is exiting already: no pulls
            self.stopped = True
        self.threads = [threading.Thread(target=self._work, name="vidcache-pull-soon")
                        for _ in range(0 if self.stopped else WORKERS)]
        for t in self.threads:
            t.start()

    def stop(self) -> int:
        """Drop the queued pulls (the number dropped); the ones under way finish."""
        with self.cond:
            self.stopped = True
            dropped = len(self.queue)
            for _, _, ident in self.queue:
                self.pending.discard(ident)
            self.queue.clear()
            self.cond.notify_all()
        return dropped

    def _work(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.queue or self.stopped)
                if self.stopped:
                    return
                cache, key, ident = self.queue.popleft()
            try:
                cache.bring_local(key)
            except Exception as e:     # noqa: BLE001 -- a hint: the request that needs the entry meets the failure
                log.info("vidcache: pulling %s ahead of its request failed (%s: %s)", key, type(e).__name__, e)
            finally:
                with self.cond:
                    self.pending.discard(ident)


def pull_soon(cache, keys: Iterable[str]) -> int:
    """Pull ``keys`` into ``cache``'s local tier in the background (``VideoCache.bring_local``: checked, one pull
    per key per node), once each; the number queued.  For a server told its next requests' entries: a failure
    is logged, never raised (the request that needs the entry meets it), and at most ``MAX_SOON`` wait.  At
    exit the pulls not started are dropped (``_SoonPool``)."""
    import os
    if cache.shared is None or cache.read_only:
        return 0
    ident = cache.identity
    with _SOON_LOCK:
        pool = _SOON.get(os.getpid())
    if pool is None or pool.stopped:         # a forked server worker starts with a pool of its own
        new = _SoonPool()
        with _SOON_LOCK:
            _SOON.clear()
            pool = _SOON[os.getpid()] = new
    with pool.cond:
        if pool.stopped:
            return 0
        todo = [k for k in dict.fromkeys(keys) if (ident, k) not in pool.pending][:MAX_SOON - len(pool.pending)]
        for k in todo:
            pool.pending.add((ident, k))
            pool.queue.append((cache, k, (ident, k)))
        pool.cond.notify_all()
    return len(todo)
