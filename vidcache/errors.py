"""The whole vidcache exception tree.

Every error also subclasses the builtin that callers already catch, so
``except FileNotFoundError`` keeps working around vidcache calls.  Each error
has a short ``kind`` used in prewarm's failures JSONL.  ``warn_once`` is the one
way a condition that stays true for the whole process (a full disk, a refusing
tier) is reported: once, not on every read.
"""
from __future__ import annotations

import logging
import os

_WARNED: set[tuple[int, str]] = set()


def warn_once(what: str, message: str, *args) -> None:
    """Log ``message`` once per ``what`` per process (a forked child warns for itself: its pid differs)."""
    if (os.getpid(), what) not in _WARNED:
        _WARNED.add((os.getpid(), what))
        logging.getLogger("vidcache").warning(message, *args)


# How to get Ray where it is missing: vidcache is not on PyPI (`pip install 'vidcache[ray]'` finds nothing, or another
# project's package), so the extra is named by the checkout or wheel it is installed from, and Ray by its own name.
INSTALL_RAY = "pip install 'ray[default]>=2.40' (or vidcache's extra: pip install '/path/to/vidcache[ray]')"

class VidcacheError(Exception):
    kind = "error"


class SourceError(VidcacheError):
    kind = "source"


class SourceNotFoundError(SourceError, FileNotFoundError):
    kind = "not_found"


class SourceUnavailableError(SourceError, ConnectionError):
    """The source exists in principle but could not be read (refused, HTTP error)."""
    kind = "unavailable"


class SchemeNotAllowedError(SourceError, PermissionError):
    kind = "scheme_not_allowed"


class SourceTooLargeError(SourceError, ValueError):
    kind = "too_large"


class FetchTimeoutError(SourceError, TimeoutError):
    kind = "fetch_timeout"


class SourceChangedError(SourceError, ValueError):
    """A local source that changed while it was hashed and decoded (still being written?)."""
    kind = "source_changed"


class EmptySourceError(SourceError, ValueError):
    kind = "empty"


class BadRowError(VidcacheError, ValueError):
    """A dataset row that is not what vidcache reads (not UTF-8, not JSON, wrong types)."""
    kind = "bad_row"


class OutsideMediaRootError(BadRowError):
    """A row's local image or video resolves (``..`` and symlinks followed) outside the directories its dataset
    may read: its own directory, or the ``--media-root`` directories given (D54)."""
    kind = "outside_media_root"


class DecodeError(VidcacheError, ValueError):
    """The bytes are not a decodable video (truncated, not a video, corrupt)."""
    kind = "decode"


class UnsupportedCodecError(DecodeError):
    kind = "unsupported_codec"


class OptionsError(VidcacheError, ValueError):
    """The options cannot apply to this video (aspect ratio, too few frames, bad values)."""
    kind = "options"


class AspectRatioError(OptionsError):
    kind = "aspect_ratio"


class TooFewFramesError(OptionsError):
    kind = "too_few_frames"


class FrameBudgetError(OptionsError):
    """The decoded frames would exceed the configured memory budget."""
    kind = "too_large"


class ConfigError(VidcacheError, ValueError):
    """A setting that cannot work (an unwritable report path, a missing shared tier)."""
    kind = "config"


class UnknownColumnError(ConfigError, KeyError):
    """A key (``--input-key``, ``--multimodal-keys``, a split) that names no column of the dataset; the
    message lists the columns found."""
    kind = "unknown_column"

    def __str__(self) -> str:          # KeyError's own str() would quote the message
        return str(self.args[0]) if self.args else ""


class NoMediaError(ConfigError):
    """No row of the dataset holds a video or an image under the keys given: the keys are wrong, not the rows."""
    kind = "no_media"


class DatasetFormatError(ConfigError):
    """The dataset file is not a format vidcache reads (a video, a JSON array, a CSV given as JSON Lines)."""
    kind = "dataset_format"


class WorkerError(VidcacheError, RuntimeError):
    kind = "worker"


class WorkerTimeoutError(WorkerError, TimeoutError):
    kind = "timeout"


class WorkerMemoryError(WorkerError, MemoryError):
    kind = "memory"


class NotCachedError(VidcacheError, KeyError):
    kind = "not_cached"

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not cached"


class StoreError(VidcacheError, OSError):
    kind = "store"


class ReadOnlyStoreError(StoreError):
    kind = "read_only"


class ReadOnlyFilesystemError(ReadOnlyStoreError):
    """A tier on a filesystem mounted read-only (EROFS): the store was opened writable, the mount is not."""
    kind = "read_only_fs"


class PermissionDeniedError(StoreError, PermissionError):
    """The tier refused this node (EACCES/EPERM, S3 AccessDenied or missing credentials)."""
    kind = "permission_denied"


class NoSpaceError(StoreError):
    """A tier has no room left for a write (ENOSPC, a quota, a full LMDB map that cannot grow)."""
    kind = "no_space"


class SharedUnavailableError(StoreError, ConnectionError):
    """The shared tier cannot be reached (connection refused or reset, unknown host, S3 throttling)."""
    kind = "shared_unavailable"


class SharedTimeoutError(SharedUnavailableError, TimeoutError):
    """A call to the shared tier got no answer within its time limit (a hung endpoint or NFS server)."""
    kind = "shared_timeout"


class CorruptEntryError(StoreError):
    """Stored bytes or a manifest fail their checks: never served; the entry is quarantined."""
    kind = "corrupt"


class DigestMismatchError(CorruptEntryError):
    kind = "digest_mismatch"


class OversizedObjectError(CorruptEntryError):
    """A shared-tier object larger than any entry can write (its frames, bounded by the decode budget): refused
    before a byte of it is read, never served (D33: one planted 2 GiB object took 4.6 GB to read)."""
    kind = "oversized"


class NotRegularFileError(CorruptEntryError):
    """Something at an object's name in a directory tier that is not a regular file (a FIFO, a device, a socket):
    refused before a byte is read, since opening a FIFO blocks until a writer comes (D58)."""
    kind = "not_regular"


class CorruptManifestError(CorruptEntryError):
    """A manifest that does not parse, has an unknown schema, or disagrees with its blob."""
    kind = "corrupt_manifest"


class InvalidKeyError(StoreError, ValueError):
    """A key that is not of the cache's format (refused before any store is touched)."""
    kind = "invalid_key"


class TierMismatchError(VidcacheError, LookupError):
    """A handle or reference names a shared tier this node is not configured for."""
    kind = "tier_mismatch"


class FrozenFileError(VidcacheError, RuntimeError):
    """A frozen file did not re-decode to exactly the cached frames."""
    kind = "frozen_mismatch"


class ParityError(VidcacheError, RuntimeError):
    """SGLang's view of a request diverged from the trainer's (divergence guard)."""
    kind = "divergence"


class TokenLayoutError(VidcacheError, ValueError):
    """Ids not in the token layout they are said to be in, or a layout name a family does not have
    (``vidcache.token_layout``)."""
    kind = "token_layout"


class ModelTypeError(ConfigError):
    """A checkpoint whose video processing vidcache cannot vouch for: its processor classes or geometry are not
    its model type's, or an unknown model type (``vidcache.families``)."""
    kind = "model_type"


class BackendUnavailableError(VidcacheError, ImportError):
    kind = "backend_unavailable"


class InvalidSourceError(SourceError, ValueError):
    """The source cannot name a video at all: not a string, empty, control characters or lone surrogates,
    a symlink loop, an over-long name, a directory or other non-regular file."""
    kind = "invalid_source"
