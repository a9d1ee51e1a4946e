"""The stdlib handler the engine stand-ins share: quiet, and a JSON reply with its length."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class JSONHandler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:     # quiet: the test's output is the test's
        pass

    def reply(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
