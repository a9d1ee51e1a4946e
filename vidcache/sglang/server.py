"""``vidcache serve``: frozen files over HTTP for SGLang nodes without a shared filesystem.

Entries are content-addressed and immutable, so responses carry a strong ETag
(the key) and ``Cache-Control: immutable``.  Only ``GET/HEAD /frozen/<key>.mkv``
(and ``.nut`` for the UT Video format) exists; a frozen file is written (and verified) on
first request.
"""
from __future__ import annotations

import http.server
import os
import re
import shutil
import threading

from ..cache import VideoCache
from ..errors import NotCachedError
from .frozen import BY_SUFFIX as _SUFFIX, local_frozen_path
_PATH = re.compile(r"^/frozen/([0-9a-f]{32}\.[0-9]+\.[0-9a-f]{32})(" +
                   "|".join(re.escape(x) for x in _SUFFIX) + ")$")


def make_server(cache: VideoCache, host: str = "127.0.0.1", port: int = 0) -> http.server.ThreadingHTTPServer:
    lock = threading.Lock()   # one writer per frozen file; readers of existing files do not wait

    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "vidcache"

        def log_message(self, *args) -> None:
            pass

        def _resolve(self) -> str | None:
            m = _PATH.match(self.path)
            if m is None:
                self.send_error(404, "expected /frozen/<key>.mkv or .nut")
                return None
            key, fmt = m.group(1), _SUFFIX[m.group(2)]
            try:
                with lock:
                    return local_frozen_path(cache, key, fmt.name)
            except NotCachedError:
                self.send_error(404, f"no entry {key}")
                return None

        def _headers(self, path: str, key: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", _SUFFIX[os.path.splitext(path)[1]].media_type)
            self.send_header("Content-Length", str(os.path.getsize(path)))
            self.send_header("ETag", f'"{key}"')
            self.send_header("Cache-Control", "public, max-age=31536000, immutable")
            self.end_headers()

        def do_HEAD(self) -> None:  # noqa: N802
            path = self._resolve()
            if path:
                self._headers(path, os.path.splitext(os.path.basename(path))[0])

        def do_GET(self) -> None:  # noqa: N802
            path = self._resolve()
            if path:
                self._headers(path, os.path.splitext(os.path.basename(path))[0])
                with open(path, "rb") as f:
                    shutil.copyfileobj(f, self.wfile)

    return http.server.ThreadingHTTPServer((host, port), Handler)
