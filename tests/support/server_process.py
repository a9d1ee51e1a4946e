"""A server the tests start as a child process: its log file, a JSON POST that returns refusals too, and a close
that takes the whole process group when the child leads one (``start_new_session=True``: SGLang's and vLLM's
servers start workers of their own).  Shared by the SGLang and vLLM server helpers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.error
import urllib.request


class ServerProcess:
    """Subclasses set ``self.proc`` (the Popen), ``self.log`` (its open log file) and ``self.url``."""

    proc: subprocess.Popen
    url: str

    def post_json(self, path: str, body: dict, timeout: float = 600) -> tuple[int, dict]:
        """``(status, JSON body)``, errors included: the engines answer a refused request 400 with their message."""
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def close(self) -> None:
        if self.proc.poll() is None:
            # Its own group only (the child leads it): the server and the workers it started; a child that
            # leads none is killed alone.
            leads = os.getpgid(self.proc.pid) == self.proc.pid
            stop = (lambda sig: os.killpg(self.proc.pid, sig)) if leads else (lambda sig: self.proc.send_signal(sig))
            stop(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                stop(signal.SIGKILL)
                self.proc.wait(timeout=30)
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
