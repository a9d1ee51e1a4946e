"""The ``vidcache`` CLI as a user runs it: ``python -m vidcache.cli`` in a process of its own, on a node of its own
(``VIDCACHE_DIR`` / ``VIDCACHE_SHARED``), its output and return code captured."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # the checkout

SHELL = ("PATH", "HOME", "PYTHONPATH", "LANG")      # what a user's shell has: enough to start Python
EVERYTHING = "everything"                           # this process's environment, less its own VIDCACHE_* settings


def run_cli(args, node=None, shared=None, *, env=None, inherit=("PATH",), pythonpath=None, code=None, cwd=ROOT,
            timeout=300, stdin=subprocess.DEVNULL, check=False) -> subprocess.CompletedProcess:
    """``python -m vidcache.cli ARGS`` (``code``: ``python -c CODE ARGS``), output captured as text.

    The child's environment: of this process's, only the names in ``inherit`` (``EVERYTHING``: all of it but
    the ``VIDCACHE_*`` settings, so a test's node is never the caller's); then ``VIDCACHE_DIR=node`` and
    ``VIDCACHE_SHARED=shared``, each where given; then ``env``.  ``pythonpath`` (a path or a list of them): the
    child's ``PYTHONPATH`` is those, then the checkout.  It runs in the checkout, so the package imports from it
    without PYTHONPATH.  PATH is always there (decord's loader appends to it; every real shell has one)."""
    if inherit == EVERYTHING:
        child = {k: v for k, v in os.environ.items() if not k.startswith("VIDCACHE_")}
    else:
        child = {k: os.environ[k] for k in inherit if k in os.environ}
    child.setdefault("PATH", "/usr/bin:/bin")
    if node is not None:
        child["VIDCACHE_DIR"] = str(node)
    if shared is not None:
        child["VIDCACHE_SHARED"] = str(shared)
    if pythonpath is not None:
        first = [pythonpath] if isinstance(pythonpath, (str, os.PathLike)) else list(pythonpath)
        child["PYTHONPATH"] = os.pathsep.join([*map(str, first), ROOT])
    child.update({k: str(v) for k, v in (env or {}).items()})
    cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "vidcache.cli"]
    return subprocess.run([*cmd, *map(str, args)], cwd=cwd, env=child, capture_output=True, text=True,
                          timeout=timeout, stdin=stdin, check=check)
