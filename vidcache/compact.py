"""The shared tier's compact layout: one lossless frozen object per entry (``frozen/<key>.nut``) in place of its
raw frames (``cas/<blob>``).

The object is also the stock-mode frozen file SGLang reads by URL, so a stock cluster stores each entry once.
It is keyed by *entry*, not by content, and needs the manifest's shape to decode, so it is a policy over the
shared store rather than a store of its own (bb-storage's CAS-chunking decorator is the nearest shape).  What
stays true:
  * an object is published only once it decodes to exactly the frames with every decoder SGLang may use;
  * an object already at the name is trusted only once it decodes to the entry's frames (D32);
  * a read decodes the object as it arrives (``store/prefetch``), checks the frames against the blob digest,
    and only then serves them and copies them into the local tier behind the read (``store/backfill``);
  * an object whose bytes are not its recorded ones is replaced even when it decodes exactly here, by a
    node that writes the layout, and never deleted before its replacement is in place (D42);
  * a fetch cut off part-way is the tier's failure, never a corrupt object: nothing is quarantined.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Callable

from . import keys
from .digest import Digest, StreamingDigest
from .errors import (ConfigError, DigestMismatchError, NotRegularFileError, OversizedObjectError,
                     SharedUnavailableError, warn_once)
from .frozen_copies import FrozenCopies
from .integrity import compact_frames, frozen_problem, max_object_bytes, tier_copy  # noqa: F401 (re-exported)
from .manifest import Manifest, blob_users
from .serving import COMPACT_FORMAT
from .store.backfill import Backfill, OneWriter
from .store.base import Store
from .store.prefetch import Prefetch

if TYPE_CHECKING:
    import numpy as np
    import torch

log = logging.getLogger("vidcache")

UNFETCHED = object()     # "not fetched yet", as distinct from a fetch that found nothing (None)


class CompactLayout:
    """The compact copies of a node's entries in its shared tier; ``publish`` writes only when ``writes``."""

    def __init__(self, shared: Store | None, local: Store, *, frozen: FrozenCopies, backfill: Backfill,
                 tmp_dir: str, writes: bool) -> None:
        self.shared, self.local, self.frozen, self.backfill = shared, local, frozen, backfill
        self.tmp_dir, self.writes = tmp_dir, writes
        self.republish = Republish()        # replacements of damaged objects, for the writer thread (D42)

    @staticmethod
    def suffix() -> str:
        """The compact object's file suffix (its frozen-file format's)."""
        from .frozen_file import FORMATS     # here: frozen_file brings numpy, which manifest-only commands skip
        return FORMATS[COMPACT_FORMAT].suffix

    @classmethod
    def key(cls, key: str) -> str:
        """Where the shared tier keeps entry ``key``'s compact object."""
        return keys.frozen(key, cls.suffix())

    def holds(self, key: str, blob: str) -> bool:
        """Whether the shared tier holds entry ``key``'s frames in either form: raw (``cas/``) or compact."""
        return self.shared is not None and any(self.shared.exists_many([keys.cas(blob), self.key(key)]))

    # --- write ------------------------------------------------------------------------------
    def publish(self, key: str, frames: "torch.Tensor", m: Manifest) -> bool:
        """Put ``key``'s frames into the shared tier as its compact object, verified to decode exactly with
        every decoder SGLang may use, its digest recorded after it.  False: the tier keeps raw frames for
        this entry (a raw-layout cache, no shared tier, or a clip no frozen file holds exactly).  ``m``: the
        entry's manifest, what an object already at the name must decode to before it is trusted."""
        if (value := self._encode(key, frames)) is None:
            return False
        if self._put(key, value):
            return True
        # Something is at the name already (another node's object, or a stock-mode frozen file of the older
        # layout): trusted only once it decodes to these frames (D32: a bit-rotted one was trusted, and the upgrade
        # then deleted the entry's only sound frames).  An unsound one is replaced in one atomic step, a copy of
        # it kept aside: never deleted before ours is in place (D42).
        if (there := self.sound(key, m)) is None:
            try:    # read as far as the manifest bounds it: a bloated object costs its bound, not its size (D59)
                bad, _ = self.shared.get_bounded(self.key(key), max_object_bytes(m))
            except NotRegularFileError:
                bad = b""                               # no object at all (D58): nothing to keep, replaced
            log.warning("the shared tier's object %s is not a clean copy of entry %s's frames: moved aside, "
                        "replaced", self.key(key), key)
            if bad is None:                             # gone meanwhile: the name is free again
                return self._put(key, value) or self.sound(key, m) is not None
            return self._replace(key, value, Digest.of(bad), m) or self.sound(key, m) is not None
        if self.shared.get(keys.frozen_digest(key, self.suffix())) is None:   # D39: a crash between the object and
            self.frozen.record("shared", key, self.suffix(), there)              # its record left none
        return True

    def _encode(self, key: str, frames: "torch.Tensor") -> bytes | None:
        """``frames`` as the compact object's bytes, verified to decode exactly with every decoder SGLang may
        use; None when this node does not write the layout or no frozen file holds the clip exactly."""
        if self.shared is None or not self.writes:
            return None
        import tempfile

        from .errors import FrozenFileError
        from .frozen_file import FORMATS, verify_frozen, write_frozen
        f = FORMATS[COMPACT_FORMAT]
        os.makedirs(self.tmp_dir, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.tmp_dir) as d:
            path = os.path.join(d, key + f.suffix)
            try:
                write_frozen(frames, path, f.name, verify=lambda p: verify_frozen(p, frames))
            except FrozenFileError as e:      # e.g. decord cannot open a 2-frame NUT: raw frames instead
                log.info("entry %s stays raw in the shared tier: %s", key, e)
                return None
            with open(path, "rb") as fh:
                return fh.read()

    def _replace(self, key: str, value: bytes, bad: Digest, m: Manifest) -> bool:
        """Put ``value`` (verified) in place of the object at ``key``'s name, if that is still the bad one
        (``bad``, its digest): a copy of the bad bytes goes to ``quarantine/`` first, then the new object
        replaces the old in one atomic step (a rename on a directory, one PUT on S3), then its record.  At
        no moment is the name empty: a reader meanwhile is served the old object, a crash at any point leaves
        a copy that decodes to the frames (D42).  False when the object there is no longer the bad one.  ``bad``
        is the digest of the object's first ``max_object_bytes(m)`` bytes, all that is read or kept of it (D59)."""
        if not self.frozen.set_aside("shared", key, self.suffix(), bad, max_object_bytes(m)):
            return False                               # replaced by another node meanwhile: theirs stays
        self.shared.set_many({self.key(key): value})
        self.frozen.record("shared", key, self.suffix(), value)
        return True

    def _put(self, key: str, value: bytes) -> bool:
        """Publish ``value`` as ``key``'s object if the name is free, its digest recorded after it."""
        if not self.shared.set_if_not_exists(self.key(key), value):
            return False
        self.frozen.record("shared", key, self.suffix(), value)
        return True

    def sound(self, key: str, m: Manifest) -> bytes | None:
        """The shared tier's compact object of ``key`` when it decodes to exactly ``m``'s frames, nothing after them,
        and its bytes are the recorded ones (where a record was written: damage PyAV conceals is damage still),
        else None."""
        try:
            value, record = self.frozen.read("shared", key, self.suffix(), max_object_bytes(m))
        except NotRegularFileError:
            return None
        if value is None or (record is not None and frozen_problem(value, record) is not None):
            return None      # the hash first: it is cheap, the decode is not
        if len(value) >= max_object_bytes(m):
            return None      # bloated (D59): its first bytes were read, never all of it
        got = compact_frames(value, m)
        return value if got.frames is not None and got.trailing is None else None

    # --- read -------------------------------------------------------------------------------
    def prefetch(self, key: str) -> Prefetch:
        """Start fetching ``key``'s compact object now, to be decoded as it arrives by ``expand``."""
        return Prefetch(self.shared, self.key(key), hasher=StreamingDigest())   # for _check_bytes

    def expand(self, m: Manifest, value=UNFETCHED) -> "np.ndarray | None":
        """``m``'s frames from the shared tier's compact object (``value``: the ``Prefetch`` bringing it, when
        the caller began the fetch; else one is started here, so every read decodes as it downloads):
        decoded, checked against the blob digest (and its bytes against their record), and only then
        backfilled into the local tier.  None when the tier has no compact object for it; a copy that decodes
        to other bytes is quarantined and raised (``DigestMismatchError``), never served; a fetch that failed
        part-way raises the tier's error instead, quarantining nothing."""
        if self.shared is None:
            return None
        if value is UNFETCHED:
            value = self.prefetch(m.key)
        value.limit(max_object_bytes(m))    # the store's bound is any entry's; this is this entry's (D51)
        if not value.found():
            return None
        record = self.shared.get(keys.frozen_digest(m.key, self.suffix()))   # while the object streams in
        raw, why, trailing = compact_frames(value, m)
        if why is not None:
            try:
                value.finish()   # a fetch cut off part-way raises here: the tier failed, not the object
            except OversizedObjectError:
                pass             # the bound cut it off, and its frames were not in what came: damage, not outage
            self.frozen.quarantine("shared", m.key, self.suffix(), bad=value.hasher.digest(),
                                   limit=max_object_bytes(m))
            raise DigestMismatchError(f"entry {m.key}: the shared tier's compact object {why}")
        # Every frame is exact: the object is sound, and served, whatever follows its last frame (D55).
        self._check_bytes(m, value, record, raw, trailing)
        if not self.local.read_only:   # returns once the local tier holds its own copy; the commit goes on
            self.backfill.put(keys.cas(m.frames.blob), m.frames.encode(raw))
        return raw

    def _check_bytes(self, m: Manifest, value: Prefetch, record: bytes | None, raw: "np.ndarray",
                     trailing: str | None) -> None:
        """An object that decoded to exactly ``m``'s frames but whose bytes are not the ones recorded for it, or that
        goes on after its last frame (``trailing``: bytes appended, more frames, bloat past its manifest's bound),
        is damaged all the same: the damage fell where this decoder conceals it, and another decoder (SGLang's,
        reading the object by URL) may conceal it otherwise.  The frames are exact, so the read is served.
        The object stays where it is (it is the entry's only copy in the tier, and a sound one as far as these
        frames go): a node that writes the compact layout queues its replacement for the writer thread, which
        encodes the frames, verifies them, and only then swaps the objects (``_replace``); any other node
        only reports it (D42: the object was deleted before its replacement existed, or for ever; D55: an object
        with one byte appended was deleted by every reader)."""
        why = trailing
        try:
            value.finish()   # all of it hashed (as far as the manifest bounds it)
        except OversizedObjectError:
            why = f"is more than {max_object_bytes(m)} bytes, more than its entry writes"
        except SharedUnavailableError:
            if why is None:
                return       # cut off after the frames: they are exact, and a part of the bytes proves nothing
        if why is None and record is not None:
            why = frozen_problem(value.hasher.digest(), record)
        if why is None:
            return           # no record either (D39: a crash between object and record; verify --repair records it)
        bad = value.hasher.digest()
        if not self.writes:
            warn_once(f"unsound-object:{m.key}", "vidcache: the shared tier's object %s decodes to entry %s's "
                      "frames but %s: left in place (this node does not write the compact layout); "
                      "`vidcache verify --shared --repair` on a compact-layout node replaces it",
                      self.key(m.key), m.key, why)
            return
        log.warning("the shared tier's object %s decodes to entry %s's frames but %s: moved aside, replaced "
                    "(queued)", self.key(m.key), m.key, why)
        self.republish.submit(m.key, lambda: self._republish(m, raw, bad))

    def _republish(self, m: Manifest, raw: "np.ndarray", bad: Digest) -> None:
        """The writer's side of ``_check_bytes``: encode, verify, then replace the bad object (never delete)."""
        if (value := self._encode(m.key, as_tensor(raw, m))) is not None:
            self._replace(m.key, value, bad, m)

    # --- convert ----------------------------------------------------------------------------
    def upgrade(self, entry_keys: list[str], manifest: Callable[[str], Manifest | None],
                stop: Callable[[], bool] = lambda: False) -> dict:
        """Convert entries an older vidcache wrote to the shared tier as raw frames (``cas/``) into compact
        objects.  Each raw blob is deleted from the tier only after every entry there that uses it has its
        compact object, proven to decode to it.  Only on request (``vidcache verify --shared --upgrade``).
        ``stop`` (a Ctrl-C): asked between entries; the entries converted so far still free their raw frames,
        and ``interrupted`` counts the entries left for a re-run."""
        sh = self.shared
        if sh is None or not self.writes:
            raise ConfigError("upgrading needs a writable shared tier in the compact layout")
        out = {"converted": 0, "already": 0, "kept_raw": 0, "freed_bytes": 0, "interrupted": 0}
        users = blob_users(sh)                    # blob -> every entry of the tier that names it
        touched = set()
        for i, key in enumerate(entry_keys):
            if stop():
                out["interrupted"] = len(entry_keys) - i
                break
            copy = tier_copy(sh, key, self.key(key))
            if copy.manifest is None or copy.problem is not None:
                continue                     # verify reports it; nothing is converted from a bad copy
            if copy.compact:
                out["already"] += 1
            elif self.sound(key, copy.manifest) is not None:
                # Converted by an earlier run that stopped before freeing the raw frames (D41: such a re-run
                # said "converted"): already compact, and its raw blob may go now.
                out["already"] += 1
                touched.add(copy.manifest.frames.blob)
            elif self.publish(key, as_tensor(copy.frames, copy.manifest), copy.manifest):
                out["converted"] += 1
                touched.add(copy.manifest.frames.blob)
            else:
                out["kept_raw"] += 1
        for b in touched:
            if all((mk := manifest(k)) is not None and self.sound(k, mk) is not None for k in users.get(b, [])):
                out["freed_bytes"] += sh.size(keys.cas(b)) or 0
                sh.delete(keys.cas(b))
        return out


