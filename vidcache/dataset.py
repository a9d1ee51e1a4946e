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
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence

from .digest import Digest
from .errors import BadRowError, DatasetFormatError, OptionsError, OutsideMediaRootError, UnknownColumnError
from .handle import VideoHandle, lazy
from .keys import cache_key
from .loader.fetch import scheme_of
from .options import CONTENT_ITEM_KEYS, INPUT_KEY, VIDEO_KEY, VideoOptions

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


# --- prompt files: JSONL, parquet, HF datasets ------------------------------------------------------------------
PARQUET_MAGIC = b"PAR1"


def _head(path, n: int = 1 << 16) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except OSError:
        return b""


def is_parquet(path) -> bool:
    """A ``.parquet`` path, or a file that is parquet whatever its name (its magic number)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    return os.fspath(path).lower().endswith(".parquet") or (os.path.isfile(path) and _head(path, 4) == PARQUET_MAGIC)


# Container magic numbers: a video given as the dataset is named as one, not read as 288 bad lines.
_MAGIC = ((4, b"ftyp", "an MP4/MOV video"), (0, b"\x1aE\xdf\xa3", "a Matroska/WebM video"),
          (0, b"RIFF", "a RIFF (AVI/WAV) file"), (0, b"\x89PNG", "a PNG image"),
          (0, b"\xff\xd8\xff", "a JPEG image"), (0, b"GIF8", "a GIF image"), (0, b"PK\x03\x04", "a zip archive"),
          (0, b"\x1f\x8b", "a gzip file"))


def _binary(line: bytes) -> bool:
    if b"\x00" in line:
        return True
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def check_format(path) -> None:
    """Refuse, up front and in one error, a file that is not JSON Lines (the format every non-parquet dataset
    file is read as): a video or other binary file, a JSON array, a CSV.  Only the file's head is read."""
    head = _head(path)
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()]
    if not lines:
        return
    what = None
    for off, magic, name in _MAGIC:
        if name and head[off:off + len(magic)] == magic:
            what = name
            break
    # A NUL elsewhere is one bad row (parse_row refuses it), not the whole file: only a head whose first lines are
    # not rows at all (below) is a binary file.
    if what is not None:
        raise DatasetFormatError(f"{path} is {what}, not a dataset: give the JSON Lines (.jsonl) or .parquet "
                                 "file, or the dataset directory, whose rows name the videos")
    first = lines[:2]
    if first[0].startswith(b"["):          # a JSON Lines row is an object: this is one array of them
        raise DatasetFormatError(f"{path} is a JSON array, not JSON Lines (one object per line); convert it: "
                                 f"jq -c '.[]' {os.path.basename(path)} > rows.jsonl")
    if not any(ln.startswith(b"{") for ln in first):          # one bad line at the top is a bad row, not this
        looks = ("a CSV/TSV file" if any(c in first[0] for c in (b",", b"\t")) else
                 "a binary file" if _binary(first[0]) else "not JSON Lines")
        raise DatasetFormatError(f"{path} is {looks}: its first lines are not JSON objects ({first[0][:60]!r}); "
                                 "give JSON Lines (one {\"prompt\": ..., \"videos\": [...]} object per line), "
                                 ".parquet, or a dataset directory")




def _pyarrow_parquet():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        from .errors import BackendUnavailableError
        raise BackendUnavailableError("reading .parquet prompt files needs pyarrow (a vidcache dependency): "
                                      "pip install 'pyarrow>=21'") from None
    return pq


def check_columns(columns: Sequence[str], where: str, *, input_key: str, video_key: str | None,
                  image_key: str | None, text_prompt: bool = True) -> None:
    """Refuse keys that name no column of a parquet file or HF dataset, naming the columns found
    (``UnknownColumnError``), before any row is read.  The prompt key must be a column, and so must an image
    key that was asked for.  The video key (``videos`` unless given) must be one where nothing else could
    hold the media: no image key and a text prompt (a message-list prompt carries its media in its items)."""
    cols = list(columns)
    missing = [k for k in (input_key,) if k not in cols]
    if image_key and image_key not in cols:
        missing.append(image_key)
    elif video_key and video_key not in cols and not image_key and text_prompt:
        missing.append(video_key)
    if missing:
        raise UnknownColumnError(f"{where} has no column {' / '.join(repr(k) for k in missing)}; columns found: "
                                 f"{cols} (set --input-key / --multimodal-keys to these names)")


