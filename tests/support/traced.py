"""What a walk holds before it hands over its first item: Python's traced allocations (issue 50's walks)."""
from __future__ import annotations

import tracemalloc
from typing import Callable, Iterator


def first_and_peak(walk: Callable[[], Iterator]) -> tuple[object, Iterator, int]:
    """The first item of ``walk()``, the rest of the walk, and the peak of traced bytes until that first item."""
    tracemalloc.start()
    try:
        it = walk()
        first = next(it)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return first, it, peak
