"""Where the trainer's tensors are made: on its GPU when HF's processor is shown exact there, else the CPU.

HF's Qwen-VL video processors, given uint8 frames on a CUDA device with resizing and sampling off, run
there; their output is bit-identical to the CPU's only if every step is.  With resizing off the steps are
an elementwise normalise (each output value depends only on one uint8 value and its channel) and
patchify (padding the last frame, views and permutes: pure data movement).  So one probe whose frames
hold all 256 values in every channel, at an odd frame count (temporal padding), run through the
processor on the CPU and on the device and compared with ``torch.equal``, shows the two equal for every
input of this processor config under this torch/transformers.  The config is read from the processor
object, never assumed per family; where the probe differs or fails, the CPU is used, with one log line
saying why.

Frames reach the device from pinned (page-locked) host memory, so the copy is asynchronous and a host
thread can fill the next buffer meanwhile.  ``PINNED`` bounds how much host memory stays pinned.
"""
from __future__ import annotations

import logging
import threading

import torch

from .processing import processor_fingerprint, processor_kwargs, video_processor

logger = logging.getLogger(__name__)

_VERDICTS: dict[tuple[str, str], str | None] = {}     # (processor config, device) -> None, or why not exact
_VERDICTS_LOCK = threading.Lock()


def probe_frames(temporal_patch_size: int, patch_size: int, merge_size: int) -> torch.Tensor:
    """uint8 ``T x 3 x H x W`` frames holding every value 0..255 in every channel of every frame, with an
    odd T (the processor pads it to the temporal patch) and H = W = 2 patch rows of merged patches."""
    t = temporal_patch_size + 1 if temporal_patch_size > 1 else 3
    side = 2 * patch_size * merge_size
    if side * side < 256:
        side = 16 * patch_size * merge_size
    i = torch.arange(side * side, dtype=torch.int64)
    planes = [((i * 97 + 31 * c + 11 * f) % 256).reshape(side, side) for f in range(t) for c in range(3)]
    return torch.stack(planes).reshape(t, 3, side, side).to(torch.uint8)


def _why_not_exact(processor, device: torch.device) -> str | None:
    """None when the processor's device output equals its CPU output on the probe, else the reason."""
    vp = video_processor(processor)
    cfg = {k: getattr(vp, k, None) for k in ("patch_size", "temporal_patch_size", "merge_size")}
    if any(not isinstance(v, int) or v < 1 for v in cfg.values()):
        return f"{type(vp).__name__} has no integer patch_size/temporal_patch_size/merge_size ({cfg})"
    frames = probe_frames(cfg["temporal_patch_size"], cfg["patch_size"], cfg["merge_size"])
    kw = {k: v for k, v in processor_kwargs(processor, [], "stock").items() if k != "video_metadata"}
    try:
        ref = vp(videos=[frames], **kw)
        got = vp(videos=[frames.to(device)], **kw)
        if got["pixel_values_videos"].device.type != device.type:
            return f"{type(vp).__name__} returned its tensors on {got['pixel_values_videos'].device}, not {device}"
        got = {k: got[k].cpu() for k in ("pixel_values_videos", "video_grid_thw")}
    except Exception as e:          # noqa: BLE001  any failure on the device means: not shown exact
        return f"{type(vp).__name__} failed on {device}: {type(e).__name__}: {e}"
    for k, b in got.items():
        a = ref[k]
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            n = int((a != b).sum()) if a.shape == b.shape else -1
            return (f"{type(vp).__name__}'s {k} on {device} differs from the CPU's on the all-values probe "
                    f"({n} elements differ; torch {torch.__version__})")
    return None


def exact_device(processor, device: "str | torch.device | None", fingerprint: str | None = None) -> torch.device:
    """``device`` when this processor is shown exact there (checked once per config and device), else the CPU.
    ``fingerprint``: the processor's ``processor_fingerprint``, when the caller has it already."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type == "cpu":
        return dev
    key = (fingerprint or processor_fingerprint(processor), str(dev))
    with _VERDICTS_LOCK:
        if key not in _VERDICTS:
            why = _why_not_exact(processor, dev)
            _VERDICTS[key] = why
            if why is not None:
                logger.warning("vidcache: train inputs are made on the CPU, not %s: %s", dev, why)
        why = _VERDICTS[key]
    return torch.device("cpu") if why is not None else dev


class PinnedPool:
    """Reusable page-locked host buffers for host-to-device copies, at most ``max_bytes`` pinned.

    A buffer is handed out again only after the copies enqueued from it have finished (a CUDA event),
    so a reader may fill it while the GPU still works on the previous batch.  A request that does not
    fit the bound gets ordinary (pageable) memory: slower to copy, the same bytes.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._free: list[torch.Tensor] = []
        self._busy: list[tuple[torch.Tensor, torch.cuda.Event]] = []
        self._pinned = 0
        self._lock = threading.Lock()

    @property
    def pinned_bytes(self) -> int:
        return self._pinned

    def take(self, nbytes: int) -> torch.Tensor:
        """A 1-D uint8 host buffer of at least ``nbytes`` (pinned when within the bound)."""
        with self._lock:
            busy, self._busy = self._busy, []
            for buf, ev in busy:
                if ev.query():
                    self._free.append(buf)
                else:
                    self._busy.append((buf, ev))
            fits = [i for i, b in enumerate(self._free) if b.numel() >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
            while self._free and self._pinned + nbytes > self.max_bytes:   # make room: drop idle buffers
                self._pinned -= self._free.pop(0).numel()
            if self._pinned + nbytes <= self.max_bytes and torch.cuda.is_available():
                self._pinned += nbytes
                return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, buf: torch.Tensor, stream: "torch.cuda.Stream | None" = None) -> None:
        """Return ``buf`` once the copies already enqueued on ``stream`` (default: current) are done."""
        if not buf.is_pinned():
            return
        ev = torch.cuda.Event()
        ev.record(stream)
        with self._lock:
            self._busy.append((buf, ev))


PINNED = PinnedPool()
