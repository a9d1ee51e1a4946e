"""The real SGLang servers' tests: a test marked ``servers(predicate)`` runs only on the module's servers whose
``(family, mode, vision)`` the predicate accepts; the others are deselected at collection (not skipped with the
servers up), so every test that runs is one that applies."""
from __future__ import annotations


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        marker = item.get_closest_marker("servers")
        params = getattr(getattr(item, "callspec", None), "params", {})
        if marker is not None and "server" in params and not marker.args[0](*params["server"]):
            drop.append(item)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
