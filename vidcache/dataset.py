"""Lazy datasets over Miles-format prompt files: rows hold handles, never frames.

Files (as Miles' ``--prompt-data`` reads them, ``miles.utils.data.read_file``): JSONL, ``.parquet``, and from
Python a Hugging Face ``datasets.Dataset`` (or a ``save_to_disk`` / ``load_dataset`` directory).

Row formats (Miles conventions, ``--input-key`` / ``--multimodal-keys``):
  {"prompt": "Describe <video>.", "videos": ["a.mp4"], "label": ...}
  {"prompt": "<image> then <video>: what changed?", "images": ["a.png"], "videos": ["b.mp4"]}
  {"prompt": [{"role": "user", "content": [{"type": "video", "video": "a.mp4", "fps": 1.0},
                                          {"type": "image", "image": "a.png"},
                                          {"type": "text", "text": "Describe."}]}]}
Per-item keys such as ``fps`` or ``max_pixels`` override the base options for that video.
A video or image may be a path or URL (relative paths are resolved against the file's directory), raw bytes
(a parquet ``binary`` column), or Hugging Face's ``{"bytes": ..., "path": ...}`` storage form.  Bytes are
hashed in memory and never written beside the dataset: a build streams them through the ordinary fetch path
(a ``data:`` URI into the cache's own temp directory, removed after the build).

Videos become handles.  Images are not cached: they are handed to Miles' own image path as Miles would get
them (see docs/miles.md, "Images"); a row may hold images, videos, both, or neither.

Every malformed row (not UTF-8, not JSON, not an object, a video that is not a source) is a ``BadRowError``
of its own, so one bad line never costs the others.  A key that names no column of a parquet file or HF
dataset is an ``UnknownColumnError`` that lists the columns found.
"""
from __future__ import annotations

import base64
import functools
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .digest import Digest
from .errors import BadRowError, OptionsError, OutsideMediaRootError
from .handle import VideoHandle, lazy
from .keys import cache_key
from .loader.fetch import scheme_of
from .options import CONTENT_ITEM_KEYS, INPUT_KEY, VIDEO_KEY, VideoOptions
from .prompt_files import check_columns, open_rows

if TYPE_CHECKING:
    from .cache import VideoCache
    from .readahead import ReadAhead

VIDEO_TOKEN = "<video>"
IMAGE_TOKEN = "<image>"


@dataclass(frozen=True, eq=False)
class InlineBytes:
    """A video held as bytes in the dataset itself (a parquet ``binary`` column, HF's ``{"bytes": ...}``).

    Identified by its content digest (xxh3-128, what ``fetch`` computes for the same bytes), so the same clip
    as bytes or as a file is one entry.  ``data_uri`` is how a build reads it: fsspec's ``data:`` filesystem
    streams it through the ordinary fetch-and-hash path into the cache's temp directory (removed after the
    build); nothing is written beside the dataset."""
    data: bytes = field(repr=False)

    @functools.cached_property
    def digest(self) -> Digest:
        return Digest.of(self.data)

    def data_uri(self) -> str:
        return "data:application/octet-stream;base64," + base64.b64encode(self.data).decode("ascii")

    def key(self, options: VideoOptions) -> str:
        return cache_key(self.digest, options)

    def __eq__(self, other) -> bool:
        return isinstance(other, InlineBytes) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)

    def __str__(self) -> str:       # what failure reports and logs show: never the bytes
        return f"<{len(self.data)} inline bytes, {self.digest}>"


@dataclass
class Row:
    index: int
    prompt: Any                     # the prompt string or message list, as in the file
    handles: list[VideoHandle]
    data: dict = field(repr=False)  # the whole row
    images: list = field(default_factory=list)   # image sources for Miles' image path (paths, URLs, data: URIs)
    inline: dict = field(default_factory=dict, repr=False)   # key -> InlineBytes, for videos held as bytes

    @property
    def num_video_tokens(self) -> int:
        """``<|video_pad|>`` tokens of all videos, from the manifests: no decoding."""
        return sum(h.num_video_tokens for h in self.handles)


def check_media_roots(roots) -> tuple[str, ...] | None:
    """``--media-root`` / ``media_roots=``, as absolute paths; ``ConfigError`` for one that is not a directory
    (a typo would otherwise refuse every row, one by one)."""
    if roots is None:
        return None
    if isinstance(roots, (str, os.PathLike)):
        roots = [roots]
    out = []
    for r in roots:
        if not os.path.isdir(r):
            from .errors import ConfigError
            raise ConfigError(f"--media-root {os.fspath(r)!r} is not a directory (media_roots= takes the "
                              "directories a dataset's local images and videos may be read from)")
        out.append(os.path.abspath(os.fspath(r)))
    return tuple(out) or None


