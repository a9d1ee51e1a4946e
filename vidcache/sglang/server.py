"""``vidcache serve``: frozen files over HTTP for SGLang nodes without a shared filesystem.

Entries are content-addressed and immutable, so responses carry a strong ETag
(the key) and ``Cache-Control: immutable``.  Only ``GET/HEAD /frozen/<key>.mkv``
(and ``.nut`` for the MagicYUV format) exists, and only for keys the cache holds;
a frozen file is written (and verified) on first request.

Never a wrong byte: the key is checked against the cache before anything is read or
written, and only a regular file at exactly ``<cache>/frozen/<key><suffix>`` is served,
opened without following a symlink.  Never a stuck server, not even for a slow or
hostile client (slowloris): a fixed pool of ``workers`` threads handles requests, and a
request reaches a worker only once its whole head (request line and headers) is in.  One
thread reads the heads of all connections; a head must be complete ``header_timeout_s``
after the connection was made, with no silence longer than ``timeout_s``.  A response
body must go out at ``min_rate`` bytes/s on average (after ``timeout_s`` of grace), one
client address holds at most ``max_per_client`` connections and at most
``max_workers_per_client`` workers and at most half of what the other addresses leave free
(so neither one address's slow readers nor two addresses' can hold them all); an address holding no worker
gets one at once, past the pool if others' slow readers hold all of it (so however many addresses fill the pool,
a new one is served).  A first-time freeze locks only its own file, so readers of existing files never wait for it.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import http.server
import io
import os
import re
import selectors
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ..cache import VideoCache
from ..keys import KEY_PATTERN
from ..errors import NotCachedError, NotRegularFileError
from ..sglang_facts import (DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_PER_CLIENT, DEFAULT_MIN_RATE,  # noqa: F401 (re-exported)
                    DEFAULT_TIMEOUT_S, DEFAULT_WORKERS, default_max_workers_per_client)
from .frozen import BY_SUFFIX as _SUFFIX
from .frozen import local_frozen_path
from ..store.regular import open_regular

_PATH = re.compile(r"/frozen/(" + KEY_PATTERN + ")(" +
                   "|".join(re.escape(x) for x in _SUFFIX) + ")")
_END_OF_HEAD = re.compile(rb"\r?\n\r?\n")     # the blank line after the headers (bare LF too, as http.server)
MAX_HEAD_BYTES = 64 * 1024      # a GET of a frozen file needs a few hundred; more is not a client of ours


def _reply(conn, status: str) -> None:
    """Best effort, never waiting on the client: a bodiless answer before the connection is closed.
    What the client sent is read and dropped, so the close is a FIN that lets it read the answer
    (closing on unread bytes would reset the connection)."""
    with contextlib.suppress(OSError):
        conn.setblocking(False)
        conn.send(f"HTTP/1.0 {status}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
        conn.recv(MAX_HEAD_BYTES)


class _NotServable(Exception):
    """Something other than a regular file sits at a frozen file's name (a symlink, a FIFO, a directory)."""


def _open_regular(path: str) -> tuple[int, os.stat_result] | None:
    """An fd of the regular file at ``path`` and its stat; None when nothing is there.  The open is
    ``store.regular.open_regular``'s, the directory tier's too: a symlink is refused, a FIFO cannot hang it."""
    try:
        return open_regular(path)
    except FileNotFoundError:
        return None
    except NotRegularFileError:
        raise _NotServable(f"{os.path.basename(path)} is not a regular file") from None
    except OSError as e:          # ELOOP: the name is a symlink
        raise _NotServable(f"refusing {os.path.basename(path)}: {e.strerror}") from None


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


@dataclasses.dataclass
class _Arriving:
    """A connection whose request head is still coming in."""
    addr: tuple
    head_deadline: float          # the whole head must be in by then...
    idle_deadline: float          # ...with no silence longer than timeout_s
    head: bytearray = dataclasses.field(default_factory=bytearray)


class HeadReadHandler(http.server.BaseHTTPRequestHandler):
    """A handler whose request head the server has already read: its request is ``(socket, head)``."""

    def setup(self) -> None:
        self.request, head = self.request
        super().setup()
        self.rfile.close()
        self.rfile = io.BytesIO(head)     # GET/HEAD only: nothing to read after the head