def _text_columns(arrow_schema) -> set:
    import pyarrow as pa
    return {f.name for f in arrow_schema if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)}


class _JsonlRows:
    """Line offsets of a JSONL file (8 bytes a row); a row is read and parsed when asked for."""

    def __init__(self, path: str) -> None:
        import numpy as np
        self.path = path
        offsets, pos = [], 0
        with open(path, "rb") as f:
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


BATCH_BYTES = 1 << 20         # a parquet batch decoded at once: rows of about this many bytes (one, if larger)


def _unreadable() -> tuple:
    import pyarrow as pa
    return (OSError, pa.ArrowException)


CELL_BYTES = 256 << 10        # a binary/string column whose rows average more: read one cell at a time (D45)


def _cell_columns_of(arrow_schema, parquet_schema) -> dict:
    """The top-level columns ``parquet_cells`` may read: binary or string, or a list of them (one leaf each):
    name -> (leaf column, is text, None or (list nullable, element nullable))."""
    import pyarrow as pa
    leaves: dict = {}
    for j in range(len(parquet_schema)):
        leaves.setdefault(parquet_schema.column(j).path.split(".")[0], []).append(j)

    def kind(t):
        return ("text" if pa.types.is_string(t) or pa.types.is_large_string(t) else
                "bytes" if pa.types.is_binary(t) or pa.types.is_large_binary(t) else None)
    out = {}
    for f in arrow_schema:
        if len(leaves.get(f.name, ())) != 1:
            continue
        t, nulls = f.type, None
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            t, nulls = t.value_type, (int(f.nullable), int(f.type.value_field.nullable))
        if kind(t):
            out[f.name] = (leaves[f.name][0], kind(t) == "text", nulls)
    return out


