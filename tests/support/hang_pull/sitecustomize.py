"""Loaded by every Python started with this directory on ``PYTHONPATH`` (the read-ahead pull worker, in
``tests/test_readahead.py``): the pull of the key named by ``$VIDCACHE_TEST_HANG_KEY`` hangs inside its decode,
holding the key's pull lock, so a test can kill the worker mid-pull.  A test's stand-in for a hung tier."""
import os
import time

_KEY = os.environ.get("VIDCACHE_TEST_HANG_KEY")
if _KEY:
    from vidcache.compact import CompactLayout

    _real = CompactLayout.expand

    def _expand(self, m, value=None, **kw):
        if m.key == _KEY:
            print(f"hanging {m.key}", flush=True)
            time.sleep(600)
        return _real(self, m, value, **kw)

    CompactLayout.expand = _expand
