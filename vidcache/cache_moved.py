"""``VideoCache``'s names from before its policies moved out (issue 30): each still works, with a
``DeprecationWarning`` naming its new home, so code written against vidcache 0.1's cache keeps running while it
is ported.  ``VideoCache`` inherits them; nothing in vidcache calls them."""
from __future__ import annotations

import warnings


def _warn(old: str, new: str) -> None:
    warnings.warn(f"VideoCache.{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def _method(old: str, new: str, home):
    def moved(self, *args, **kwargs):
        _warn(old, new)
        return home(self)(*args, **kwargs)
    moved.__name__, moved.__doc__ = old, f"Deprecated: {new}."
    return moved


def _property(old: str, new: str, home):
    def moved(self):
        _warn(old, new)
        return home(self)
    moved.__name__, moved.__doc__ = old, f"Deprecated: {new}."
    return property(moved)


class MovedNames:
    """The old names, each forwarding to its new home."""
    frozen_bytes = _method("frozen_bytes", "cache.frozen.read", lambda c: c.frozen.read)
    record_frozen = _method("record_frozen", "cache.frozen.record", lambda c: c.frozen.record)
    quarantine_frozen = _method("quarantine_frozen", "cache.frozen.quarantine", lambda c: c.frozen.quarantine)
    frozen_problems = _method("frozen_problems", "cache.frozen.problems", lambda c: c.frozen.problems)
    frozen_copies = _method("frozen_copies", "cache.frozen.copies", lambda c: c.frozen.copies)
    compact_key = _method("compact_key", "cache.compact.key", lambda c: c.compact.key)
    publish_missing = _method("publish_missing", "cache.ensure (a local hit the shared tier lacks is published)",
                              lambda c: c._publish_missing)
    sources_by_digest = _method("sources_by_digest", "cache.listing()'s sources", lambda c: c._sources_by_digest)
    frozen_dir = _property("frozen_dir", "cache.frozen.dir", lambda c: c.frozen.dir)
    decoder = _property("decoder", "cache.config.decoder", lambda c: c.config.decoder)
    limits = _property("limits", "cache.config.limits", lambda c: c.config.limits)
