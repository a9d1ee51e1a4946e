"""Inputs ahead: the next micro-batches' model tensors made while the trainer runs its step (issue 50).

Read-ahead brings the entries local, but hydrating a batch (its frames out of LMDB into pinned memory, the copy to
the device, HF's processor there) was still on the trainer's critical path, between one step and the next: on an
H100, 10-12% of a 90-100 ms step's wall time with every entry already local.  A GPU step leaves the host idle
while the device works, so the next batch's hydration can run then, in a thread::

    with vidcache.train_inputs_ahead(processor, micro_batches, device="cuda") as inputs:
        for batch in inputs:            # train_inputs_batch(processor, micro_batch, device="cuda"), in order
            step(batch)

``micro_batches`` holds what :func:`vidcache.train_inputs_batch` takes (per micro-batch, one list of handles per
sample); each item is exactly its result (the same call, on another thread).  A thread, not a process: the
tensors are born on the device, and the parts that take long (the copies, the processor's kernels, waiting for
the device) let go of the GIL.

What stays true:
  * bounded: at most ``ahead`` micro-batches made (or being made) and not yet taken, so the device holds at most
    ``ahead`` batches more than a loop without this;
  * in order; a batch whose hydration fails raises its own error when it is taken, and the next ones still come
    (as a loop that catches it would go on); an error of ``micro_batches`` itself ends the iteration there;
  * on the CUDA device and stream that were current where this was built (both are per thread in torch: a
    trainer's ``torch.cuda.set_device(local_rank)`` does not reach a new thread), so the consumer's kernels
    follow the producer's on one stream, with no event to wait for;
  * ``close`` (or the end of the ``with`` block) stops the thread after the batch under way.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterable

AHEAD = 1          # one batch made while the step runs: enough when hydration is shorter than a step
_END = object()


class InputsAhead:
    """An iterator of ``train_inputs_batch`` results, made by one thread (``train_inputs_ahead``)."""

    def __init__(self, processor, micro_batches: Iterable, *, ahead: int = AHEAD, **kwargs) -> None:
        from .handle import train_inputs_batch
        if ahead < 1:
            raise ValueError(f"ahead must be at least 1, not {ahead}")
        self._make = lambda groups: train_inputs_batch(processor, groups, **kwargs)
        self._batches = iter(micro_batches)
        self._room = threading.Semaphore(ahead)     # a batch is made only with room for it
        self._ready: list = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._where = _device_context(kwargs.get("device"))
        self._thread = threading.Thread(target=self._run, name="vidcache-inputs-ahead", daemon=True)
        self._thread.start()

    def __iter__(self) -> "InputsAhead":
        return self

    def __next__(self) -> list:
        with self._cond:
            self._cond.wait_for(lambda: self._ready)
            item, error = self._ready[0]
            if item is _END:
                self._ready[0] = (_END, None)      # an iterator's error is raised once; then it is over
            else:
                self._ready.pop(0)
        if item is _END:
            if error is not None:
                raise error
            raise StopIteration
        self._room.release()
        if error is not None:
            raise error
        return item

    def _run(self) -> None:
        with self._where():
            while True:
                self._room.acquire()
                if self._stop.is_set():
                    return
                try:
                    groups = next(self._batches)
                except StopIteration:
                    return self._put(_END, None)
                except BaseException as e:          # the micro-batches' own iterator failed: the end, with why
                    return self._put(_END, e)
                try:
                    self._put(self._make(groups), None)
                except BaseException as e:          # this batch's error, raised when it is taken
                    self._put(None, e)

    def _put(self, item, error) -> None:
        with self._cond:
            self._ready.append((item, error))
            self._cond.notify_all()

    def close(self) -> None:
        self._stop.set()
        self._room.release()                        # wakes a thread waiting for room
        self._thread.join()
        with self._cond:
            self._ready = [(_END, None)]
            self._cond.notify_all()

    def __enter__(self) -> "InputsAhead":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _device_context(target):
    """A context manager factory that makes the building thread's CUDA device and stream current in another
    (a no-op unless ``target`` is a CUDA device)."""
    import torch
    if target is None or torch.device(target).type != "cuda":
        return contextlib.nullcontext
    device = torch.device(target).index
    device = torch.cuda.current_device() if device is None else device
    stream = torch.cuda.current_stream(device)

    @contextlib.contextmanager
    def where():
        torch.cuda.set_device(device)
        with torch.cuda.stream(stream):
            yield
    return where


def train_inputs_ahead(processor, micro_batches: Iterable, *, ahead: int = AHEAD, **kwargs) -> InputsAhead:
    """:func:`vidcache.train_inputs_batch` of each micro-batch, made in a thread up to ``ahead`` batches before it
    is taken (``kwargs``: ``train_inputs_batch``'s).  Close it, or use it as a context manager."""
    return InputsAhead(processor, micro_batches, ahead=ahead, **kwargs)
