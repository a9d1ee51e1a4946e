"""Aspect distortion of Qwen3-VL frames: the stock-SGLang 224 grid vs the model's own 32 grid (issue 10).

For each source shape it builds a short h264 clip, runs the real pipeline
(``decode_sample_resize``) with ``VideoOptions(family="qwen3_vl")`` (the 32 grid, qwen-vl-utils'
own) and with ``VideoOptions.for_stock_sglang("qwen3_vl")`` (the 224 grid), and prints a markdown
table.  Distortion is ``aspect_distortion`` = output aspect / source aspect (1.000 = undistorted).

    .venv/bin/python benchmarks/aspect_distortion.py
"""
from __future__ import annotations

import os
import tempfile
import time

from vidcache import VideoOptions
from vidcache.loader.build import decode_sample_resize
from vidcache.loader.resize import aspect_distortion
from vidcache.testing.videos import make_video

# (label, width, height): common aspect ratios, then the three shapes named in issue 10.
SHAPES = [
    ("4:3", 640, 480),
    ("16:9", 1280, 720),
    ("21:9", 2560, 1080),
    ("9:16", 720, 1280),
    ("1:1", 720, 720),
    ("QCIF", 176, 144),
    ("2.35:1", 640, 272),
    ("720p", 1280, 720),
]
# 8 frames at 8 fps: qwen-vl-utils samples min_frames=4 of them.  A short clip gets the full
# per-frame pixel cap (768 tokens), as any clip under ~150 s does by default.
FPS, N_FRAMES = 8, 8


def shape_of(path: str, opts: VideoOptions) -> tuple[int, int]:
    frames, _ = decode_sample_resize(path, opts)
    return frames.shape[3], frames.shape[2]


def cell(src_w: int, src_h: int, w: int, h: int) -> str:
    return f"{w}x{h} ({w / h:.3f}, {aspect_distortion(src_w, src_h, w, h):.3f})"


def main() -> None:
    t0 = time.perf_counter()
    grids = {"224 grid (`for_stock_sglang`)": VideoOptions.for_stock_sglang("qwen3_vl"),
             "32 grid (default)": VideoOptions(family="qwen3_vl")}
    print("| source WxH (aspect) | " + " | ".join(f"{g}: WxH (aspect, distortion)" for g in grids) + " |")
    print("|---|" + "---|" * len(grids))
    with tempfile.TemporaryDirectory(prefix="vc-aspect-") as d:
        made: dict[tuple[int, int], str] = {}
        for label, w, h in SHAPES:
            if (w, h) not in made:     # 1280x720 appears twice (as 16:9 and as the 720p)
                made[w, h] = make_video(os.path.join(d, f"{w}x{h}.mp4"), codec="h264", width=w, height=h,
                                        fps=FPS, n_frames=N_FRAMES, seed=len(made))
            cells = [cell(w, h, *shape_of(made[w, h], o)) for o in grids.values()]
            print(f"| {label} {w}x{h} ({w / h:.3f}) | " + " | ".join(cells) + " |")
    print(f"\n{len(SHAPES)} shapes in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
