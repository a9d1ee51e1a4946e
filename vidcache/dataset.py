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
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from .digest import Digest
from .errors import BadRowError, OptionsError, UnknownColumnError
from .handle import VideoHandle, lazy
from .keys import cache_key
from .loader.fetch import scheme_of
from .options import CONTENT_ITEM_KEYS, INPUT_KEY, VIDEO_KEY, VideoOptions

if TYPE_CHECKING:
    from .cache import VideoCache

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


def _resolve(source: str, base_dir: str | None) -> str:
    if base_dir and scheme_of(source) == "file" and source[:5].lower() != "file:" and not os.path.isabs(source):
        return os.path.normpath(os.path.join(base_dir, source))
    return source


def _hf_storage(v: object) -> bool:
    """HF ``datasets``' ``Image`` / ``Video`` storage form (``decode=False``): ``{"bytes": ..., "path": ...}``."""
    return isinstance(v, dict) and bool(v) and set(v) <= {"bytes", "path"}


def _bytes_or_path(v: dict):
    return v["bytes"] if v.get("bytes") is not None else v.get("path")


def _video(v: object, where: str, base_dir: str | None) -> "str | InlineBytes":
    if _hf_storage(v):
        v = _bytes_or_path(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        if not len(v):
            raise BadRowError(f"{where} holds 0 bytes")
        return InlineBytes(bytes(v))
    if not isinstance(v, str) or not v:
        raise BadRowError(f"{where} must name a source string or hold bytes, got {type(v).__name__} {str(v)[:60]!r}")
    return _resolve(v, base_dir)


def image_source(v: object, where: str, base_dir: str | None = None) -> str:
    """An image value as qwen-vl-utils' ``fetch_image`` (Miles' image path) reads it: a path (relative ones
    resolved against the dataset's directory), a URL, or a ``data:image...;base64,`` URI for bytes, which
    ``fetch_image`` decodes exactly as it decodes any base64 image (``Image.open`` on the bytes)."""
    if _hf_storage(v):
        v = _bytes_or_path(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        if not len(v):
            raise BadRowError(f"{where} holds 0 bytes")
        return "data:image;base64," + base64.b64encode(bytes(v)).decode("ascii")
    if not isinstance(v, str) or not v:
        raise BadRowError(f"{where} must name an image source or hold bytes, got {type(v).__name__} "
                          f"{str(v)[:60]!r}")
    return _resolve(v, base_dir)


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
                image_key: str | None = None, base_dir: str | None = None) -> Media:
    """The videos (with their options) and images of a row.  ``BadRowError`` for a malformed row."""
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
                    src = _video(item.get("video"), "a video item", base_dir)
                    videos.append((src, _with_item(options, item, "a video item")))
                elif _is_image_item(item):
                    v = item.get("image", item.get("image_url"))
                    if isinstance(v, dict) and "url" in v:     # OpenAI's {"image_url": {"url": ...}}
                        v = v["url"]
                    images.append(image_source(v, "an image item", base_dir))
    listed = _as_list(row.get(video_key), video_key, "sources")
    for v in listed:
        if isinstance(v, dict) and not _hf_storage(v):
            videos.append((_video(v.get("video"), f"a {video_key!r} entry", base_dir),
                           _with_item(options, v, f"a {video_key!r} entry")))
        else:
            videos.append((_video(v, f"a {video_key!r} entry", base_dir), options))
    listed_images = _as_list(row.get(image_key), image_key, "images") if image_key else []
    images.extend(image_source(v, f"an {image_key!r} entry", base_dir) for v in listed_images)
    if isinstance(prompt, str):
        # Miles' _build_messages pops one list entry per placeholder; a count that differs would fail there
        # (too few) or silently drop media (too many).
        for token, n, key in ((VIDEO_TOKEN, len(listed), video_key), (IMAGE_TOKEN, len(listed_images), image_key)):
            if prompt.count(token) not in (0, n):
                raise BadRowError(f"prompt has {prompt.count(token)} {token} placeholders but {n} {key!r} entries")
    return Media(videos, images)


def video_items(row: dict, options: VideoOptions, *, input_key: str = INPUT_KEY, video_key: str = VIDEO_KEY,
                base_dir: str | None = None, image_key: str | None = None) -> list[tuple[object, VideoOptions]]:
    """(source, options) for each video of a row, in prompt order.  ``BadRowError`` for a malformed row.
    A source is a string, or ``InlineBytes`` for a video held as bytes."""
    return media_items(row, options, input_key=input_key, video_key=video_key, image_key=image_key,
                       base_dir=base_dir).videos


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
def is_parquet(path) -> bool:
    return isinstance(path, (str, os.PathLike)) and os.fspath(path).lower().endswith(".parquet")


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


class _ParquetRows:
    """A parquet prompt file read as Miles reads it (pyarrow, ``to_pylist`` rows), lazily: opening reads the
    footer only; a row reads its row group (the smallest unit parquet decodes), and the last ``keep`` groups
    stay decoded for the rows next to it."""

    def __init__(self, path: str, keep: int = 2) -> None:
        import numpy as np
        pq = _pyarrow_parquet()
        self.path = path
        self._pf = pq.ParquetFile(path)
        md = self._pf.metadata
        self.columns = list(self._pf.schema_arrow.names)
        self.text_columns = _text_columns(self._pf.schema_arrow)
        self._starts = np.cumsum([0] + [md.row_group(g).num_rows for g in range(md.num_row_groups)], dtype=np.int64)
        self._keep = max(1, keep)
        self._groups: dict = {}

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _group(self, g: int):
        t = self._groups.pop(g, None)
        if t is None:
            t = self._pf.read_row_group(g)
            while len(self._groups) >= self._keep:
                self._groups.pop(next(iter(self._groups)))
        self._groups[g] = t          # most recent last
        return t

    def raw(self, i: int) -> dict:
        import numpy as np
        g = int(np.searchsorted(self._starts, i, side="right")) - 1
        return self._group(g).slice(i - int(self._starts[g]), 1).to_pylist()[0]

    def __iter__(self) -> Iterator[dict]:
        for batch in self._pf.iter_batches():       # Miles' parquet_reader
            yield from batch.to_pylist()

    def __getstate__(self):           # a DataLoader worker reopens the file: a ParquetFile is not shared
        return {"path": self.path, "keep": self._keep}

    def __setstate__(self, st) -> None:
        self.__init__(st["path"], st["keep"])


def _undecoded(ds):
    """``ds`` with HF's media features left as stored (``{"bytes", "path"}``): rows must carry what the file
    holds, not decoded PIL images or torchcodec decoders (those would be decoded at every row read)."""
    feats = getattr(ds, "features", None)
    if not feats:
        return ds
    import datasets

    def plain(f):
        if isinstance(f, (datasets.Image, getattr(datasets, "Video", ()))) and getattr(f, "decode", False):
            return type(f)(decode=False)
        if isinstance(f, getattr(datasets, "List", ())):
            return type(f)(plain(f.feature), length=f.length)
        if isinstance(f, datasets.Sequence):
            return datasets.Sequence(plain(f.feature), length=f.length)
        if isinstance(f, dict):
            return {k: plain(v) for k, v in f.items()}
        if isinstance(f, list):
            return [plain(v) for v in f]
        return f
    new = datasets.Features({k: plain(v) for k, v in feats.items()})
    return ds if new == feats else ds.cast(new)


DATA_FILES = (".parquet", ".jsonl", ".json", ".csv", ".arrow")


def _has_data_files(path: str) -> bool:
    for _, _, files in os.walk(path):
        if any(f.lower().endswith(DATA_FILES) for f in files):
            return True
    return False


def open_hf(dataset, split: str | None = None):
    """A ``datasets.Dataset`` from one, from a ``DatasetDict`` (``split``, default ``train``), or from a
    directory: ``save_to_disk``'s (``load_from_disk``) or any directory ``load_dataset`` reads."""
    try:
        import datasets
    except ImportError:
        from .errors import BackendUnavailableError
        raise BackendUnavailableError("Hugging Face datasets need the datasets package: "
                                      "pip install 'vidcache[data]'") from None
    if isinstance(dataset, (str, os.PathLike)):
        path = os.fspath(dataset)
        if os.path.isfile(os.path.join(path, "state.json")) or os.path.isfile(os.path.join(path, "dataset_dict.json")):
            dataset = datasets.load_from_disk(path)
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
    return _undecoded(dataset)


class _HFRows:
    """A ``datasets.Dataset``: Arrow-backed and memory-mapped by ``datasets`` itself, so a row is read when
    asked for."""

    def __init__(self, ds) -> None:
        self.ds = ds
        self.columns = list(ds.column_names)
        self.text_columns = _text_columns(ds.features.arrow_schema)

    def __len__(self) -> int:
        return len(self.ds)

    def raw(self, i: int) -> dict:
        return self.ds[int(i)]

    def __iter__(self) -> Iterator[dict]:
        return iter(self.ds)


def is_hf_dataset(obj) -> bool:
    """A ``datasets.Dataset`` / ``DatasetDict`` (checked without importing ``datasets``)."""
    return type(obj).__module__.split(".")[0] == "datasets" and hasattr(obj, "column_names")


def open_rows(dataset, split: str | None = None):
    """The row reader of a prompt file (JSONL, ``.parquet``), an HF dataset or a dataset directory."""
    if is_hf_dataset(dataset):
        return _HFRows(open_hf(dataset, split))
    path = os.path.abspath(os.fspath(dataset))
    if os.path.isdir(path):
        return _HFRows(open_hf(path, split))
    if is_parquet(path):
        return _ParquetRows(path)
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
    """

    def __init__(self, path, cache: "VideoCache | str", options: VideoOptions, *, input_key: str = INPUT_KEY,
                 video_key: str = VIDEO_KEY, image_key: str | None = None, split: str | None = None) -> None:
        self._rows = open_rows(path, split)
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
        tier = self.cache if isinstance(self.cache, str) else None
        if isinstance(source, InlineBytes):
            h = VideoHandle(None, options, tier or self.cache.identity, key=source.key(options))
            return h if tier else h._bind(self.cache)
        if tier:
            return VideoHandle(source, options, tier)
        return lazy(source, options, self.cache)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"row {i} out of range for {len(self)} rows")
        row = self.raw(i)
        media = media_items(row, self.options, input_key=self.input_key, video_key=self.video_key,
                            image_key=self.image_key, base_dir=self._base_dir)
        return Row(i, row.get(self.input_key), [self._handle(s, o) for s, o in media.videos], row, media.images,
                   {s.key(o): s for s, o in media.videos if isinstance(s, InlineBytes)})


def ensure_inline(cache: "VideoCache", blob: InlineBytes, options: VideoOptions):
    """Build a video held as bytes: the ordinary fetch-and-hash path, from a ``data:`` URI (so the bytes go to
    the cache's own temp directory and are removed after the build, never beside the dataset)."""
    res = cache.ensure(blob.data_uri(), options)
    if res.key != blob.key(options):       # fetch hashed other bytes than the row holds: never cache under it
        raise BadRowError(f"inline video {blob}: built as {res.key}, expected {blob.key(options)}")
    return res
