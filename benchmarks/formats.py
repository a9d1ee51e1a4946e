"""Measurements behind two format choices:
  1. the frozen file container (FFV1 bgr0 in MKV vs NUT vs AVI): size, write time, exact re-decode and
     the fps each decoder reports, at the 2 fps stamp SGLang's sampler is configured with;
  2. the LMDB value encoding (raw uint8 vs zlib-1): size and read time."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
import zlib

import numpy as np
import torch

from _common import best_of, clips, get_handle, report
from vidcache import VideoCache, VideoOptions
from vidcache.sglang.frozen import FORMATS, FrozenFormat, available_decoders, decode_all, write_frozen


def main() -> None:
    work = tempfile.mkdtemp(prefix="vc-bench-")
    path = clips(os.path.join(work, "v"), 4, seconds=10.0)[3]          # 24 fps, 480x270 -> 280x476
    cache = VideoCache(os.path.join(work, "c"))
    h = get_handle(cache, path, VideoOptions(family="qwen2_5_vl"))
    frames = h.frames()
    raw = frames.numel()
    rows = []
    # The two shipped formats, plus FFV1 in the other containers the notes disagree about.
    FORMATS["ffv1-nut"] = FrozenFormat("ffv1-nut", "nut", ".nut", "ffv1", "bgr0", "video/x-nut")
    FORMATS["ffv1-avi"] = FrozenFormat("ffv1-avi", "avi", ".avi", "ffv1", "bgr0", "video/x-msvideo")
    for name in ("ffv1", "ffv1-nut", "ffv1-avi", "magicyuv"):
        f = FORMATS[name]
        p = os.path.join(work, name + f.suffix)
        t = time.perf_counter()
        write_frozen(frames, p, name)
        tw = (time.perf_counter() - t) / len(frames)
        res = []
        for dec in available_decoders():
            t = time.perf_counter()
            got, fps = decode_all(p, dec)
            td = (time.perf_counter() - t) / len(frames)
            res.append(f"{dec}={'EXACT' if torch.equal(got, frames) else 'DIFF'}/{fps:g}fps/{td * 1e3:.1f}ms")
        rows.append((f"{f.codec} {f.pix_fmt} / {f.container}: {os.path.getsize(p) / raw:.2f}x raw, "
                     f"write {tw * 1e3:.1f} ms/f",
                     "  ".join(res)))
    report(f"frozen file containers ({tuple(frames.shape)} frames; per-frame times)", rows)

    key = h.resolve()
    blob = frames.numpy().tobytes()
    z = zlib.compress(blob, 1)
    zc = VideoCache(os.path.join(work, "z"), encoding="zlib")
    zkey = get_handle(zc, path, VideoOptions(family="qwen2_5_vl")).resolve()
    t_raw = best_of(lambda: cache.frames(key), 10)
    t_z = best_of(lambda: zc.frames(zkey), 10)
    report("LMDB value encoding", [
        ("raw uint8", f"1.00x size, read {t_raw * 1e3:.2f} ms"),
        ("zlib level 1", f"{len(z) / len(blob):.2f}x size, read {t_z * 1e3:.2f} ms ({t_z / t_raw:.0f}x slower)"),
    ])
    assert np.array_equal(zc.frames(zkey).numpy(), cache.frames(key).numpy())
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
