"""Read-ahead's pulls in a process of their own, so the trainer's GIL never blocks them (issue 50).

A trainer's main thread holds its interpreter's GIL for most of a step (a launch-bound GPU step, a Python data
loader, a busy loop); a pull in a thread of that interpreter (s3fs's event loop, the compact object's decode, the
LMDB commit) then runs only in the slices the trainer lets go of, and the next batch is not local when asked for.
Here the pulls run in a worker process (one per trainer process, started when read-ahead first needs it and
replaced when it dies), each with ``VideoCache.bring_local`` on a cache rebuilt from the trainer's configuration,
so every guarantee of a pull is the cache's own: one pull per key per node (the node's ``flock`` pull locks,
shared by every process of the node: the trainer's own reads wait for the worker's pull rather than pulling
again), a corrupt copy quarantined and never kept, a killed process leaving LMDB sound and its locks dropped by
the kernel.  The trainer's read of a local entry stays its own zero-copy LMDB read.

What crosses the boundary is JSON lines on the worker's stdin and stdout, never pickles and never frame bytes:
the cache's settings once (a process on the same node: the node directory's path is fine), then keys and
small replies.  Started with ``python -m`` rather than ``multiprocessing``: a spawned ``multiprocessing`` child
runs the parent's main module again (a trainer script without a ``__main__`` guard would start training in it),
and a forked one inherits the trainer's CUDA context and threads.

    trainer -> worker  {"op": "config", "cfg": i, "settings": {...}}   a cache's settings, once
                       {"op": "pull", "id": n, "cfg": i, "key": k}
                       {"op": "cancel", "id": n}                        dropped unless under way already
    worker -> trainer  {"id": n, "size": bytes} | {"id": n, "not_cached": true}   the manifest, read first
                       {"id": n, "pulled": bool} | {"id": n, "cancelled": true} | {"id": n, "error": "..."}
                                                                        the last word on ``n``

The worker reads its manifests in one thread, in order (the trainer waits for each size: it charges the window's
byte bound with it), and pulls in ``threads`` others; it exits when its stdin closes (its trainer closed it or
died), after the pulls under way, each bounded by the shared tier's timeout.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
from concurrent.futures import CancelledError, Future

log = logging.getLogger("vidcache")

EXIT_WAIT_S = 5.0             # at the trainer's exit: how long its worker may take to finish the pulls under way


class PullFailed(RuntimeError):
    """A pull that failed in the worker: the message names the cache's error (its read meets that error itself);
    ``aside``: the store key of a corrupt copy the pull moved aside, if it did."""

    def __init__(self, message: str, aside: str | None = None) -> None:
        super().__init__(message)
        self.aside = aside


class WorkerDied(RuntimeError):
    """The pull worker exited (killed, or out of memory) with this pull unanswered; the read pulls by itself."""


def settings_of(cache) -> dict | None:
    """``cache``'s settings as JSON-able values for the worker to rebuild it from, or None when its pulls stay in
    this process: a custom store (an object, not settings), no shared tier or a read-only cache (nothing to pull),
    or storage options that are objects rather than values."""
    cfg = cache.config
    if cfg.store is not None or cfg.shared is None or cfg.read_only:
        return None
    d = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("store", "limits")}
    try:
        json.dumps(d)
    except (TypeError, ValueError):
        return None
    return d


# --- the trainer's side -------------------------------------------------------------------------------------
class Pull:
    """One pull asked of the worker: ``size`` resolves to the entry's frame bytes (None: not cached) or raises
    its manifest's failure; ``done`` to True if the worker pulled, False if the entry was local; ``ended`` is set
    when the worker has said its last word on it (after a cancel too: what ``close`` waits for)."""
    __slots__ = ("id", "size", "done", "ended", "on_end")

    def __init__(self, n: int, on_end) -> None:
        self.id, self.size, self.done, self.ended = n, Future(), Future(), threading.Event()
        self.on_end = on_end       # called with (pulled, error) once the worker has pulled or failed, cancelled or not


class PullWorker:
    """The trainer's handle on one worker process."""

    def __init__(self, threads: int) -> None:
        # the directory holding this vidcache package, first on the worker's path: the same code as the trainer's
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        # The environment it starts with is what it reads credentials and endpoints from (AWS_*, FSSPEC_*): a
        # worker is replaced when the trainer's changes (``worker``), so a pull never uses stale ones.
        self.environ = dict(os.environ)
        env = dict(self.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen([sys.executable, "-m", "vidcache.pullworker", str(threads)], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
                                     start_new_session=True)    # a ^C to the trainer is the trainer's to handle
        self._lock = threading.Lock()
        self._pulls: dict[int, Pull] = {}
        self._configs: dict[str, int] = {}
        self._next = 0
        self.dead = False
        self._reader = threading.Thread(target=self._read, name="vidcache-pull-worker", daemon=True)
        self._reader.start()

    def _send(self, msg: dict) -> None:
        line = (json.dumps(msg) + "\n").encode()
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError) as e:   # it died; the reader fails what it had
            raise WorkerDied(f"the pull worker is gone ({type(e).__name__})") from None

    def pull(self, settings: dict, key: str, on_end=lambda pulled, error: None) -> Pull:
        cfg = json.dumps(settings, sort_keys=True)
        with self._lock:
            if self.dead:
                raise WorkerDied("the pull worker is gone")
            if (i := self._configs.get(cfg)) is None:
                i = self._configs[cfg] = len(self._configs)
                self._send({"op": "config", "cfg": i, "settings": settings})
            self._next += 1
            p = self._pulls[self._next] = Pull(self._next, on_end)
            self._send({"op": "pull", "id": p.id, "cfg": i, "key": key})
        return p

    def cancel(self, p: Pull) -> None:
        with self._lock:
            if self.dead or p.ended.is_set():
                return
            try:
                self._send({"op": "cancel", "id": p.id})
            except WorkerDied:
                pass

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                msg = json.loads(line)
                n = msg["id"]
            except (ValueError, KeyError, TypeError):
                log.warning("vidcache: the pull worker said %r; ignored", line[:200])
                continue
            with self._lock:
                p = self._pulls.get(n)
            if p is None:
                continue
            if "size" in msg:
                _settle(p.size, result=msg["size"])
                continue
            if msg.get("not_cached"):
                _settle(p.size, result=None)
                _settle(p.done, result=False)
            elif "error" in msg:
                err = PullFailed(msg["error"], msg.get("aside"))
                p.on_end(None, err)
                _settle(p.size, error=err)
                _settle(p.done, error=err)
            elif "pulled" in msg:
                p.on_end(bool(msg["pulled"]), None)
                _settle(p.done, result=bool(msg["pulled"]))
            else:                               # cancelled before it started
                self._end(p)
                _settle(p.size, error=CancelledError())
                p.done.cancel()
            self._end(p)
        # EOF: the worker exited.  What it had not answered fails (the read pulls by itself); the next pull
        # starts a new worker (``worker``).
        with self._lock:
            self.dead = True
            left, self._pulls = list(self._pulls.values()), {}
        err = WorkerDied(f"the pull worker exited (status {self.proc.wait()})")
        for p in left:
            p.on_end(None, err)
            _settle(p.size, error=err)
            _settle(p.done, error=err)
            p.ended.set()

    def _end(self, p: Pull) -> None:
        with self._lock:
            self._pulls.pop(p.id, None)
        p.ended.set()

    def stop(self, wait_s: float = EXIT_WAIT_S) -> None:
        """Close its stdin: it drops what is queued and exits after the pulls under way; wait up to ``wait_s``
        for that (past it, it ends them by itself, each bounded by the tier's timeout)."""
        with self._lock:
            self.dead = True
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            return
        self._reader.join(wait_s)

    def kill(self) -> None:
        """End it now (a pull past its bound): LMDB stays sound and its locks go with it; the next starts anew."""
        self.proc.kill()
        self.proc.wait()
        self._reader.join()


