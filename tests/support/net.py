"""Loopback helpers shared by the tests (a module, not conftest: two conftest.py files share the name ``conftest``,
so ``from conftest import ...`` gets whichever pytest loaded last)."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A loopback port nothing listens on right now (the OS picks it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
