"""Lazy datasets over Miles-format JSONL: rows hold handles, never frames.

Row formats (Miles conventions, ``--input-key`` / ``--multimodal-keys``):
  {"prompt": "Describe <video>.", "videos": ["a.mp4"], "label": ...}
  {"prompt": [{"role": "user", "content": [{"type": "video", "video": "a.mp4", "fps": 1.0},
                                          {"type": "text", "text": "Describe."}]}]}
Per-item keys such as ``fps`` or ``max_pixels`` override the base options for that video.
Relative paths are resolved against the JSONL file's directory.

Every malformed row (not UTF-8, not JSON, not an object, a video that is not a
source string) is a ``BadRowError`` of its own, so one bad line never costs the others.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from .errors import BadRowError, OptionsError
from .handle import VideoHandle, lazy
from .loader.fetch import scheme_of
from .options import CONTENT_ITEM_KEYS, VideoOptions

if TYPE_CHECKING:
    from .cache import VideoCache

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
    if base_dir and scheme_of(source) == "file" and source[:5].lower() != "file:" and not os.path.isabs(source):
        return os.path.normpath(os.path.join(base_dir, source))
    return source


def _source(v: object, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise BadRowError(f"{where} must name a source string, got {type(v).__name__} {str(v)[:60]!r}")
    return v


# What a video item may hold: its source, its type, and the options qwen-vl-utils reads per video.
# Anything else is refused rather than ignored: a misspelt ``max_pixel`` or an option qwen-vl-utils
# does not take per video (``size_factor``) would otherwise build other bytes than the row asks for.
ITEM_KEYS = frozenset({"type", "video", *CONTENT_ITEM_KEYS})


def _with_item(options: VideoOptions, item: dict, where: str) -> VideoOptions:
    unknown = [k for k in item if k not in ITEM_KEYS]
    if unknown:
        shown = ", ".join(repr(k[:40]) for k in sorted(unknown)[:5])
        raise BadRowError(f"{where}: unknown per-video key(s) {shown}; known: {sorted(ITEM_KEYS)}")
    try:
        return options.with_content_item(item)
    except (OptionsError, TypeError) as e:
        raise BadRowError(f"{where}: bad per-video options: {e}") from None


def video_items(row: dict, options: VideoOptions, *, input_key: str = "prompt", video_key: str = "videos",
                base_dir: str | None = None) -> list[tuple[str, VideoOptions]]:
    """(source, options) for each video of a row, in prompt order.  ``BadRowError`` for a malformed row."""
    if not isinstance(row, dict):
        raise BadRowError(f"a row must be a JSON object, got {type(row).__name__}")
    prompt = row.get(input_key)
    out: list[tuple[str, VideoOptions]] = []
    if isinstance(prompt, list):  # message list with per-item options
        for msg in prompt:
            content = msg.get("content") if isinstance(msg, dict) else None
            for item in content if isinstance(content, list) else []:
                if isinstance(item, dict) and item.get("type") == "video":
                    src = _source(item.get("video"), "a video item")
                    out.append((_resolve(src, base_dir), _with_item(options, item, "a video item")))
    videos = row.get(video_key)
    if videos is None:
        videos = []
    elif isinstance(videos, str):
        videos = [videos]
    if not isinstance(videos, list):     # also {} and false: never read as "no videos"
        raise BadRowError(f"{video_key!r} must be a list of sources, got {type(videos).__name__}")
    for v in videos:
        if isinstance(v, dict):
            out.append((_resolve(_source(v.get("video"), f"a {video_key!r} entry"), base_dir),
                        _with_item(options, v, f"a {video_key!r} entry")))
        else:
            out.append((_resolve(_source(v, f"a {video_key!r} entry"), base_dir), options))
    if isinstance(prompt, str) and prompt.count(VIDEO_TOKEN) not in (0, len(videos)):
        raise BadRowError(f"prompt has {prompt.count(VIDEO_TOKEN)} {VIDEO_TOKEN} placeholders but "
                          f"{len(videos)} videos")
    return out


def parse_row(line: bytes) -> dict:
    """One JSONL line as a row object, or ``BadRowError`` saying what is wrong with it."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadRowError(f"line is not UTF-8 ({e.reason} at byte {e.start})") from None
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        raise BadRowError(f"line is not JSON ({e.msg} at column {e.colno})") from None
    except ValueError as e:     # Python's own cap: an integer of more than 4300 digits
        raise BadRowError(f"line holds a number vidcache does not read ({str(e)[:80]})") from None
    except RecursionError:
        raise BadRowError("line nests too deeply") from None
    if not isinstance(row, dict):
        raise BadRowError(f"a row must be a JSON object, got {type(row).__name__}")
    return row


def iter_jsonl(path: str) -> Iterator[tuple[int, dict | BadRowError]]:
    """(line number, row or the row's ``BadRowError``) for every non-blank line."""
    with open(path, "rb") as f:
        for i, line in enumerate(f):
            if line.strip():
                try:
                    yield i, parse_row(line)
                except BadRowError as e:
                    yield i, e


class LazyVideoDataset(Sequence[Row]):
    """A map-style dataset over a JSONL file that keeps only line offsets in memory.

    Opening a file reads it once to find line starts; nothing is fetched or decoded.
    ``cache`` is a ``VideoCache`` (handles are bound to it), or the identity of one
    (``cache.identity``), resolved in each process that reads a row.
    """

    def __init__(self, path: str, cache: "VideoCache | str", options: VideoOptions, *, input_key: str = "prompt",
                 video_key: str = "videos") -> None:
        import numpy as np

        self.path = os.path.abspath(path)
        self.cache = cache
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
            return parse_row(f.readline())

    def _handle(self, source: str, options: VideoOptions) -> VideoHandle:
        if isinstance(self.cache, str):
            return VideoHandle(source, options, self.cache)
        return lazy(source, options, self.cache)

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
        return Row(i, row.get(self.input_key), [self._handle(s, o) for s, o in items], row)