class _ParquetRows:
    """A parquet prompt file read as Miles reads it (pyarrow, ``to_pylist`` rows), lazily and in bounded memory:
    opening reads the footer only, and only the row asked for is kept.

    A large binary or string column, or list of them (videos held as bytes: more than ``CELL_BYTES`` a row), is read
    one cell at a time by ``parquet_cells``: pyarrow would decode a whole page for one value, and its writer puts up to 1024 rows
    in a page, or every value of the row group in one dictionary page (D45: 40 videos of 25 MiB cost 2 GiB to read
    one).  Its memory is then the cell, for uncompressed, zstd, gzip and brotli pages; a snappy page is decompressed
    whole (docs/storage.md).  A layout it does not read (nested columns, other encodings or codecs) is read by
    pyarrow, as are the other columns: in batches of about ``BATCH_BYTES`` (one row where rows are larger), never a
    whole row group.  Reading the next row continues where the last read stopped (a DataLoader's sequential order);
    an earlier row restarts its page or row group's reader and skips to it.  A row group that cannot be decoded is
    one ``BadRowError`` for its rows, never the end of the file."""

    def __init__(self, path: str) -> None:
        import numpy as np
        pq = _pyarrow_parquet()
        import pyarrow as pa
        self.path = path
        try:
            # pre_buffer=False: column chunks are read as they are decoded, not each whole into memory first
            self._pf = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
        except pa.ArrowException as e:     # no footer (a copy cut short), a bad magic (ArrowInvalid)
            raise DatasetFormatError(f"{path} cannot be read as parquet ({type(e).__name__}: {str(e)[:200]}): "
                                     "is it truncated (a copy cut short loses the footer, which indexes every "
                                     "row)? Copy it again, or give the JSON Lines file") from None
        md = self._pf.metadata
        self.columns = list(self._pf.schema_arrow.names)
        self.text_columns = _text_columns(self._pf.schema_arrow)
        self._starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)], dtype=np.int64)
        self._flat = _cell_columns_of(self._pf.schema_arrow, md.schema)
        self._cursor: list | None = None       # [group, columns, first row of the batch, the batch, its batches]
        self._chunks: dict = {}                # name -> ColumnChunk (or None: pyarrow reads it) of _chunks_group
        self._chunks_group = -1
        self._big_group, self._big = -1, []    # _cell_columns of the group read last

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _cell_columns(self, g: int) -> list[str]:
        """The columns of row group ``g`` read a cell at a time: binary or string, more than ``CELL_BYTES`` a row."""
        if self._big_group != g:
            rg = self._pf.metadata.row_group(g)
            self._big = [name for name, (j, _, _) in self._flat.items()
                         if rg.column(j).total_uncompressed_size > CELL_BYTES * max(1, rg.num_rows)]
            self._big_group = g
        return self._big

    def _batches(self, g: int, columns: list | None = None):
        """(index of its first row, record batch) over row group ``g``, about ``BATCH_BYTES`` a batch."""
        rg = self._pf.metadata.row_group(g)
        size = rg.total_byte_size if columns is None else sum(
            rg.column(j).total_uncompressed_size for j in range(rg.num_columns)
            if rg.column(j).path_in_schema.split(".")[0] in columns)
        per_row = max(1, size // max(1, rg.num_rows))
        start = int(self._starts[g])
        for batch in self._pf.iter_batches(batch_size=max(1, min(65536, BATCH_BYTES // per_row)), row_groups=[g],
                                           columns=columns, use_threads=False):
            yield start, batch
            start += batch.num_rows

    def _unreadable_group(self, g: int, first: int, e: Exception) -> BadRowError:
        return BadRowError(f"row group {g} of {self.path} (rows {first}-{int(self._starts[g + 1]) - 1}) cannot be "
                           f"read ({type(e).__name__}: {str(e)[:200]}); its rows are skipped")

    def _group(self, i: int) -> int:
        import numpy as np
        return int(np.searchsorted(self._starts, i, side="right")) - 1

    def _arrow_row(self, g: int, i: int, columns: list | None) -> dict:
        """Row ``i`` (of group ``g``) through pyarrow's batches, of ``columns`` (all: None)."""
        if columns is not None and not columns:
            return {}
        c = self._cursor           # [group, columns, first row of the batch, the batch, the group's batches]
        if c is None or c[0] != g or c[1] != columns or c[2] > i:
            c = [g, columns, int(self._starts[g]), None, self._batches(g, columns)]
        self._cursor = None
        while c[3] is None or i >= c[2] + c[3].num_rows:     # batches before the row: decoded, not converted
            c[2], c[3] = next(c[4])
        self._cursor = c
        return c[3].slice(i - c[2], 1).to_pylist()[0]

    def _cell(self, g: int, i: int, name: str):
        """Row ``i``'s value of column ``name``, a cell at a time; pyarrow's where ``parquet_cells`` cannot."""
        import struct

        import pyarrow as pa

        from .parquet_cells import ColumnChunk, Unsupported
        if self._chunks_group != g:
            self._close_chunks()
            self._chunks_group = g
        j, text, list_nulls = self._flat[name]
        try:
            if name not in self._chunks:
                self._chunks[name] = None               # until it opens: a layout it refuses stays pyarrow's
                self._chunks[name] = ColumnChunk(self.path, self._pf.metadata, g, j, list_nulls)
            if self._chunks[name] is not None:
                v = self._chunks[name].cell(i - int(self._starts[g]))
                if text and v is not None:
                    v = [x if x is None else x.decode("utf-8") for x in v] if list_nulls else v.decode("utf-8")
                return v
        except (Unsupported, ValueError, IndexError, struct.error, pa.ArrowException):
            # a layout or a page it does not read: never a guess, pyarrow reads it (and names what is wrong)
            chunk = self._chunks.pop(name, None)
            self._chunks[name] = None
            if chunk is not None:
                chunk.close()
        return self._arrow_row(g, i, [name])[name]

    def _close_chunks(self) -> None:
        for chunk in self._chunks.values():
            if chunk is not None:
                chunk.close()
        self._chunks = {}

    def _row(self, g: int, i: int) -> dict:
        big = self._cell_columns(g)
        if not big:
            return self._arrow_row(g, i, None)
        row = self._arrow_row(g, i, [c for c in self.columns if c not in big])
        for name in big:
            row[name] = self._cell(g, i, name)
        return {c: row[c] for c in self.columns}

    def raw(self, i: int) -> dict:
        g = self._group(i)
        try:
            return self._row(g, i)
        except _unreadable() as e:
            self._cursor = None
            raise self._unreadable_group(g, int(self._starts[g]), e) from None

    def records(self) -> Iterator[tuple[int, "dict | BadRowError"]]:
        """(row index, row) in file order; an unreadable row group is one ``BadRowError`` at its first row
        not read, and the groups after it are still read."""
        for g in range(len(self._starts) - 1):
            i = int(self._starts[g])
            try:
                if self._cell_columns(g):
                    for i in range(i, int(self._starts[g + 1])):
                        yield i, self._row(g, i)
                    continue
                for _, batch in self._batches(g):
                    for row in batch.to_pylist():
                        yield i, row
                        i += 1
            except _unreadable() as e:
                yield i, self._unreadable_group(g, i, e)

    def __iter__(self) -> Iterator[dict]:
        for _, row in self.records():
            if not isinstance(row, BadRowError):
                yield row

    def __getstate__(self):           # a DataLoader worker reopens the file: a ParquetFile is not shared
        return {"path": self.path}

    def __setstate__(self, st) -> None:
        self.__init__(st["path"])


DATA_FILES = (".parquet", ".jsonl", ".json", ".csv", ".arrow")


def _has_data_files(path: str) -> bool:
    for _, _, files in os.walk(path):
        if any(f.lower().endswith(DATA_FILES) for f in files):
            return True
    return False


def _datasets():
    try:
        import datasets
    except ImportError:
        from .errors import BackendUnavailableError
        raise BackendUnavailableError("Hugging Face datasets need the datasets package: "
                                      "pip install 'vidcache[data]'") from None
    return datasets


def _load_from_disk(path: str, split: str | None):
    """``save_to_disk``'s directory, one split of it: (the dataset, a ``BadRowError`` per shard that cannot be
    read).  Only the split asked for is opened, and a missing or damaged ``.arrow`` shard costs its rows, not the
    dataset: the others are opened one by one (memory-mapped; nothing is written)."""
    datasets = _datasets()
    dd = os.path.join(path, "dataset_dict.json")
    if os.path.isfile(dd):
        with open(dd) as f:
            splits = list(json.load(f).get("splits") or [])
        name = split or ("train" if "train" in splits else (splits or [None])[0])
        if name not in splits:
            raise UnknownColumnError(f"the dataset has no split {name!r}; splits found: {sorted(splits)}")
        path = os.path.join(path, name)
    elif split is not None:
        raise UnknownColumnError(f"split={split!r} was given, but the dataset has no splits")
    try:
        return datasets.load_from_disk(path), []
    except (FileNotFoundError, *_unreadable()) as whole:
        try:
            with open(os.path.join(path, "state.json")) as f:
                shards = [d["filename"] for d in json.load(f)["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError):
            raise whole from None
    parts, errors = [], []
    for name in shards:
        try:
            parts.append(datasets.Dataset.from_file(os.path.join(path, name), in_memory=False))
        except (FileNotFoundError, *_unreadable()) as e:
            errors.append(BadRowError(f"shard {name} of {path} cannot be read ({type(e).__name__}: "
                                      f"{str(e)[:200]}); its rows are skipped"))
    if not parts:
        from .errors import ConfigError
        raise ConfigError(f"no shard of {path} can be read: " + "; ".join(map(str, errors)))
    return (parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)), errors


def _open_hf(dataset, split: str | None = None):
    """(``datasets.Dataset``, per-shard errors) from one, from a ``DatasetDict`` (``split``, default ``train``),
    or from a directory: ``save_to_disk``'s or any directory ``load_dataset`` reads."""
    datasets = _datasets()
    errors: list = []
    if isinstance(dataset, (str, os.PathLike)):
        path = os.fspath(dataset)
        if os.path.isfile(os.path.join(path, "state.json")) or os.path.isfile(os.path.join(path, "dataset_dict.json")):
            dataset, errors = _load_from_disk(path, split)
            split = None
        elif _has_data_files(path):
            dataset = datasets.load_dataset(path)     # datasets converts the files once, into its own cache
        else:
            # load_dataset would make a dataset of anything (a folder of clips becomes a "videofolder")
            from .errors import ConfigError
            raise ConfigError(f"{path} is neither a save_to_disk directory nor a directory of data files "
                              f"({', '.join(DATA_FILES)}) that load_dataset reads")
    if isinstance(dataset, (datasets.DatasetDict, dict)):
        name = split or ("train" if "train" in dataset else next(iter(dataset)))
        if name not in dataset:
            raise UnknownColumnError(f"the dataset has no split {name!r}; splits found: {sorted(dataset)}")
        dataset = dataset[name]
    elif split is not None:
        raise UnknownColumnError(f"split={split!r} was given, but the dataset has no splits")
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(f"expected a datasets.Dataset, got {type(dataset).__name__}")
    return dataset, errors


def open_hf(dataset, split: str | None = None):
    """A ``datasets.Dataset`` from one, from a ``DatasetDict`` (``split``, default ``train``), or from a
    directory: ``save_to_disk``'s (``load_from_disk``) or any directory ``load_dataset`` reads."""
    return _open_hf(dataset, split)[0]


class _HFRows:
    """A ``datasets.Dataset``: Arrow-backed and memory-mapped by ``datasets`` itself, so a row is read when
    asked for.  Rows are read in the Arrow format: media features (``Image``, ``Video``) come as stored
    (``{"bytes", "path"}``), never decoded to PIL images or decoders, and the dataset is never cast (a cast
    rewrites every row into a copy beside the data, and fails on a read-only mount)."""

    def __init__(self, ds, errors=()) -> None:
        self.ds = ds
        self._arrow = ds.with_format("arrow")
        self.errors = list(errors)
        self.columns = list(ds.column_names)
        self.text_columns = _text_columns(ds.features.arrow_schema)

    def __len__(self) -> int:
        return len(self.ds)

    def raw(self, i: int) -> dict:
        return self._arrow[int(i)].to_pylist()[0]

    def records(self) -> Iterator[tuple[int, "dict | BadRowError"]]:
        for e in self.errors:          # a shard that could not be opened: one record each, before the rows
            yield None, e
        n = len(self.ds)
        per_row = max(1, self.ds.data.nbytes // max(1, n))
        step = max(1, min(1024, BATCH_BYTES // per_row))      # rows of videos held as bytes: a few at a time
        for start in range(0, n, step):
            for j, row in enumerate(self._arrow[start:min(n, start + step)].to_pylist()):
                yield start + j, row

    def __iter__(self) -> Iterator[dict]:
        for _, row in self.records():
            if not isinstance(row, BadRowError):
                yield row


def is_hf_dataset(obj) -> bool:
    """A ``datasets.Dataset`` / ``DatasetDict`` (checked without importing ``datasets``)."""
    return type(obj).__module__.split(".")[0] == "datasets" and hasattr(obj, "column_names")


def open_rows(dataset, split: str | None = None):
    """The row reader of a prompt file (JSONL, ``.parquet``), an HF dataset or a dataset directory."""
    if is_hf_dataset(dataset):
        return _HFRows(*_open_hf(dataset, split))
    path = os.path.abspath(os.fspath(dataset))
    if os.path.isdir(path):
        return _HFRows(*_open_hf(path, split))
    if is_parquet(path):
        return _ParquetRows(path)
    check_format(path)
    return _JsonlRows(path)


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
