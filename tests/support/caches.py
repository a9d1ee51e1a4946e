"""Caches as a server meets them, for tests."""
from __future__ import annotations

import contextlib

import pytest

from vidcache.node import node_cache, open_cache


@contextlib.contextmanager
def node_cache_in(path):
    """This process's node cache at ``path`` (``VIDCACHE_DIR``, no shared tier): the one the plugin resolves
    references through, as on a server."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(path))
        mp.delenv("VIDCACHE_SHARED", raising=False)
        c = open_cache()
        assert c is node_cache() and c.path == str(path)
        yield c