def _settle(f: Future, *, result=None, error: BaseException | None = None) -> None:
    if f.done():                                  # cancelled by the reader's side first, or settled already
        return
    try:
        f.set_exception(error) if error is not None else f.set_result(result)
    except Exception:     # noqa: BLE001 -- InvalidStateError: cancelled between the check and the set
        pass


_WORKER: dict = {}            # pid -> PullWorker (a forked child of the trainer starts its own)
_WORKER_LOCK = threading.Lock()


def worker(threads: int) -> PullWorker:
    """This process's worker, started (or replaced, after it died) now."""
    with _WORKER_LOCK:
        w = _WORKER.get(os.getpid())
        if w is not None and not w.dead and w.environ != dict(os.environ):
            # The trainer's environment changed since it started (credentials set later, another endpoint): its
            # queued work is dropped and it exits after the pulls under way, off this thread.
            threading.Thread(target=w.stop, name="vidcache-pull-worker-stop", daemon=True).start()
            w.dead = True
        if w is None or w.dead:
            w = PullWorker(threads)
            _WORKER.clear()
            _WORKER[os.getpid()] = w
            if len(_STOP_REGISTERED) == 0:
                _STOP_REGISTERED.append(True)
                try:
                    threading._register_atexit(_stop_at_exit)    # before the interpreter joins its threads
                except RuntimeError:                            # exiting already
                    pass
        return w