@functools.lru_cache(maxsize=64)      # the roots, resolved once per set rather than once per row
def _real_dirs(dirs: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(os.path.realpath(d) for d in dirs)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _resolve(source: str, base_dir: str | None, where: str = "a source", media_roots: Sequence[str] | None = None
             ) -> str:
    """A row's source as it is read: a relative local path joined to the dataset's directory; anything else as
    given.  The source rule (D54), one for images and videos: a local source must not lead outside the
    directories the dataset may read.  Without ``media_roots`` that is the dataset's directory, for relative paths
    only, and by name (``..`` resolved, symlinks not followed: the row's text is what may come from elsewhere, while a
    link in the directory is its owner's choice, as Hugging Face's hub cache links ``snapshots/`` into ``blobs/``);
    an absolute path or a ``file://`` URL is the dataset author's explicit choice.  With ``media_roots`` every local
    source must lie inside one of them, links followed.  Remote sources are left to the fetch allowlist.
    ``OutsideMediaRootError`` (a ``BadRowError``: it costs this row only) otherwise."""
    if not isinstance(source, str) or scheme_of(source) != "file":
        return source
    uri = source[:5].lower() == "file:"
    relative = not uri and not os.path.isabs(source)
    resolved = os.path.normpath(os.path.join(base_dir, source)) if relative and base_dir else source
    if media_roots:
        allowed = tuple(media_roots)
    elif relative:
        allowed = (base_dir or os.getcwd(),)
    else:
        return resolved
    if uri:
        from .errors import InvalidSourceError
        from .loader.fetch import _local_path
        try:
            path = _local_path("file:" + source[5:])
        except InvalidSourceError:
            return source                      # fetch refuses it with its own error
    else:
        path = resolved
    try:
        # with roots: where the file really is; without: where the row's text leads (links are the owner's)
        real = os.path.realpath(os.path.abspath(path)) if media_roots else os.path.abspath(path)
        roots = _real_dirs(allowed) if media_roots else tuple(os.path.abspath(d) for d in allowed)
    except ValueError:                         # a NUL or a lone surrogate: fetch refuses it with its own error
        return resolved
    if any(_inside(real, root) for root in roots):
        return resolved
    shown = source if len(source) <= 200 else source[:200] + "..."
    if media_roots:
        raise OutsideMediaRootError(
            f"{where} {shown!r} resolves to {real}, outside every --media-root ({', '.join(allowed)}); add the "
            f"directory that holds it: --media-root DIR (Miles: --vidcache-media-root; Python: media_roots=[DIR])")
    raise OutsideMediaRootError(
        f"{where} {shown!r} resolves to {real}, outside the dataset's directory {allowed[0]}; a dataset's relative "
        "paths are read only under its directory: to read media elsewhere, pass --media-root DIR for each "
        "directory it may read (Miles: --vidcache-media-root; Python: media_roots=[DIR])")


def _hf_storage(v: object) -> bool:
    """HF ``datasets``' ``Image`` / ``Video`` storage form (``decode=False``): ``{"bytes": ..., "path": ...}``."""
    return isinstance(v, dict) and bool(v) and set(v) <= {"bytes", "path"}


def _bytes_or_path(v: dict):
    return v["bytes"] if v.get("bytes") is not None else v.get("path")


def _video(v: object, where: str, base_dir: str | None, media_roots=None) -> "str | InlineBytes":
    if _hf_storage(v):
        v = _bytes_or_path(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        if not len(v):
            raise BadRowError(f"{where} holds 0 bytes")
        return InlineBytes(bytes(v))
    if not isinstance(v, str) or not v:
        raise BadRowError(f"{where} must name a source string or hold bytes, got {type(v).__name__} {str(v)[:60]!r}")
    return _resolve(v, base_dir, where, media_roots)


def image_source(v: object, where: str, base_dir: str | None = None, media_roots=None) -> str:
    """An image value as qwen-vl-utils' ``fetch_image`` (Miles' image path) reads it: a path (relative ones
    resolved against the dataset's directory), a URL, or a ``data:image...;base64,`` URI for bytes, which
    ``fetch_image`` decodes exactly as it decodes any base64 image (``Image.open`` on the bytes).  Local paths
    follow the one source rule of videos (``_resolve``)."""
    if _hf_storage(v):
        v = _bytes_or_path(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        if not len(v):
            raise BadRowError(f"{where} holds 0 bytes")
        return "data:image;base64," + base64.b64encode(bytes(v)).decode("ascii")
    if not isinstance(v, str) or not v:
        raise BadRowError(f"{where} must name an image source or hold bytes, got {type(v).__name__} "
                          f"{str(v)[:60]!r}")
    return _resolve(v, base_dir, where, media_roots)


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


def _is_image_item(item: object) -> bool:
    # qwen-vl-utils' extract_vision_info: what Miles' process_vision_info treats as an image
    return isinstance(item, dict) and item.get("type") != "video" and (
        "image" in item or "image_url" in item or item.get("type") in ("image", "image_url"))


def _as_list(v: object, key: str, what: str) -> list:
    if v is None:
        return []
    if isinstance(v, (str, bytes, bytearray, memoryview)) or _hf_storage(v):
        return [v]
    if isinstance(v, tuple):
        return list(v)
    if not isinstance(v, list):     # also {} and false: never read as "no media"
        raise BadRowError(f"{key!r} must be a list of {what}, got {type(v).__name__}")
    return v


@dataclass
class Media:
    """The media of one row, in prompt order per kind."""
    videos: list        # (source or InlineBytes, VideoOptions)
    images: list        # image sources (str), see ``image_source``


def media_items(row: dict, options: VideoOptions, *, input_key: str = INPUT_KEY, video_key: str = VIDEO_KEY,
                image_key: str | None = None, base_dir: str | None = None,
                media_roots: Sequence[str] | None = None) -> Media:
    """The videos (with their options) and images of a row.  ``BadRowError`` for a malformed row, and
    ``OutsideMediaRootError`` for a local source outside what the dataset may read (``_resolve``)."""
    if not isinstance(row, dict):
        raise BadRowError(f"a row must be a JSON object, got {type(row).__name__}")
    prompt = row.get(input_key)
    videos: list = []
    images: list = []
    if isinstance(prompt, list):  # message list with per-item options
        for msg in prompt:
            content = msg.get("content") if isinstance(msg, dict) else None
            for item in content if isinstance(content, list) else []:
                if isinstance(item, dict) and item.get("type") == "video":
                    src = _video(item.get("video"), "a video item", base_dir, media_roots)
                    videos.append((src, _with_item(options, item, "a video item")))
                elif _is_image_item(item):
                    v = item.get("image", item.get("image_url"))
                    if isinstance(v, dict) and "url" in v:     # OpenAI's {"image_url": {"url": ...}}
                        v = v["url"]
                    images.append(image_source(v, "an image item", base_dir, media_roots))
    listed = _as_list(row.get(video_key), video_key, "sources")
    for v in listed:
        if isinstance(v, dict) and not _hf_storage(v):
            videos.append((_video(v.get("video"), f"a {video_key!r} entry", base_dir, media_roots),
                           _with_item(options, v, f"a {video_key!r} entry")))
        else:
            videos.append((_video(v, f"a {video_key!r} entry", base_dir, media_roots), options))
    listed_images = _as_list(row.get(image_key), image_key, "images") if image_key else []
    images.extend(image_source(v, f"an {image_key!r} entry", base_dir, media_roots) for v in listed_images)
    if isinstance(prompt, str):
        # Miles' _build_messages pops one list entry per placeholder; a count that differs would fail there
        # (too few) or silently drop media (too many).
        for token, n, key, kind in ((VIDEO_TOKEN, len(listed), video_key, "video"),
                                    (IMAGE_TOKEN, len(listed_images), image_key, "image")):
            if prompt.count(token) in (0, n):
                continue
            if key is None:      # images in the row, but no key to find them under: name the fix, not "None"
                raise BadRowError(f"prompt has {prompt.count(token)} {token} placeholder(s) but no {kind} key is "
                                  f"configured; name the row's {kind} field: --multimodal-keys "
                                  f"'{{\"video\": \"{video_key}\", \"{kind}\": \"<field>\"}}' (Python: {kind}_key=)")
            raise BadRowError(f"prompt has {prompt.count(token)} {token} placeholder(s) but {n} {key!r} entries; "
                              f"Miles takes one {key!r} entry per {token}: fix the row, or point --multimodal-keys' "
                              f"\"{kind}\" at the field that holds them")
    return Media(videos, images)


def video_items(row: dict, options: VideoOptions, *, input_key: str = INPUT_KEY, video_key: str = VIDEO_KEY,
                base_dir: str | None = None, image_key: str | None = None,
                media_roots: Sequence[str] | None = None) -> list[tuple[object, VideoOptions]]:
    """(source, options) for each video of a row, in prompt order.  ``BadRowError`` for a malformed row.
    A source is a string, or ``InlineBytes`` for a video held as bytes."""
    return media_items(row, options, input_key=input_key, video_key=video_key, image_key=image_key,
                       base_dir=base_dir, media_roots=media_roots).videos


class LazyVideoDataset(Sequence[Row]):
    """A map-style dataset over a prompt file that keeps only row positions in memory.

    ``path``: a JSONL file (line offsets), a ``.parquet`` file (its footer), a ``datasets.Dataset`` or a
    dataset directory (memory-mapped by ``datasets``).  Opening reads no media: nothing is fetched or decoded.
    ``cache`` is a ``VideoCache`` (handles are bound to it), or the identity of one (``cache.identity``),
    resolved in each process that reads a row.  ``image_key``: the row key of the image list (Miles'
    ``--multimodal-keys`` ``image`` entry); images are listed in ``Row.images``, never cached.

    A video held as bytes gets a handle that carries its key (``InlineBytes.key``) and no source, and the
    bytes in ``Row.inline`` (key -> ``InlineBytes``), so the process that reads the row can build it
    (``ensure_inline``) and no other node ever needs the dataset.

    ``media_roots``: the directories local media may be read from (``--media-root``); without them a relative
    path must stay under the dataset's directory (``_resolve``: the one source rule, D54).
    """

    def __init__(self, path, cache: "VideoCache | str", options: VideoOptions, *, input_key: str = INPUT_KEY,
                 video_key: str = VIDEO_KEY, image_key: str | None = None, split: str | None = None,
                 media_roots: Sequence[str] | None = None) -> None:
        self._rows = open_rows(path, split)
        self.media_roots = check_media_roots(media_roots)
        self.path = getattr(self._rows, "path", None)
        self.cache = cache
        self.options = options
        self.input_key, self.video_key, self.image_key = input_key, video_key, image_key
        # Relative sources resolve against the file's directory, or the dataset directory itself (as prewarm
        # does); an in-memory Dataset has none (the current directory).
        self._base_dir = (os.path.dirname(self.path) if self.path else
                          os.path.abspath(path) if isinstance(path, (str, os.PathLike)) else None)
        if (cols := getattr(self._rows, "columns", None)) is not None:
            check_columns(cols, self.path or "the dataset", input_key=input_key, video_key=None,
                          image_key=image_key)

    def __len__(self) -> int:
        return len(self._rows)

    def raw(self, i: int) -> dict:
        return self._rows.raw(i)

    def _handle(self, source, options: VideoOptions) -> VideoHandle:
        identity = self.cache if isinstance(self.cache, str) else None
        if isinstance(source, InlineBytes):
            h = VideoHandle(None, options, identity or self.cache.identity, key=source.key(options))
            return h if identity else h._bind(self.cache)
        if identity:
            return VideoHandle(source, options, identity)
        return lazy(source, options, self.cache)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range for {len(self)} rows")
        row = self.raw(i)
        try:
            media = media_items(row, self.options, input_key=self.input_key, video_key=self.video_key,
                                image_key=self.image_key, base_dir=self._base_dir, media_roots=self.media_roots)
        except BadRowError as e:          # name the row: the message alone does not say which one it was
            raise type(e)(f"row {i}: {e}") from None
        return Row(i, row.get(self.input_key), [self._handle(s, o) for s, o in media.videos], row, media.images,
                   {s.key(o): s for s, o in media.videos if isinstance(s, InlineBytes)})

    def read_ahead(self, order: "Iterable[int] | None" = None, **kw) -> "ReadAhead":
        """The rows in ``order`` (indices, a sampler's; default: the file's order), with their videos pulled into
        this node's local tier ahead of the reader (``vidcache.read_ahead``; ``depth``, ``max_bytes``,
        ``workers`` as there).  Pulling starts now, before the first row is asked for: call it when the dataset
        is built, before the model loads, and the first steps' entries are local by step 1 (issue 50: the
        first step's wait was most of a run's)::

            ahead = ds.read_ahead(sampler_order)       # before the model's load
            model = load_model(...)
            for row in ahead: ...                       # the same rows, in order, each a local hit
        """
        from .readahead import read_ahead
        indices = range(len(self)) if order is None else order
        return read_ahead((self[i] for i in indices), **kw)


def ensure_inline(cache: "VideoCache", blob: InlineBytes, options: VideoOptions):
    """Build a video held as bytes: the ordinary fetch-and-hash path, from a ``data:`` URI (so the bytes go to
    the cache's own temp directory and are removed after the build, never beside the dataset)."""
    res = cache.ensure(blob.data_uri(), options)
    if res.key != blob.key(options):       # fetch hashed other bytes than the row holds: never cache under it
        raise BadRowError(f"inline video {blob}: built as {res.key}, expected {blob.key(options)}")
    return res
