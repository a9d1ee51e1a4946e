"""A small demo dataset: synthetic clips of several codecs, sizes and rates, plus a Miles-style JSONL."""
from __future__ import annotations

import json
import os
from fractions import Fraction

from .videos import make_video, suffix_for

_SPECS = [("h264", 320, 240, 30), ("mpeg4", 426, 240, Fraction(30000, 1001)), ("h264", 640, 360, 25),
          ("mjpeg", 256, 192, 24), ("hevc", 352, 288, 30), ("h264", 480, 270, Fraction(24000, 1001))]


def make_demo_dataset(directory: str, n_videos: int = 12, n_rows: int = 24, log=None) -> str:
    """``log``: called with one line per clip as it is written (the CLI prints them: writing 12 clips takes a
    while on a small machine)."""
    os.makedirs(os.path.join(directory, "videos"), exist_ok=True)
    names = []
    for i in range(n_videos):
        if log is not None:
            log(f"demo: clip {i + 1}/{n_videos}")
        codec, w, h, fps = _SPECS[i % len(_SPECS)]
        name = f"videos/clip{i:03d}_{codec}_{w}x{h}{suffix_for(codec)}"
        path = os.path.join(directory, name)
        if not os.path.exists(path):
            make_video(path, codec=codec, width=w, height=h, fps=fps, n_frames=int(fps * (3 + i % 4)), seed=i)
        names.append(name)
    path = os.path.join(directory, "dataset.jsonl")
    with open(path, "w") as f:
        for r in range(n_rows):
            v = names[r % len(names)]
            if r % 3 == 2:   # message-list form with a per-item option
                row = {"prompt": [{"role": "user", "content": [
                    {"type": "video", "video": v, "fps": 1.0}, {"type": "text", "text": "What moves?"}]}],
                    "label": "square"}
            else:
                row = {"prompt": "<video>\nWhat colour is the moving square?", "videos": [v], "label": "red"}
            f.write(json.dumps(row) + "\n")
    return path