_STOP_REGISTERED: list = []


def _stop_at_exit() -> None:
    with _WORKER_LOCK:
        w = _WORKER.pop(os.getpid(), None)
    if w is not None:
        w.stop()


# --- the worker's side ----------------------------------------------------------------------------------------
class _Serve:
    def __init__(self, threads: int, out) -> None:
        self.out, self.out_lock = out, threading.Lock()
        self.cond = threading.Condition()
        self.to_size: collections.deque = collections.deque()     # (id, cfg, key): manifests to read, in order
        self.to_pull: collections.deque = collections.deque()     # (id, cfg, key): sized, not started
        self.cancelled: set[int] = set()
        self.settings: dict[int, dict] = {}
        self.caches: dict[int, object] = {}
        self.closing = False
        self.threads = [threading.Thread(target=self._sizer, name="size")]
        self.threads += [threading.Thread(target=self._puller, name=f"pull-{i}") for i in range(threads)]
        for t in self.threads:
            t.start()

    def say(self, msg: dict) -> None:
        with self.out_lock:
            self.out.write((json.dumps(msg) + "\n").encode())
            self.out.flush()

    def cache(self, i: int):
        c = self.caches.get(i)
        if c is None:
            from .cache import VideoCache
            from .config import CacheConfig
            c = self.caches[i] = VideoCache(config=CacheConfig(**self.settings[i]))
        return c

    def take(self, msg: dict) -> None:
        with self.cond:
            if msg["op"] == "config":
                self.settings[msg["cfg"]] = msg["settings"]
            elif msg["op"] == "pull":
                self.to_size.append((msg["id"], msg["cfg"], msg["key"]))
            elif msg["op"] == "cancel":
                self.cancelled.add(msg["id"])
            self.cond.notify_all()

    def _next(self, queue) -> tuple | None:
        """The next request of ``queue`` not cancelled (a cancelled one is answered and dropped); None at the end."""
        while True:
            with self.cond:
                self.cond.wait_for(lambda: queue or self.closing)
                if self.closing:
                    return None
                n, i, key = queue.popleft()
                if n not in self.cancelled:
                    return n, i, key
                self.cancelled.discard(n)
            self.say({"id": n, "cancelled": True})

    def _sizer(self) -> None:
        from .errors import NotCachedError
        while (req := self._next(self.to_size)) is not None:
            n, i, key = req
            try:
                m = self.cache(i).manifest(key)
            except NotCachedError:
                m = None
            except Exception as e:     # noqa: BLE001 -- the trainer's read meets it, by its own error
                self.say({"id": n, "error": f"{type(e).__name__}: {e}"})
                continue
            if m is None:
                self.say({"id": n, "not_cached": True})
                continue
            self.say({"id": n, "size": m.frames.nbytes})
            with self.cond:
                self.to_pull.append(req)
                self.cond.notify_all()

    def _puller(self) -> None:
        while (req := self._next(self.to_pull)) is not None:
            n, i, key = req
            try:
                pulled = self.cache(i).bring_local(key)
            except Exception as e:     # noqa: BLE001 -- checked and quarantined by the cache; the read meets it
                self.say({"id": n, "error": f"{type(e).__name__}: {e}", "aside": self._aside(i, key)})
            else:
                self.say({"id": n, "pulled": pulled})
            with self.cond:
                self.cancelled.discard(n)       # a cancel that came while it was under way

    def _aside(self, i: int, key: str) -> str | None:
        """The store key of ``key``'s frames if this pull moved a corrupt copy of them aside (the trainer's
        read of the entry then names that cause), else None."""
        from . import keys
        try:
            c = self.cache(i)
            blob_key = keys.cas(c.manifest(key).frames.blob)
        except Exception:     # noqa: BLE001 -- no manifest to name it by: nothing more to say
            return None
        return blob_key if c.reads.moved_aside(blob_key) is not None else None

    def close(self) -> None:
        with self.cond:
            self.closing = True                 # what is queued is dropped: its trainer is gone
            self.cond.notify_all()
        for t in self.threads:
            t.join()                            # the pulls under way end, each bounded by the tier's timeout
        for c in self.caches.values():
            c.close()


def main(argv: list[str]) -> None:
    # The replies go to the original stdout; anything printed in here goes to stderr instead of into them.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    logging.basicConfig(level=logging.WARNING, format="vidcache pull worker: %(message)s")
    from . import cache  # noqa: F401 -- imported before the first request: this start overlaps the trainer's setup
    serve = _Serve(int(argv[0]) if argv else 2, out)
    try:
        for line in sys.stdin.buffer:
            serve.take(json.loads(line))
    finally:
        serve.close()


if __name__ == "__main__":
    main(sys.argv[1:])
