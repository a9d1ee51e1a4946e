"""The whole vidcache exception tree.

Every error also subclasses the builtin that callers already catch, so
``except FileNotFoundError`` keeps working around vidcache calls.  Each error
has a short ``kind`` used in prewarm's failures JSONL.
"""
from __future__ import annotations


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


class EmptySourceError(SourceError, ValueError):
    kind = "empty"


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


class DigestMismatchError(StoreError):
    kind = "digest_mismatch"


class ManifestConflictError(StoreError):
    """A different manifest already exists under this key: the pipeline is not deterministic."""
    kind = "manifest_conflict"


class FrozenFileError(VidcacheError, RuntimeError):
    """A frozen file did not re-decode to exactly the cached frames."""
    kind = "frozen_mismatch"


class ParityError(VidcacheError, RuntimeError):
    """SGLang's view of a request diverged from the trainer's (divergence guard)."""
    kind = "divergence"


class BackendUnavailableError(VidcacheError, ImportError):
    kind = "backend_unavailable"
