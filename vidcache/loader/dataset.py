"""Lazy datasets over Miles-format JSONL: rows hold handles, never frames.

Row formats (Miles conventions, ``--input-key`` / ``--multimodal-keys``):
  {"prompt": "Describe <video>.", "videos": ["a.mp4"], "label": ...}
  {"prompt": [{"role": "user", "content": [{"type": "video", "video": "a.mp4", "fps": 1.0},
                                          {"type": "text", "text": "Describe."}]}]}
Per-item keys such as ``fps`` or ``max_pixels`` override the base options for that video.
Relative paths are resolved against the JSONL file's directory.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from ..options import VideoOptions
from .fetch import scheme_of
from .handle import VideoHandle

VIDEO_TOKEN = "<video>"


@dataclass
class Row:
    index: int
    prompt: Any                     # the prompt string or message list, as in the file
    handles: list[VideoHandle]
    data: dict = field(repr=False)  # the whole JSON row

    @property
    def num_video_tokens(self) -> int:
        """``<|video_pad|>`` tokens of all videos, from the manifests: no decoding."""
        return sum(h.num_video_tokens for h in self.handles)


def _resolve(source: str, base_dir: str | None) -> str:
    if base_dir and scheme_of(source) == "file" and not source.startswith("file:") and not os.path.isabs(source):
        return os.path.normpath(os.path.join(base_dir, source))
    return source


def video_items(row: dict, options: VideoOptions, *, input_key: str = "prompt", video_key: str = "videos",
                base_dir: str | None = None) -> list[tuple[str, VideoOptions]]:
    """(source, options) for each video of a row, in prompt order."""
    prompt = row.get(input_key)
    out: list[tuple[str, VideoOptions]] = []
    if isinstance(prompt, list):  # message list with per-item options
        for msg in prompt:
            content = msg.get("content") if isinstance(msg, dict) else None
            for item in content if isinstance(content, list) else []:
                if isinstance(item, dict) and item.get("type") == "video":
                    src = item.get("video")
                    if not isinstance(src, str):
                        raise ValueError(f"video item must name a source string, got {type(src).__name__}")
                    out.append((_resolve(src, base_dir), options.with_content_item(item)))
    videos = row.get(video_key) or []
    if isinstance(videos, str):
        videos = [videos]
    for v in videos:
        if isinstance(v, dict):
            out.append((_resolve(v["video"], base_dir), options.with_content_item(v)))
        else:
            out.append((_resolve(v, base_dir), options))
    if isinstance(prompt, str) and prompt.count(VIDEO_TOKEN) not in (0, len(videos)):
        raise ValueError(f"prompt has {prompt.count(VIDEO_TOKEN)} {VIDEO_TOKEN} placeholders but {len(videos)} videos")
    return out


def iter_jsonl(path: str) -> Iterator[tuple[int, dict]]:
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if line.strip():
                yield i, json.loads(line)


class LazyVideoDataset(Sequence[Row]):
    """A map-style dataset over a JSONL file that keeps only line offsets in memory.

    Opening a file reads it once to find line starts; nothing is fetched or decoded.
    """

    def __init__(self, path: str, cache: str, options: VideoOptions, *, input_key: str = "prompt",
                 video_key: str = "videos") -> None:
        import numpy as np

        self.path = os.path.abspath(path)
        self.cache = str(cache)
        self.options = options
        self.input_key, self.video_key = input_key, video_key
        self._base_dir = os.path.dirname(self.path)
        offsets = []
        pos = 0
        with open(self.path, "rb") as f:
            for line in f:
                if line.strip():
                    offsets.append(pos)
                pos += len(line)
        self._offsets = np.asarray(offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._offsets)

    def raw(self, i: int) -> dict:
        with open(self.path, "rb") as f:
            f.seek(int(self._offsets[i]))
            return json.loads(f.readline())

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range for {len(self)} rows")
        row = self.raw(i)
        items = video_items(row, self.options, input_key=self.input_key, video_key=self.video_key,
                            base_dir=self._base_dir)
        return Row(i, row.get(self.input_key), [VideoHandle(s, o, self.cache) for s, o in items], row)
