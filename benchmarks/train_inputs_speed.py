"""(c) warm train_inputs() vs decode-and-process from the source file (target >= 50x faster), and
(d) a raw frame read from the cache vs a memcpy of the same bytes (target >= 0.5)."""
from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from _common import best_of, clips, get_handle, report  # noqa: E402
from support.toy_processors import build_processor  # noqa: E402
from vidcache import VideoCache, VideoOptions  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER  # noqa: E402


def main() -> None:
    work = tempfile.mkdtemp(prefix="vc-bench-")
    path = clips(os.path.join(work, "v"), 1, seconds=8.0)[0]
    import qwen_vl_utils.vision_process as qvu
    qvu.get_video_reader_backend = lambda: "decord"
    proc = build_processor("qwen2_5_vl")
    cache = VideoCache(os.path.join(work, "c"))
    h = get_handle(cache, path, VideoOptions(family="qwen2_5_vl"))

    def from_source():
        (video, meta), _ = qvu.fetch_video({"type": "video", "video": path}, image_patch_size=14,
                                           return_video_sample_fps=True, return_video_metadata=True)
        meta = {k: meta[k] for k in ("fps", "frames_indices", "total_num_frames")}
        proc(text=[VIDEO_PLACEHOLDER], videos=[video], video_metadata=[meta], do_sample_frames=False,
             return_tensors="pt")

    ref = h.train_inputs(proc, mode="plugin")
    t_src = best_of(from_source, 5)
    t_cold = best_of(lambda: h.train_inputs(proc, memo=False, mode="plugin"), 5)
    t_warm = best_of(lambda: [h.train_inputs(proc, mode="plugin") for _ in range(100)], 3) / 100
    assert torch.equal(h.train_inputs(proc, mode="plugin")["pixel_values_videos"], ref["pixel_values_videos"])

    n = int(np.prod(h.manifest.frames.shape))
    src = np.frombuffer(os.urandom(n), dtype=np.uint8)
    dst = np.empty_like(src)
    key = h.resolve()
    buf = torch.empty(h.manifest.frames.shape, dtype=torch.uint8)
    t_read = best_of(lambda: [h.frames() for _ in range(20)], 5) / 20              # new tensor each time
    t_copy = best_of(lambda: [src.copy() for _ in range(20)], 5) / 20               # new array each time
    t_read_into = best_of(lambda: [cache.frames(key, out=buf) for _ in range(20)], 5) / 20
    t_copy_into = best_of(lambda: [np.copyto(dst, src) for _ in range(20)], 5) / 20

    def view_sum():
        with cache.read_frames(key) as v:
            return v.shape
    t_view = best_of(lambda: [view_sum() for _ in range(20)], 5) / 20
    report(f"train_inputs and reads (Qwen2.5-VL, {tuple(h.frames().shape)} uint8 = {n / 1e6:.1f} MB)", [
        ("decode + sample + resize + process from source", f"{t_src * 1e3:.1f} ms"),
        ("train_inputs(), cache read + processor (memo off)", f"{t_cold * 1e3:.1f} ms  ({t_src / t_cold:.1f}x faster)"),
        ("train_inputs(), warm (in-process memo)", f"{t_warm * 1e6:.1f} us"),
        ("(c) warm train_inputs vs from source  [target >= 50]", f"{t_src / t_warm:.0f}x"),
        ("frames(): read into a new tensor", f"{t_read * 1e3:.2f} ms  ({n / t_read / 1e9:.2f} GB/s)"),
        ("memcpy into a new array (ndarray.copy)", f"{t_copy * 1e3:.2f} ms  ({n / t_copy / 1e9:.2f} GB/s)"),
        ("(d) read / memcpy, new buffers       [target >= 0.5]", f"{t_copy / t_read:.2f}"),
        ("frames(out=buf): read into a reused tensor", f"{t_read_into * 1e3:.2f} ms  ({n / t_read_into / 1e9:.2f} GB/s)"),
        ("memcpy into a reused array (np.copyto)", f"{t_copy_into * 1e3:.2f} ms"),
        ("(d') read / memcpy, reused buffers   [target >= 0.5]", f"{t_copy_into / t_read_into:.2f}"),
        ("read_frames(): zero-copy view (no bytes moved)", f"{t_view * 1e6:.1f} us"),
    ])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
