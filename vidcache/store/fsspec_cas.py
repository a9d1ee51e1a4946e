"""Deprecated name of ``vidcache.store.fsspec`` (stores no longer know content addressing): the same module."""
import sys
import warnings

from . import fsspec as _fsspec

warnings.warn("vidcache.store.fsspec_cas is now vidcache.store.fsspec", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _fsspec