class Republish(OneWriter):
    """Replacements of damaged shared objects, run by one writer thread per process so that a read never
    encodes (``CompactLayout._check_bytes`` queues them; ``drain`` waits for them, as ``ReadPath.settle`` does
    before the cache looks at the tiers).  One job per entry at a time.  A process killed with jobs queued loses only
    the jobs: the objects they would replace are still in place, and the next reader queues them again."""

    def __init__(self) -> None:
        super().__init__("vidcache-republish")

    def submit(self, key: str, job: Callable[[], None]) -> None:
        pool, pending = self._state()
        with self._lock:
            if key in pending:
                return

            def run() -> None:
                try:
                    job()
                except Exception as e:      # noqa: BLE001 -- the object stays as it was; a later read queues it again
                    log.warning("vidcache: the shared tier's object of entry %s was not replaced: %s", key, e)
                finally:
                    with self._lock:
                        pending.pop(key, None)
            pending[key] = pool.submit(run)

    def drain(self) -> None:
        """Return once every replacement this process queued has run."""
        self._wait_all()


def as_tensor(frames, m: Manifest) -> "torch.Tensor":
    """Raw frame bytes of ``m`` as the uint8 TCHW tensor the frozen-file writer takes."""
    import torch
    return torch.frombuffer(bytearray(frames), dtype=torch.uint8).reshape(m.frames.shape)