class FrozenFileServer(http.server.HTTPServer):
    """An HTTPServer with a fixed pool of worker threads.

    One thread (``serve_forever``) accepts connections and reads, in one selector, the
    request head of each; only a complete head gets a worker, so clients that are slow (or
    hostile) in sending their request cost neither threads nor workers.  A head must be in
    ``header_timeout_s`` after the connection was made and the client may not go silent for
    ``timeout_s``: past either the connection is closed (with a 408 if it sent a part).  At
    most ``max_waiting`` heads are read at once (the oldest connection is dropped), and one
    address holds at most ``max_per_client`` connections (more get a 503 on arrival), and at most
    ``max_workers_per_client`` of them are in (or queued for) a worker; its further complete
    requests wait, in arrival order, until one of its own requests is done.
    The handler must be a HeadReadHandler.
    """
    request_queue_size = 128
    max_waiting = 256

    def __init__(self, address, handler, *, workers: int, timeout_s: float,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, min_rate: float = DEFAULT_MIN_RATE,
                 max_per_client: int = DEFAULT_MAX_PER_CLIENT, max_workers_per_client: int | None = None):
        if max_workers_per_client is None:
            max_workers_per_client = default_max_workers_per_client(workers)
        if (workers < 1 or max_per_client < 1 or max_workers_per_client < 1
                or not (timeout_s > 0 and header_timeout_s > 0 and min_rate > 0)):
            raise ValueError(f"need workers >= 1, max_per_client >= 1, max_workers_per_client >= 1 and positive "
                             f"timeouts and min_rate, got workers={workers}, max_per_client={max_per_client}, "
                             f"max_workers_per_client={max_workers_per_client}, timeout_s={timeout_s}, "
                             f"header_timeout_s={header_timeout_s}, min_rate={min_rate}")
        super().__init__(address, handler)
        self.workers, self.timeout_s = workers, timeout_s
        self.header_timeout_s, self.min_rate, self.max_per_client = header_timeout_s, min_rate, max_per_client
        self.max_workers_per_client = max_workers_per_client
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="vidcache-serve")
        self._stop, self._stopped = threading.Event(), threading.Event()
        self._per_client: dict[str, int] = {}     # client host -> its open connections (arriving or in a worker)
        self._given_back: set[int] = set()        # id() of connections whose slot was given back before the close
        self._per_client_guard = threading.Lock()  # workers release theirs; it also guards the two below
        self._in_workers: dict[str, int] = {}     # client host -> its requests submitted to the pool
        self._held: dict[str, collections.deque] = {}   # client host -> its complete heads past its worker share
        self._beyond = 0                          # threads serving an address's first request past a full pool

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._stop.clear()
        self._stopped.clear()
        arriving: dict = {}       # connection -> _Arriving; oldest first
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self.socket, selectors.EVENT_READ)
                while not self._stop.is_set():
                    for k, _ in sel.select(poll_interval):
                        if k.fileobj is self.socket:
                            self._accept(sel, arriving)
                        else:
                            self._read_head(sel, arriving, k.fileobj)
                    now = time.monotonic()
                    late = [(c, a) for c, a in arriving.items() if min(a.head_deadline, a.idle_deadline) <= now]
                    for conn, a in late:
                        # Out of time while sending its head: told so.  Silent from the start: just closed.
                        self._drop(sel, arriving, conn, "408 Request Timeout" if a.head else None)
        finally:
            for conn, a in arriving.items():
                self._close(conn, a.addr)
            self._stopped.set()

    def _accept(self, sel, arriving: dict) -> None:
        try:
            conn, addr = self.get_request()
        except OSError:
            return
        with self._per_client_guard:
            n = self._per_client.get(addr[0], 0)
            if n < self.max_per_client:
                self._per_client[addr[0]] = n + 1
        if n >= self.max_per_client:   # refused here, at once: it never waits for, or takes, a worker
            _reply(conn, "503 Service Unavailable")
            self.shutdown_request(conn)
            return
        conn.setblocking(False)          # this thread reads all heads: no read may block it
        sel.register(conn, selectors.EVENT_READ)
        now = time.monotonic()
        arriving[conn] = _Arriving(addr, now + self.header_timeout_s, now + self.timeout_s)
        if len(arriving) > self.max_waiting:
            self._drop(sel, arriving, next(iter(arriving)))

    def _read_head(self, sel, arriving: dict, conn) -> None:
        a = arriving[conn]
        try:
            data = conn.recv(MAX_HEAD_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:                     # it hung up (or failed) before its head was in
            self._drop(sel, arriving, conn)
            return
        seen = len(a.head)
        a.head += data
        if _END_OF_HEAD.search(a.head, max(0, seen - 3)):   # only the new bytes (and 3 before) can end it
            sel.unregister(conn)
            del arriving[conn]
            self._dispatch(conn, a.addr, bytes(a.head))
        elif len(a.head) > MAX_HEAD_BYTES:
            self._drop(sel, arriving, conn, "431 Request Header Fields Too Large")
        else:
            a.idle_deadline = time.monotonic() + self.timeout_s

    def _drop(self, sel, arriving: dict, conn, status: str | None = None) -> None:
        sel.unregister(conn)
        addr = arriving.pop(conn).addr
        if status is not None:
            _reply(conn, status)
        self._close(conn, addr)

    def give_back_slot(self, conn, addr) -> None:
        """``conn``'s place under its address's cap, given back before the last byte of its response is sent: a
        client that reads the end of one response may open its next connection at once, before this worker is
        scheduled again to close the old one (on 2 loaded cores that window was long enough to give a sequential
        client a 503).  Once per connection; ``_close`` gives back only what is still held."""
        with self._per_client_guard:
            if id(conn) not in self._given_back:
                self._given_back.add(id(conn))
                self._release(addr)

    def _release(self, addr) -> None:        # under _per_client_guard
        self._per_client[addr[0]] -= 1
        if self._per_client[addr[0]] == 0:
            del self._per_client[addr[0]]

    def _close(self, conn, addr) -> None:
        # The slot first (unless given back already): a client that sees this connection end may open the next
        # one at once.
        with self._per_client_guard:
            if id(conn) in self._given_back:
                self._given_back.discard(id(conn))
            else:
                self._release(addr)
        self.shutdown_request(conn)

    def _dispatch(self, conn, addr, head: bytes) -> None:
        """A complete request to a worker, unless its address already has its share of them: then it is held
        (its connection still counts against max_per_client) until one of that address's workers takes it.
        Held rather than refused: a node fetching many files in parallel, within its connection cap, is a
        normal client and should get every file, only not faster than its share of the pool allows; the
        connection cap already bounds how many one address can have held."""
        with self._per_client_guard:
            busy = self._in_workers.get(addr[0], 0)
            if busy >= self._share(busy):
                self._held.setdefault(addr[0], collections.deque()).append((conn, addr, head))
                return
            self._in_workers[addr[0]] = busy + 1
            # An address with no worker gets one now, past the pool if slow readers of other addresses hold it
            # all: however the pool is shared, enough addresses fill it (D50: five, for 16 workers, made a sixth
            # wait 34 s).  Such threads are at most max_waiting, one per address.
            spare = busy == 0 and sum(self._in_workers.values()) - 1 - self._beyond >= self.workers
            spare = spare and self._beyond < self.max_waiting
            self._beyond += spare
        if spare:
            threading.Thread(target=self._work, args=(conn, addr, head, True), daemon=True,
                             name="vidcache-serve-first").start()
        else:
            self._pool.submit(self._work, conn, addr, head)

    def _share(self, busy: int) -> int:
        """The workers an address holding ``busy`` of them may occupy: at most half of what the other addresses
        leave free (and ``max_workers_per_client``), at least one.  A fixed half let two addresses fill the pool
        (D50: 8 slow readers from each of two made a third wait 35.7 s); halving what is left means filling it
        takes an address per halving (5 for 16 workers), and the first comers keep what they hold."""
        others = sum(self._in_workers.values()) - busy
        return min(self.max_workers_per_client, max(1, (self.workers - others) // 2))

    def _work(self, conn, addr, head: bytes, beyond: bool = False) -> None:
        # Then the address's held requests, in this same worker: its share of the pool is not exceeded,
        # and nothing is submitted to a pool that server_close may have shut down meanwhile.
        while True:
            try:
                self.finish_request((conn, head), addr)
            except (ConnectionError, TimeoutError):   # the client went away or stalled: nothing to report
                pass
            except Exception:  # noqa: BLE001 -- reported as socketserver does; the pool thread lives on
                self.handle_error(conn, addr)
            finally:
                self._close(conn, addr)
            with self._per_client_guard:
                held = self._held.get(addr[0])
                if not held:
                    self._in_workers[addr[0]] -= 1
                    if self._in_workers[addr[0]] == 0:
                        del self._in_workers[addr[0]]
                    self._beyond -= beyond
                    return
                conn, addr, head = held.popleft()
                if not held:
                    del self._held[addr[0]]

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait until it has returned (running requests finish on their own)."""
        self._stop.set()
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False)


def _send_file(conn, fd: int, size: int, deadline: float, before_last=None) -> None:
    """All ``size`` bytes of ``fd`` to ``conn`` by ``deadline`` (monotonic), else TimeoutError; ``before_last()``
    is called once all but the last byte are sent (the client cannot have seen the end yet).
    socket.sendfile would time out only a single wait, and a trickling reader never makes one that long."""
    offset = 0
    with selectors.DefaultSelector() as sel:
        sel.register(conn, selectors.EVENT_WRITE)
        while offset < size:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise TimeoutError(f"response not sent by its deadline ({offset} of {size} bytes)")
            end = size - 1 if before_last is not None else size
            try:                  # conn has a timeout, so it is non-blocking: sendfile sends what fits
                sent = os.sendfile(conn.fileno(), fd, offset, end - offset) if end > offset else 0
            except BlockingIOError:
                continue
            if end > offset and sent == 0:
                raise ConnectionError(f"file ended at {offset} of {size} bytes")
            offset += sent
            if offset == end and before_last is not None:
                before_last()
                before_last = None


class FrozenFileHandler(HeadReadHandler):
    """GET/HEAD ``/frozen/<key><suffix>`` from ``self.server.cache`` (``make_server``'s): http.server's idiom, a
    module-level handler that reads what it serves from its server."""
    server_version = "vidcache"

    def setup(self) -> None:
        self.timeout = self.server.timeout_s   # every write of headers and errors (the body has its own deadline)
        super().setup()

    def log_message(self, *args) -> None:
        pass

    def give_back_slot(self) -> None:
        self.server.give_back_slot(self.connection, self.client_address)

    def send_error(self, *args, **kwargs) -> None:
        self.give_back_slot()           # an error is this connection's last response (small: given back first)
        super().send_error(*args, **kwargs)

    def _open(self):
        """(fd, stat, key, format) of the file to serve, or None after an error response."""
        m = _PATH.fullmatch(self.path)
        if m is None:
            self.send_error(404, "expected /frozen/<key>.mkv or .nut")
            return None
        cache = self.server.cache
        key, fmt = m.group(1), _SUFFIX[m.group(2)]
        path = os.path.join(cache.frozen.dir, key + fmt.suffix)
        try:
            # Only keys the cache holds: a file (or link) at a key-shaped name is not enough.
            if cache.manifest(key) is None:
                raise NotCachedError(key)
            if (first := _open_regular(path)) is not None:   # a symlink or FIFO is refused before any read
                os.close(first[0])
            with self.server.freezing(path):
                # Every request: the file is checked against its recorded digest (once per process while
                # unchanged), and written, or remade when corrupt, from the frames.
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
            if not body or st.st_size == 0:
                self.give_back_slot()     # the headers are the whole response
            self.end_headers()
            if body:
                # A total deadline, so a client reading a trickle cannot hold this worker for ever; the slot is
                # given back before the last byte, so a client that reads the end can connect again at once.
                _send_file(self.connection, f.fileno(), st.st_size,
                           time.monotonic() + self.server.timeout_s + st.st_size / self.server.min_rate,
                           before_last=self.give_back_slot)

    def do_HEAD(self) -> None:
        self._respond(body=False)

    def do_GET(self) -> None:
        self._respond(body=True)


def make_server(cache: VideoCache, host: str = "127.0.0.1", port: int = 0, *,
                workers: int = DEFAULT_WORKERS, timeout_s: float = DEFAULT_TIMEOUT_S,
                header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S, min_rate: float = DEFAULT_MIN_RATE,
                max_per_client: int = DEFAULT_MAX_PER_CLIENT,
                max_workers_per_client: int | None = None) -> FrozenFileServer:
    """A ``FrozenFileServer`` of ``cache``'s frozen files (not started: call ``serve_forever``).
    ``max_workers_per_client`` None: ``default_max_workers_per_client(workers)``, half the pool."""
    server = FrozenFileServer((host, port), FrozenFileHandler, workers=workers, timeout_s=timeout_s,
                              header_timeout_s=header_timeout_s, min_rate=min_rate, max_per_client=max_per_client,
                              max_workers_per_client=max_workers_per_client)
    server.cache = cache
    server.freezing = _FileLocks()       # one first-time freeze per file; readers of existing files take no lock
    return server
