"""A store's value fetched in the background, and read as a file while it arrives.

A node's first read of a shared-tier entry fetched the whole compact object and then decoded it: the
download and the decode one after the other.  ``Prefetch`` starts the fetch (``Store.stream``) in a thread
of its own as soon as the key is known, and is a file that the decoder reads the pieces from as they land,
so the two overlap.

What stays true:
  * the reader gets the value's bytes in order, then an end.  A fetch that fails part-way ends the file
    early: ``read`` never raises into the decoder (PyAV would report it twice), and ``finish()`` raises the
    failure.  So a caller that finds the bytes unsound asks ``finish()`` first, and a network failure is
    never taken for a corrupt object (which would quarantine a sound copy);
  * absent and empty are told apart: ``found()`` waits for the first piece or for the end;
  * pieces are dropped once read, so the whole value is never held twice;
  * a ``hasher`` (the caller's: a store knows bytes, not digests) is fed each piece as it arrives, so the
    bytes can be checked against a record without being held;
  * until the caller bounds the value (``limit``, from the manifest fetched beside it) the fetch runs at most
    ``AHEAD_BYTES`` ahead of the reader, and one nobody bounds or reads for ``ABANDON_S`` ends.
"""
from __future__ import annotations

import collections
import threading

from ..errors import OversizedObjectError, SharedUnavailableError
from .base import Store

# Unread bytes a fetch may hold before its caller bounds it.  The store's bound is any entry's (9 GiB): a fetch
# whose manifest was slow to come streamed on into memory (a planted 512 MB object: the pieces handed over
# before the bound depended on the machine's load), and one whose read went another way (the entry turned up
# locally, or its manifest was missing) streamed the whole object for no one.  Far more than one round trip's
# worth on any tier, so a first read still overlaps the manifest's fetch with the object's.
AHEAD_BYTES = 16 << 20
# A fetch held at AHEAD_BYTES this long, neither bounded nor read, was abandoned by its caller: it ends (its
# thread and connection with it).  A caller that comes later reads what came, then finish() raises.
ABANDON_S = 300.0


class Prefetch:
    """``store``'s value under ``key``, arriving in a background thread; a read-only, unseekable file."""

    def __init__(self, store: Store, key: str, hasher=None) -> None:
        self._cond = threading.Condition()
        self._pieces: collections.deque = collections.deque()
        self._offset = 0                  # bytes of _pieces[0] already read
        self._arrived = False             # a piece has come
        self._done = False
        self._found: bool | None = None
        self._error: BaseException | None = None
        self.hasher = hasher              # anything with update(bytes); read it once finish() returned
        self.key, self._got, self._limit = key, 0, None
        self._held = 0                    # bytes in _pieces not read yet
        threading.Thread(target=self._fetch, args=(store, key), name="vidcache-pull", daemon=True).start()

    def _fetch(self, store: Store, key: str) -> None:
        found, error = None, None
        try:
            found = store.stream(key, self._put)
        except BaseException as e:        # kept for finish(): this thread has no caller to raise to
            error = e
        with self._cond:
            self._done, self._found, self._error = True, found, error
            self._cond.notify_all()

    def _put(self, piece: bytes) -> None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._done or self._limit is not None or self._held < AHEAD_BYTES,
                                       timeout=ABANDON_S):
                raise SharedUnavailableError(f"the fetch of {self.key} was abandoned: {self._held} bytes came and "
                                             f"none was read or bounded for {ABANDON_S:g} s")
            if self._done:                # a transfer that timed out and then woke up: not ours any more
                return
            if piece:
                over = self._limit is not None and self._got + len(piece) > self._limit
                if over:            # the bytes up to the bound are handed on and hashed, as get_bounded keeps them
                    piece = piece[:max(0, self._limit - self._got)]
                self._got += len(piece)
                if piece:
                    if self.hasher is not None:
                        self.hasher.update(piece)
                    self._pieces.append(piece)
                    self._held += len(piece)
                    self._arrived = True
                    self._cond.notify_all()
                if over:
                    raise OversizedObjectError(f"{self.key} is more than {self._limit} bytes, more than its entry "
                                               "can write; not read further")

    def limit(self, n: int) -> None:
        """Stop the fetch, with ``OversizedObjectError``, once more than ``n`` bytes came (the caller learnt
        the bound after the fetch began: a compact object's, from its manifest, D51)."""
        with self._cond:
            self._limit = n
            self._cond.notify_all()       # a fetch held back for want of a bound goes on

    def found(self) -> bool:
        """True once the value's first bytes arrive (or it ends empty), False when the store has no such key;
        the fetch's error when it failed before any byte came."""
        with self._cond:
            self._cond.wait_for(lambda: self._arrived or self._done)
            if self._arrived:
                return True
            if self._error is not None:
                raise self._error
            return bool(self._found)

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that has come, for ``n < 0``), waiting for the next piece when none is
        here; ``b""`` at the end, or where a failed fetch stopped."""
        with self._cond:
            self._cond.wait_for(lambda: self._pieces or self._done)
            if not self._pieces:
                return b""
            if n < 0:
                out = b"".join(self._pieces)[self._offset:]
                self._pieces.clear()
                self._offset = 0
            else:
                piece = self._pieces[0]
                out = piece[self._offset:self._offset + n]
                self._offset += len(out)
                if self._offset == len(piece):
                    self._pieces.popleft()
                    self._offset = 0
            self._held -= len(out)
            self._cond.notify_all()       # room for a fetch held at AHEAD_BYTES
            return out

    def finish(self) -> None:
        """Wait for the fetch to end; raise its error if it failed."""
        with self._cond:
            self._cond.wait_for(lambda: self._done)
            if self._error is not None:
                raise self._error
