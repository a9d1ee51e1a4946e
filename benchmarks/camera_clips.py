"""Camera-like H.264 clips for the GPU benchmarks: 720p and 1080p, 30 fps, 10 s, a scene that pans and zooms
over a textured image with mild sensor noise (no real footage is available offline, so these stand in
for it: the decoder pays what it pays for real 720p/1080p H.264 at these bit rates).

    python benchmarks/camera_clips.py OUT_DIR      # writes the clips, prints their sizes
"""
from __future__ import annotations

import os
import sys
from fractions import Fraction

import numpy as np

# (width, height, x264 crf): a low and a broadcast-like bit rate at each size (the sizes are printed).
SHAPES = [(1280, 720, 26), (1920, 1080, 26), (1280, 720, 18), (1920, 1080, 18)]


def scene(width: int, height: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    big_h, big_w = int(height * 1.5), int(width * 1.5)
    y, x = np.mgrid[0:big_h, 0:big_w].astype(np.float32)
    base = np.stack([
        128 + 90 * np.sin(x / (37 + 11 * seed)) * np.cos(y / 53),
        128 + 80 * np.sin((x + y) / 71 + seed),
        128 + 70 * np.cos(x / 23) * np.sin(y / (29 + seed))], -1)
    for _ in range(40):                        # objects: coloured discs
        cx, cy, r = rng.integers(0, big_w), rng.integers(0, big_h), rng.integers(10, 120)
        m = (x - cx) ** 2 + (y - cy) ** 2 < r * r
        base[m] = rng.integers(0, 256, 3)
    for t in range(n):                          # a slow pan
        ox = int((big_w - width) * (0.5 + 0.5 * np.sin(t / 90)))
        oy = int((big_h - height) * (0.5 + 0.5 * np.cos(t / 120)))
        fr = base[oy:oy + height, ox:ox + width] + rng.normal(0, 2.0, (height, width, 3))
        yield np.clip(fr, 0, 255).astype(np.uint8)


def make(out_dir: str, seconds: float = 10.0, fps: int = 30) -> list[str]:
    from vidcache.encode import write_video
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for i, (w, h, crf) in enumerate(SHAPES):
        p = os.path.join(out_dir, f"cam{i}_{w}x{h}_crf{crf}.mp4")
        if not os.path.exists(p):
            write_video(p, scene(w, h, int(seconds * fps), i), codec="libx264", rate=Fraction(fps),
                        pix_fmt="yuv420p", options={"preset": "veryfast", "crf": str(crf)})
        paths.append(p)
    return paths


if __name__ == "__main__":
    for p in make(sys.argv[1]):
        print(f"{p}: {os.path.getsize(p) / 1e6:.1f} MB")
