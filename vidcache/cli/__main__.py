"""``python -m vidcache.cli``: the ``vidcache`` program."""
from . import entry

entry()
