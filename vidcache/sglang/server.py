"""``vidcache serve``: frozen files over HTTP for SGLang nodes without a shared filesystem.

Entries are content-addressed and immutable, so responses carry a strong ETag
(the key) and ``Cache-Control: immutable``.  Only ``GET/HEAD /frozen/<key>.mkv``
(and ``.nut`` for the UT Video format) exists, and only for keys the cache holds;
a frozen file is written (and verified) on first request.

Never a wrong byte: the key is checked against the cache before anything is read or
written, and only a regular file at exactly ``<cache>/frozen/<key><suffix>`` is served,
opened without following a symlink.  Never a stuck server: a fixed pool of ``workers``
threads handles connections, a connection reaches a worker only once it has sent
something (idle ones are closed after ``timeout_s`` without holding a thread), every
socket read and write times out after ``timeout_s``, and a first-time freeze locks
only its own file, so readers of existing files never wait for it.
"""
from __future__ import annotations

import contextlib
import http.server
import os
import re
import selectors
import stat
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..cache import VideoCache
from ..errors import NotCachedError
from .frozen import BY_SUFFIX as _SUFFIX
from .frozen import local_frozen_path

_PATH = re.compile(r"/frozen/([0-9a-f]{32}\.[0-9]{1,20}\.[0-9a-f]{32})(" +
                   "|".join(re.escape(x) for x in _SUFFIX) + ")")
DEFAULT_WORKERS = 16
DEFAULT_TIMEOUT_S = 30.0


class _NotServable(Exception):
    """Something other than a regular file sits at a frozen file's name (a symlink, a FIFO, a directory)."""


def _open_regular(path: str) -> tuple[int, os.stat_result] | None:
    """An fd of the regular file at ``path`` and its stat; None when nothing is there.
    O_NOFOLLOW: a symlink is refused, never followed; O_NONBLOCK: a FIFO cannot hang the open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:          # ELOOP: the name is a symlink
        raise _NotServable(f"refusing {os.path.basename(path)}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _NotServable(f"{os.path.basename(path)} is not a regular file")
    return fd, st


class _FileLocks:
    """One lock per name, made on first use and dropped when its last user leaves."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, list] = {}      # name -> [lock, users]

    @contextlib.contextmanager
    def __call__(self, name: str):
        with self._guard:
            entry = self._locks.setdefault(name, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[name]


class FrozenFileServer(http.server.HTTPServer):
    """An HTTPServer with a fixed pool of worker threads.

    One thread (``serve_forever``) accepts connections and waits, in one selector, until
    each has sent something; only then does a worker get it.  A connection that sends
    nothing is closed after ``timeout_s``, and at most ``max_waiting`` wait at once
    (the oldest is dropped), so idle clients cost neither threads nor workers.
    """
    request_queue_size = 128
    max_waiting = 256

    def __init__(self, address, handler, *, workers: int, timeout_s: float):
        if workers < 1 or not timeout_s > 0:
            raise ValueError(f"need workers >= 1 and timeout_s > 0, got {workers}, {timeout_s}")
        super().__init__(address, handler)
        self.workers, self.timeout_s = workers, timeout_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="vidcache-serve")
        self._stop, self._stopped = threading.Event(), threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stop.clear()
        self._stopped.clear()
        waiting: dict = {}        # connection -> (client address, deadline); oldest first
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self.socket, selectors.EVENT_READ)
                while not self._stop.is_set():
                    for k, _ in sel.select(poll_interval):
                        if k.fileobj is self.socket:
                            try:
                                conn, addr = self.get_request()
                            except OSError:
                                continue
                            sel.register(conn, selectors.EVENT_READ)
                            waiting[conn] = (addr, time.monotonic() + self.timeout_s)
                            if len(waiting) > self.max_waiting:
                                self._drop(sel, waiting, next(iter(waiting)))
                        else:             # it sent something (or hung up): a worker takes it
                            sel.unregister(k.fileobj)
                            addr, _ = waiting.pop(k.fileobj)
                            self._pool.submit(self._work, k.fileobj, addr)
                    now = time.monotonic()
                    for conn in [c for c, (_, deadline) in waiting.items() if deadline <= now]:
                        self._drop(sel, waiting, conn)
        finally:
            for conn in waiting:
                self.shutdown_request(conn)
            self._stopped.set()

    def _drop(self, sel, waiting: dict, conn) -> None:
        sel.unregister(conn)
        del waiting[conn]
        self.shutdown_request(conn)

    def _work(self, conn, addr) -> None:
        try:
            self.finish_request(conn, addr)
        except (ConnectionError, TimeoutError):   # the client went away or stalled: nothing to report
            pass
        except Exception:  # noqa: BLE001 -- reported as socketserver does; the pool thread lives on
            self.handle_error(conn, addr)
        finally:
            self.shutdown_request(conn)

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait until it has returned (running requests finish on their own)."""
        self._stop.set()
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False)


def make_server(cache: VideoCache, host: str = "127.0.0.1", port: int = 0, *,
                workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S) -> FrozenFileServer:
    frozen_dir = os.path.join(cache.path, "frozen")
    freezing = _FileLocks()       # one first-time freeze per file; readers of existing files take no lock

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "vidcache"
        timeout = timeout_s       # every read and write on the connection

        def log_message(self, *args) -> None:
            pass

        def _open(self):
            """(fd, stat, key, format) of the file to serve, or None after an error response."""
            m = _PATH.fullmatch(self.path)
            if m is None:
                self.send_error(404, "expected /frozen/<key>.mkv or .nut")
                return None
            key, fmt = m.group(1), _SUFFIX[m.group(2)]
            path = os.path.join(frozen_dir, key + fmt.suffix)
            try:
                # Only keys the cache holds: a file (or link) at a key-shaped name is not enough.
                if cache.manifest(key) is None:
                    raise NotCachedError(key)
                opened = _open_regular(path)
                if opened is None:
                    with freezing(path):
                        written = local_frozen_path(cache, key, fmt.name)
                    if written != path:   # the file must be the one checked below, in the frozen dir
                        raise _NotServable(f"frozen file written to {written}, expected {path}")
                    opened = _open_regular(path)
                    if opened is None:
                        raise _NotServable(f"{key + fmt.suffix} vanished after it was written")
            except NotCachedError:
                self.send_error(404, f"no entry {key}")
                return None
            except Exception as e:        # a 500 for the client, the traceback for the operator (handle_error)
                self.send_error(500, str(e) if isinstance(e, _NotServable) else type(e).__name__)
                raise
            return (*opened, key, fmt)

        def _respond(self, body: bool) -> None:
            opened = self._open()
            if opened is None:
                return
            fd, st, key, fmt = opened
            with open(fd, "rb") as f:
                self.send_response(200)
                self.send_header("Content-Type", fmt.media_type)
                self.send_header("Content-Length", str(st.st_size))
                self.send_header("ETag", f'"{key}"')
                self.send_header("Cache-Control", "public, max-age=31536000, immutable")
                self.end_headers()
                if body:
                    self.connection.sendfile(f, 0, st.st_size)

        def do_HEAD(self) -> None:
            self._respond(body=False)

        def do_GET(self) -> None:
            self._respond(body=True)

    return FrozenFileServer((host, port), Handler, workers=workers, timeout_s=timeout_s)
