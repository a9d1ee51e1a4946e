"""The pure pipeline: source bytes -> canonical frames."""
from .forks import register as _register_fork_rule

_register_fork_rule()      # before any fork of a process that may hold PyAV's per-thread scalers (loader/forks.py)
