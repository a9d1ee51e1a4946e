"""Shared benchmark helpers: synthetic clips and best-of timing."""
from __future__ import annotations

import os
import time
from fractions import Fraction

from vidcache.testing.videos import make_video

SPECS = [("h264", 320, 240, 30), ("h264", 426, 240, Fraction(30000, 1001)), ("mpeg4", 352, 288, 25),
         ("h264", 480, 270, 24)]


def _clip(directory: str, i: int, seconds: float) -> str:
    codec, w, h, fps = SPECS[i % len(SPECS)]
    p = os.path.join(directory, f"clip{i:03d}_{codec}_{w}x{h}.mp4")
    if not os.path.exists(p):
        make_video(p, codec=codec, width=w, height=h, fps=fps, n_frames=int(float(fps) * seconds), seed=i)
    return p


def clips(directory: str, n: int, seconds: float = 4.0) -> list[str]:
    """``n`` generated clips in ``directory`` (kept: a later run reuses them), made on every core (124 of them
    take two minutes on one: device time on a GPU machine)."""
    from concurrent.futures import ProcessPoolExecutor
    from functools import partial
    os.makedirs(directory, exist_ok=True)
    if n <= 1 or (os.cpu_count() or 1) == 1:
        return [_clip(directory, i, seconds) for i in range(n)]
    with ProcessPoolExecutor(min(n, os.cpu_count() or 1)) as pool:
        return list(pool.map(partial(_clip, directory, seconds=seconds), range(n)))


def get_handle(cache, source: str, options):
    """A pinned handle to (source, options) in ``cache``, built on a miss (``vidcache.get``)."""
    import vidcache
    return vidcache.get(source, options, cache)


def best_of(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def report(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"\n## {title}")
    for k, v in rows:
        print(f"  {k:<52} {v}")
