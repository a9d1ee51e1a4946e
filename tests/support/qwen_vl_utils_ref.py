"""qwen-vl-utils itself as the reference the frames are held to (tests/loader/test_pipeline_exact.py, the codec
matrix, Qwen3-VL's defaults)."""
from __future__ import annotations

import qwen_vl_utils.vision_process as qvu
import torch


def reference(path, patch, grid=None, **kw):
    """qwen-vl-utils itself, with the decord backend forced (its backend choice is otherwise environmental).

    ``grid`` swaps only the factor its smart_resize rounds to (pixel bounds still follow ``patch``): the
    reference for an explicit ``size_factor`` such as stock SGLang's 224, which qwen-vl-utils has no option for.
    """
    saved = qvu.get_video_reader_backend, qvu.smart_resize
    qvu.get_video_reader_backend = lambda: "decord"
    if grid is not None:
        qvu.smart_resize = lambda h, w, factor, **b: saved[1](h, w, factor=grid, **b)
    try:
        (video, meta), sample_fps = qvu.fetch_video({"type": "video", "video": path, **kw}, image_patch_size=patch,
                                                   return_video_sample_fps=True, return_video_metadata=True)
    finally:
        qvu.get_video_reader_backend, qvu.smart_resize = saved
    u8 = video.to(torch.uint8)
    assert torch.equal(u8.float(), video), "qwen-vl-utils output is not integer-valued"
    return u8, meta, sample_fps
