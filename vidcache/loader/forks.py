"""What a fork needs from a process that may have scaled frames with PyAV: no scaler of another thread.

PyAV 18 keeps one ``VideoReformatter`` per thread (``av.video.frame._thread_local``, PyAV#2379), and since PyAV 17
a scaler runs its own slice threads by default (``threads=0``, PyAV#2187).  A forked child has only the thread that
forked: when it frees another thread's scaler (Python clears the other threads' states after a fork) or reuses its
own thread's, FFmpeg joins slice threads that are not in the child, and the child hangs for good.  Measured here
(PyAV 18.1.1): one ``to_ndarray(format="rgb24")`` in the main thread, then any fork from another thread (pebble's
pool of ``prewarm --workers``, a Ray task's child) left the child hung in ``avpriv_slicethread_free``.

So before every fork the parent drops PyAV's per-thread scalers: it replaces that ``threading.local`` with a new one,
and each thread's scaler is freed in the parent, where its slice threads are (a thread using its scaler right now
holds it until its call returns).  PyAV builds a new one on the next reformat; the frames are the same (the
scaler is a cache of settings, not of pixels).  A PyAV without that attribute is left alone.
"""
from __future__ import annotations

import os
import sys
import threading

_registered = False


def drop_pyav_scalers() -> None:
    frame = sys.modules.get("av.video.frame")        # PyAV not imported: nothing to drop
    if frame is not None and isinstance(getattr(frame, "_thread_local", None), threading.local):
        frame._thread_local = threading.local()


def register() -> None:
    """Drop PyAV's per-thread scalers before every fork of this process (once per process; forks inherit it)."""
    global _registered
    if not _registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=drop_pyav_scalers)
        _registered = True
