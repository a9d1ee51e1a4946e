"""The one PyAV video writer: frozen files for SGLang and the synthetic test clips both use it."""
from __future__ import annotations

from fractions import Fraction
from typing import Iterable

import numpy as np


def write_video(path: str, frames: Iterable[np.ndarray], *, codec: str, rate: Fraction, pix_fmt: str,
                container: str | None = None, options: dict | None = None, exact_time_base: bool = False) -> None:
    """Encode RGB ``H x W x 3`` uint8 frames to ``path``.

    ``container`` defaults to the one PyAV infers from the suffix.  ``exact_time_base`` stamps frames
    in units of ``1/rate`` (NUT needs it for an exact rate; Matroska's 1 ms base is exact at 2 fps).
    """
    import av

    with av.open(path, "w", format=container) as c:
        s = c.add_stream(codec, rate=rate)
        s.pix_fmt = pix_fmt
        if options:
            s.options = dict(options)
        if exact_time_base:
            s.time_base = 1 / Fraction(rate)
        sized = False
        for fr in frames:
            if not sized:
                s.height, s.width = fr.shape[:2]
                sized = True
            for p in s.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(fr), format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
