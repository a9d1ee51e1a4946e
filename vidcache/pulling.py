"""The pull job (``vidcache pull``): a dataset's entries from the shared tier into this node's local tier, for a
fresh node before a job starts.  Nothing is fetched from a source or built: a video no tier caches is listed.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from dataclasses import dataclass, field

from . import keys
from .cache import VideoCache
from .dataset import InlineBytes, check_media_roots
from .errors import BadRowError, ConfigError, NoMediaError, VidcacheError
from .loader.fetch import canonical_source
from .options import INPUT_KEY, VIDEO_KEY, VideoOptions
from .planning import check_keys, dataset_dir, in_row_order, no_media_message, placed_rows, row_media


# Pulls at once.  Each is mostly waiting: the source's stat or HEAD, the tier's source record and manifest (a
# GET each on S3: round trips of tens of ms), then the object's download; its decode and the local commit let go
# of the GIL (PyAV; one writer thread commits).  With the lookups in the caller's thread and 2 pulls, a fresh node
# pulled 10^4 entries from S3 (moto) at 38 ms an entry, one round trip after another.
PULL_WORKERS = 8


@dataclass
class PullSummary:
    pulled: int = 0           # entries brought into the local tier
    local: int = 0            # entries this node held already
    by_record: int = 0        # of those two, found through the tier's source record (the source not reachable here)
    not_cached: int = 0       # videos no tier holds yet (`vidcache prewarm` builds them)
    failed: int = 0           # videos that could not be pulled, and malformed rows
    failures: list = field(default_factory=list)   # every not-cached video and every failure, with its reason

    def line(self) -> str:
        rec = (f" ({self.by_record} found by the shared tier's source record: their sources are not reachable "
               "here)") if self.by_record else ""
        return (f"pull: {self.pulled} pulled, {self.local} already here{rec}, {self.not_cached} not cached "
                f"(`vidcache prewarm` builds them), {self.failed} failed")


def pull_key(cache: VideoCache, src, opts: VideoOptions) -> tuple[str | None, bool, VidcacheError | None]:
    """(the entry's key or None, found by record, why not) for one video of a row.  A source is first
    looked up as every read does (its validators must match its record).  Where the source cannot be reached
    from this node, the tier's own record of it names its content: enough to copy that entry here (a pull never
    serves: a read still checks the source, or reads by key as ``from_key`` does)."""
    from .errors import SourceError
    from .manifest import SourceRecord
    if isinstance(src, InlineBytes):
        key = src.key(opts)
        return (key, False, None) if cache.contains([key])[0] else (None, False, None)
    try:
        return cache.find(src, opts), False, None
    except SourceError as e:
        raw = cache.store.get(keys.src(canonical_source(src)))
        rec = None if raw is None else SourceRecord.from_json(raw)
        if rec is None:
            return None, False, e
        key = keys.cache_key(rec.digest, opts)
        return (key, True, None) if cache.contains([key])[0] else (None, True, e)


def pull(dataset, cache: VideoCache, options: VideoOptions, *, input_key: str = INPUT_KEY,
         video_key: str = VIDEO_KEY, image_key: str | None = None, split: str | None = None,
         depth: int = 64, max_bytes: int = 2 << 30, progress: bool = False, media_roots=None) -> PullSummary:
    """Bring the entries ``dataset``'s rows name from the shared tier into ``cache``'s local tier: the videos
    taken in row order, each looked up and pulled in one of ``PULL_WORKERS`` threads, at most ``depth`` of them
    taken and not done and ``max_bytes`` of frames (by their manifests) being pulled at once.  Every row is its
    own fate (a malformed row, an unreachable source or a corrupt copy is one record in ``failures``, with its
    reason); a video no tier holds yet is counted ``not_cached``.  Never builds, never fetches a video (one stat
    or HEAD a source).  ``media_roots``: as for ``prewarm``."""
    media_roots = check_media_roots(media_roots)
    if depth < 1 or max_bytes < 1:
        raise ConfigError(f"depth and max_bytes must be positive, got {depth} and {max_bytes}")
    reader = check_keys(dataset, input_key, video_key, image_key, split)
    base = dataset_dir(dataset)
    s = PullSummary()
    seen: set = set()
    pending: set = set()             # futures of _pull_one
    budget = _Bytes(max_bytes)
    n_rows = n_media = 0
    carried: set = set()

    def settle(block: bool) -> None:
        done, _ = concurrent.futures.wait(pending, timeout=None if block else 0,
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        for fut in done:
            pending.discard(fut)
            outcome, by_record, failure = fut.result()
            setattr(s, outcome, getattr(s, outcome) + 1)
            s.by_record += by_record
            if failure is not None:
                s.failures.append(failure)

    pool = concurrent.futures.ThreadPoolExecutor(min(PULL_WORKERS, depth), thread_name_prefix="vidcache-pull")
    try:
        for i, row, where in placed_rows(reader, split, progress, carried, desc="pull"):
            n_rows += 1
            try:
                media = row_media(row, options, input_key, video_key, image_key, base, media_roots)
            except BadRowError as e:
                s.failed += 1
                s.failures.append({**where, "source": None, "kind": e.kind, "error": str(e)})
                continue
            n_media += bool(media.videos or media.images)
            for src, opts in media.videos:
                ident = (str(src.digest) if isinstance(src, InlineBytes) else src, opts.digest)
                if ident in seen:
                    continue
                seen.add(ident)
                while len(pending) >= depth:
                    settle(block=True)
                pending.add(pool.submit(_pull_one, cache, src, opts, {**where, "source": str(src)}, budget))
            if pending:
                settle(block=False)
        while pending:
            settle(block=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    if n_rows and not n_media and not s.failed:
        raise NoMediaError(no_media_message(n_rows, video_key, image_key, sorted(carried)))
    s.failures = in_row_order(s.failures)
    return s


def _pull_one(cache: VideoCache, src, opts: VideoOptions, rec: dict, budget: "_Bytes"
              ) -> tuple[str, bool, dict | None]:
    """One video of the dataset, in a pull thread: (the ``PullSummary`` count it adds to, found by record, its
    failure record or None).  Every error is this video's alone."""
    try:
        key, by_record, why = pull_key(cache, src, opts)
        m = cache.manifest(key) if key is not None else None
        if m is None:
            if why is not None:                  # nothing to look it up by: the source is the only way to it
                return "failed", False, {**rec, "kind": why.kind, "error": f"{why}; and no tier records what "
                                         "this source holds, so its entry cannot be found without it"}
            return "not_cached", False, {**rec, "kind": "not_cached", "error": "not cached yet: no tier holds it "
                                         "under these options (`vidcache prewarm` builds it)"}
        rec = {**rec, "key": key}
        with budget.held(m.frames.nbytes):
            pulled = cache.bring_local(key)
    except VidcacheError as e:
        return "failed", False, {**rec, "kind": e.kind, "error": str(e)}
    except Exception as e:  # noqa: BLE001  one video's failure, never the run's
        return "failed", False, {**rec, "kind": "internal", "error": f"{type(e).__name__}: {e}"}
    return ("pulled" if pulled else "local"), by_record, None


class _Bytes:
    """At most ``limit`` bytes of frames being pulled at once (by their manifests); an entry larger than the
    limit is pulled alone rather than never."""

    def __init__(self, limit: int):
        self.limit, self.used, self.peak = limit, 0, 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def held(self, nbytes: int):
        with self._cond:
            self._cond.wait_for(lambda: self.used == 0 or self.used + nbytes <= self.limit)
            self.used += nbytes
            self.peak = max(self.peak, self.used)
        try:
            yield
        finally:
            with self._cond:
                self.used -= nbytes
                self._cond.notify_all()


__all__ = ["pull", "PullSummary", "pull_key"]
