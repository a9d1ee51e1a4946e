"""Where an entry's frozen files are and what each tier recorded for them: this node's files, the shared tier's
objects, and the digest written beside each copy once it was verified by decoding.

Files, because SGLang reads a frozen file by path or URL.  ``sglang/frozen.py`` makes and hands out the copies;
``compact.py`` keeps one of them as the shared tier's copy of the frames.  Nothing here decodes: whether a copy is
sound is ``integrity.frozen_problem``'s answer (its bytes against its record).
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable

from . import keys
from .config import NodeLayout
from .digest import Digest
from .errors import PermissionDeniedError, ReadOnlyStoreError, warn_once
from .integrity import frozen_problem
from .store.base import Store


class FrozenCopies:
    """The frozen copies of a node's entries, in its local tier (files + records) and its shared tier (objects)."""

    def __init__(self, layout: NodeLayout, local: Store, shared: Store | None, read_only: bool) -> None:
        self.layout, self.local, self.shared, self.read_only = layout, local, shared, read_only

    @property
    def dir(self) -> str:
        return self.layout.frozen_dir

    def copies(self, key: str) -> list[tuple[str, str]]:
        """(tier name, suffix) of every frozen file of ``key``: this node's files, the shared tier's objects."""
        keys.check_key(key)
        out = []
        with contextlib.suppress(FileNotFoundError):
            out += [("local", n[len(key):]) for n in sorted(os.listdir(self.dir)) if n.startswith(key)]
        if self.shared is not None:
            out += [("shared", k[len(keys.FROZEN) + len(key):]) for k in self.shared.keys(keys.FROZEN + key)]
        return out

    def read(self, tier: str, key: str, suffix: str):
        """(bytes, recorded digest) of one frozen copy; bytes None when absent."""
        rkey = keys.frozen_digest(key, suffix)
        if tier == "shared":
            return self.shared.get(keys.frozen(key, suffix)), self.shared.get(rkey)
        try:
            with open(os.path.join(self.dir, keys.check_key(key) + suffix), "rb") as f:
                value = f.read()
        except FileNotFoundError:
            value = None
        return value, self.local.get(rkey)

    def record(self, tier: str, key: str, suffix: str, value) -> None:
        """Record the digest of a frozen copy that was just verified against the frames (by decoding)."""
        store = self.shared if tier == "shared" else self.local
        if not store.read_only:
            store.set_many({keys.frozen_digest(key, suffix): str(Digest.of(value)).encode()})

    def set_aside(self, tier: str, key: str, suffix: str, bad: Digest) -> bool:
        """Copy the shared object of ``key`` into ``quarantine/`` if it is still the bad one (``bad``, its
        digest), leaving it in place; False when it is another object now (a racing node replaced it) or gone."""
        skey = keys.frozen(key, suffix)
        if (value := self.shared.get(skey)) is None or Digest.of(value) != bad:
            return False
        self.shared.set_many({keys.quarantined(skey): value})
        return True

    def quarantine(self, tier: str, key: str, suffix: str, bad: Digest | None = None) -> None:
        """Move a bad frozen copy aside (never served again) and forget its record; it is rebuilt from the
        frames on next use.  ``bad``: the digest of the bytes found bad; a shared object that is other bytes now
        (a racing node's fresh one) is left alone (D42: it was deleted)."""
        if self.read_only:
            return
        rkey = keys.frozen_digest(key, suffix)
        if tier == "shared":
            skey = keys.frozen(key, suffix)
            try:
                if (value := self.shared.get(skey)) is not None:
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
                 decodes: Callable[[str, str, bytes], bool] | None = None) -> list[str]:
        """Frozen copies of ``key`` whose bytes are not the recorded ones (``repair``: quarantined).  A copy
        without a record is reported too (``sglang.frozen.repair_frozen`` checks it by decoding), unless
        ``decodes(tier, suffix, bytes)`` finds it sound: then it is recorded on ``repair`` (a crash between an
        object and its record, D39, is not damage)."""
        problems = []
        for tier, suffix in self.copies(key):
            value, record = self.read(tier, key, suffix)
            if value is None or (why := frozen_problem(value, record)) is None:
                continue
            if record is None and decodes is not None and decodes(tier, suffix, value):
                if repair:
                    self.record(tier, key, suffix, value)
                continue
            problems.append(f"{tier}: frozen file {suffix} {why}")
            if repair and record is not None:
                self.quarantine(tier, key, suffix)
        return problems

