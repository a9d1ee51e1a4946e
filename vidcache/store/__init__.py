"""Bytes under string keys: the store ABC and its backends (``from vidcache.store import LMDBStore``).

As zarr's ``storage/__init__.py``: each store lives in its own module and is re-exported here.  Importing
this package stays cheap: no torch; fsspec and lmdb are what ``fsspec`` and ``lmdb`` import anyway.
"""
from .base import Store
from .directory import DirectoryStore
from .fsspec import FsspecStore
from .lmdb import LMDBStore
from .memory import MemoryStore
from .s3 import S3Store
from .tiered import TieredStore

__all__ = ["DirectoryStore", "FsspecStore", "LMDBStore", "MemoryStore", "S3Store", "Store", "TieredStore"]
