"""Where an entry's frozen files are and what each tier recorded for them: this node's files, the shared tier's
objects, and the digest written beside each copy once it was verified by decoding.

Files, because SGLang reads a frozen file by path or URL.  ``sglang/frozen.py`` makes and hands out the copies;
``compact.py`` keeps one of them as the shared tier's copy of the frames.  Nothing here decodes: whether a copy is
sound is ``integrity.frozen_problem``'s answer (its bytes against its record).
"""
from __future__ import annotations

import bisect
import contextlib
import os
from typing import Callable

from . import keys
from .config import NodeLayout
from .digest import Digest
from .errors import NotRegularFileError, PermissionDeniedError, ReadOnlyStoreError, warn_once
from .integrity import frozen_problem
from .store.base import Store


class FrozenCopies:
    """The frozen copies of a node's entries, in its local tier (files + records) and its shared tier (objects)."""

    def __init__(self, layout: NodeLayout, local: Store, shared: Store | None, read_only: bool) -> None:
        self.layout, self.local, self.shared, self.read_only = layout, local, shared, read_only
        self._listing: dict | None = None       # tier name -> its frozen names, sorted (``listed``)

    @property
    def dir(self) -> str:
        return self.layout.frozen_dir

    def copies(self, key: str) -> list[tuple[str, str]]:
        """(tier name, suffix) of every frozen file of ``key``: this node's files, the shared tier's objects."""
        keys.check_key(key)
        out = [("local", n[len(key):]) for n in self._names("local", key)]
        if self.shared is not None:
            out += [("shared", n[len(key):]) for n in self._names("shared", key)]
        return out

    def _names(self, tier: str, key: str) -> list[str]:
        """The frozen names in ``tier`` that start with ``key``: from the listing ``listed`` took, or listed now."""
        if self._listing is None:
            return self._list(tier, key)
        if tier not in self._listing:
            self._listing[tier] = self._list(tier, "")
        names = self._listing[tier]
        i = bisect.bisect_left(names, key)
        j = i
        while j < len(names) and names[j].startswith(key):
            j += 1
        return names[i:j]

    def _list(self, tier: str, key: str) -> list[str]:
        if tier == "shared":       # names are hashed into shards: a key's objects need the namespace's listing
            return [k[len(keys.FROZEN):] for k in self.shared.keys(keys.FROZEN + key)]
        with contextlib.suppress(FileNotFoundError):
            return sorted(n for n in os.listdir(self.dir) if n.startswith(key))
        return []

    @contextlib.contextmanager
    def listed(self):
        """Within it, ``copies`` reads one listing of each tier's frozen files (taken when first needed) instead of
        one per entry: for a walk over many entries that changes no frozen file (``verify`` without ``--repair``).
        Issue 50: ``verify --shared`` listed the tier's whole frozen namespace for every entry, and every entry
        has an object there (its compact object): O(n^2) requests and names."""
        self._listing = {}
        try:
            yield
        finally:
            self._listing = None

    def read(self, tier: str, key: str, suffix: str, limit: int | None = None):
        """(bytes, recorded digest) of one frozen copy; bytes None when absent.  ``limit``: of a shared object,
        read at most that many bytes (its manifest's bound, ``integrity.max_object_bytes``; D59: a bloated
        object was read whole): a longer one is its first ``limit`` bytes, which never hash to its record."""
        rkey = keys.frozen_digest(key, suffix)
        if tier == "shared":
            return self._shared_bytes(keys.frozen(key, suffix), limit), self.shared.get(rkey)
        try:
            with open(os.path.join(self.dir, keys.check_key(key) + suffix), "rb") as f:
                value = f.read()
        except FileNotFoundError:
            value = None
        return value, self.local.get(rkey)

    def _shared_bytes(self, skey: str, limit: int | None):
        return self.shared.get(skey) if limit is None else self.shared.get_bounded(skey, limit)[0]

    def record(self, tier: str, key: str, suffix: str, value) -> None:
        """Record the digest of a frozen copy that was just verified against the frames (by decoding)."""
        store = self.shared if tier == "shared" else self.local
        if not store.read_only:
            store.set_many({keys.frozen_digest(key, suffix): str(Digest.of(value)).encode()})

    def set_aside(self, tier: str, key: str, suffix: str, bad: Digest, limit: int | None = None) -> bool:
        """Copy the shared object of ``key`` into ``quarantine/`` if it is still the bad one (``bad``, the digest of
        its bytes, or of its first ``limit``), leaving it in place; False when it is another object now (a racing
        node replaced it) or gone.  Of an object longer than ``limit`` only its first ``limit`` bytes are kept (D59:
        2 GiB of bloat was copied into ``quarantine/``); they hold its frames, if it held any.  Something that is
        no object at all (a FIFO at the name, D58) has nothing to keep: True, so that it is replaced."""
        skey = keys.frozen(key, suffix)
        try:
            value = self._shared_bytes(skey, limit)
        except NotRegularFileError:
            return True
        if value is None or Digest.of(value) != bad:
            return False
        self.shared.set_many({keys.quarantined(skey): value})
        return True

    def quarantine(self, tier: str, key: str, suffix: str, bad: Digest | None = None, limit: int | None = None) -> None:
        """Move a bad frozen copy aside (never served again) and forget its record; it is rebuilt from the
        frames on next use.  Only for a copy that holds no sound frames: a shared compact object that decodes to
        its entry's frames is replaced, never removed (``CompactLayout.publish``; D55, D57).  ``bad``: the digest
        of the bytes found bad; a shared object that is other bytes now (a racing node's fresh one) is left alone
        (D42: it was deleted).  ``limit``: as ``set_aside``'s, the most of it read and kept."""
        if self.read_only:
            return
        rkey = keys.frozen_digest(key, suffix)
        if tier == "shared":
            skey = keys.frozen(key, suffix)
            try:
                if (value := self._shared_bytes(skey, limit)) is not None:
                    if bad is not None and Digest.of(value) != bad:
                        return
                    self.shared.set_many({keys.quarantined(skey): value})
                self.shared.delete(skey)
                self.shared.delete(rkey)
            except (ReadOnlyStoreError, PermissionDeniedError) as e:    # the caller still refuses the copy
                warn_once("quarantine", f"could not move a corrupt copy aside: {e}")
            return
        qdir = self.layout.quarantine_dir
        os.makedirs(qdir, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.replace(os.path.join(self.dir, keys.check_key(key) + suffix), os.path.join(qdir, key + suffix))
        if not self.local.read_only:
            self.local.delete(rkey)

    def problems(self, key: str, repair: bool = False,
                 decodes: Callable[[str, str, bytes], bool] | None = None,
                 replaced: Callable[[str, str], bool] = lambda tier, suffix: False,
                 limit: int | None = None) -> list[str]:
        """Frozen copies of ``key`` whose bytes are not the recorded ones (``repair``: quarantined, except the
        copies ``replaced(tier, suffix)`` names: those are rewritten by their owner, write-then-retire, and never
        deleted first; D57: the compact object was).  A copy without a record is reported too
        (``sglang.frozen.repair_frozen`` checks it by decoding), unless ``decodes(tier, suffix, bytes)`` finds it
        sound: then it is recorded on ``repair`` (a crash between an object and its record, D39, is not damage).
        ``limit``: the most of a shared object read (``read``)."""
        problems = []
        for tier, suffix in self.copies(key):
            try:
                value, record = self.read(tier, key, suffix, limit if tier == "shared" else None)
            except NotRegularFileError as e:         # D58: reported, never opened
                problems.append(f"{tier}: frozen file {suffix}: {e}")
                continue
            if value is None or (why := frozen_problem(value, record)) is None:
                continue
            if record is None and decodes is not None and decodes(tier, suffix, value):
                if repair:
                    self.record(tier, key, suffix, value)
                continue
            problems.append(f"{tier}: frozen file {suffix} {why}")
            if repair and record is not None and not replaced(tier, suffix):
                self.quarantine(tier, key, suffix, limit=limit if tier == "shared" else None)
        return problems
