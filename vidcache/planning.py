"""A dataset's rows as the jobs read them (``prewarm``, ``pull``, ``embed``): the unique tasks a dataset names
(``plan``: videos by source or by content, images to check), the rows placed for their failure records, and the
failures report every job writes.  The jobs themselves are ``prewarming`` and ``pulling``.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass, field

from . import keys
from .digest import Digest
from .dataset import InlineBytes, check_media_roots, media_items
from .errors import BadRowError, ConfigError, NoMediaError
from .options import INPUT_KEY, VIDEO_KEY, VideoOptions
from .prompt_files import check_columns, check_format, is_hf_dataset, is_parquet, iter_jsonl, open_rows


@dataclass(frozen=True)
class _Rows:
    """How ``plan`` read a dataset's rows: what an ``InlineRef`` reads its row again with."""
    reader: object = field(repr=False)
    options: VideoOptions
    input_key: str
    video_key: str
    image_key: str | None
    base_dir: str
    media_roots: tuple[str, ...] | None = None


@dataclass(frozen=True)
class InlineRef:
    """A video held as bytes in a dataset (parquet ``binary``, HF ``{"bytes": ...}``), by its place and digest.
    What ``plan`` keeps instead of the bytes (D45: planning a 1000 MiB parquet held all of it, 6.2 GiB of RSS for
    the run): the bytes are read again, one row at a time, when the video is sent to a worker."""
    rows: _Rows = field(repr=False)
    row: int
    nth: int                  # which video of the row
    digest: Digest
    size: int

    def key(self, options: VideoOptions) -> str:
        return keys.cache_key(self.digest, options)

    def load(self) -> InlineBytes:
        r = self.rows
        row = r.reader.raw(self.row)
        media = media_items(row, r.options, input_key=r.input_key, video_key=r.video_key, image_key=r.image_key,
                            base_dir=r.base_dir, media_roots=r.media_roots)
        src = media.videos[self.nth][0] if self.nth < len(media.videos) else None
        if not isinstance(src, InlineBytes) or src.digest != self.digest:
            raise BadRowError(f"row {self.row}'s video {self.nth} is no longer the bytes planned ({self}): the "
                              "dataset changed during the run")
        return src

    def __str__(self) -> str:       # as ``InlineBytes`` shows itself: never the bytes
        return f"<{self.size} inline bytes, {self.digest}>"


@dataclass(frozen=True)
class Task:
    source: "str | InlineBytes | InlineRef | ImageCheck"   # a video's source or bytes, or an image to check
    options: VideoOptions
    rows: tuple[int, ...]


@dataclass(frozen=True)
class ImageCheck:
    """An image of a row.  Images are not cached (they go through Miles' own image path, docs/miles.md); a
    worker reads each one as Miles would (qwen-vl-utils' ``fetch_image``), so an unreadable image is that
    row's failure at prewarm time, not a crash at rollout time."""
    source: str
    patch_size: int

    def __str__(self) -> str:
        return self.source if not self.source.startswith("data:") else f"<inline image, {len(self.source)} chars>"


def is_file_dataset(dataset) -> bool:
    return isinstance(dataset, (str, os.PathLike)) and not os.path.isdir(dataset)


def dataset_dir(dataset) -> str:
    """Where a dataset's relative media paths are read from: a file's directory, a dataset directory itself, or
    (rows given in memory) the working directory."""
    if is_file_dataset(dataset):
        return os.path.dirname(os.path.abspath(dataset))
    return os.path.abspath(dataset) if isinstance(dataset, (str, os.PathLike)) else os.getcwd()


def row_media(row, options, input_key, video_key, image_key, base, media_roots=None) -> list:
    """A row's media items, or the row's own error (``placed_rows`` yields a row it could not read as its
    ``BadRowError``): one rule for prewarm and pull, the source rule included (``dataset._resolve``)."""
    if isinstance(row, BadRowError):
        raise row
    return media_items(row, options, input_key=input_key, video_key=video_key, image_key=image_key, base_dir=base,
                       media_roots=media_roots)


def placed_rows(dataset, split, progress: bool, carried: set, desc: str = "prewarm"):
    """``_rows`` with each row's place for its failure records (``{"row": i}``, plus its line in a JSONL file);
    the fields of the first rows go into ``carried``, for the message when no row has media."""
    for i, row, line in _rows(dataset, split, progress, desc=desc):
        if len(carried) < 64 and isinstance(row, dict):
            carried.update(map(str, row))
        yield i, row, ({"row": i, "line": line} if line is not None else {"row": i})


def _rows(dataset, split: str | None = None, progress: bool = False, desc: str = "prewarm"):
    """(row index, row or its BadRowError, line number or None) of a JSONL or parquet path, an HF dataset (or its
    directory), or an iterable of rows.  ``progress``: a tqdm bar over the rows of a sized dataset.  A row index
    is None for what is not one row (a shard of an HF dataset that cannot be read)."""
    if is_file_dataset(dataset) and not is_parquet(dataset):
        check_format(os.fspath(dataset))
        for i, row in iter_jsonl(os.fspath(dataset)):
            yield i, row, i + 1          # the index counts every line, so the line number is index + 1
        return
    if isinstance(dataset, (str, os.PathLike)) or is_hf_dataset(dataset):
        dataset = open_rows(dataset, split)
    records = dataset.records() if hasattr(dataset, "records") else enumerate(dataset)
    if progress and hasattr(dataset, "__len__"):
        from tqdm import tqdm
        records = tqdm(records, total=len(dataset), unit="row", desc=f"{desc}: reading rows", dynamic_ncols=True)
    for i, row in records:
        yield i, row if isinstance(row, (dict, BadRowError)) else BadRowError(
            f"a row must be a dict, got {type(row).__name__}"), None


def check_keys(dataset, input_key: str, video_key: str, image_key: str | None, split: str | None):
    """A parquet file or HF dataset knows its columns: keys that name none are refused before any work."""
    if isinstance(dataset, (str, os.PathLike)) and not (is_parquet(dataset) or os.path.isdir(dataset)):
        return dataset
    if not (isinstance(dataset, (str, os.PathLike)) or is_hf_dataset(dataset)):
        return dataset
    rows = open_rows(dataset, split)
    check_columns(rows.columns, getattr(rows, "path", None) or "the dataset", input_key=input_key,
                  video_key=video_key, image_key=image_key, text_prompt=input_key in rows.text_columns)
    return rows


def plan(dataset, options: VideoOptions, input_key: str = INPUT_KEY, video_key: str = VIDEO_KEY,
         image_key: str | None = None, split: str | None = None, progress: bool = False,
         media_roots=None):
    """Unique tasks of a dataset (a JSONL or parquet path, an HF dataset or its directory, or an iterable of row
    dicts), with the rows that need each, and row-level failures.  A task is a video (by source, or by content
    for bytes) under its options, or an image to check.  Relative paths resolve against the file's directory
    (rows: the current directory), and must stay under it unless ``media_roots`` (``--media-root``) name the
    directories local media may come from (``dataset._resolve``, D54)."""
    media_roots = check_media_roots(media_roots)
    tasks: dict[tuple[str, str], tuple[object, VideoOptions, list[int]]] = {}
    bad_rows = []
    base = dataset_dir(dataset)
    patch = options.patch_size
    reader = check_keys(dataset, input_key, video_key, image_key, split)
    # Videos held as bytes are planned by digest and place, where the rows can be read again one at a time
    rows_again = (_Rows(reader, options, input_key, video_key, image_key, base, media_roots)
                  if hasattr(reader, "raw") else None)
    n_rows, seen_keys = 0, set()
    for i, row, where in placed_rows(reader, split, progress, seen_keys):
        n_rows += 1
        try:
            media = row_media(row, options, input_key, video_key, image_key, base, media_roots)
            items = [(src if not (isinstance(src, InlineBytes) and rows_again is not None) else
                      InlineRef(rows_again, i, nth, src.digest, len(src.data)),
                      opts, (str(src.digest) if isinstance(src, InlineBytes) else src, opts.digest))
                     for nth, (src, opts) in enumerate(media.videos)]
            items += [(ImageCheck(img, patch), options, (img, "image")) for img in media.images]
            del media, row               # a row's bytes go now: the plan keeps digests
        except BadRowError as e:
            bad_rows.append({**where, "source": None, "kind": e.kind, "error": str(e)})
            continue
        except Exception as e:  # noqa: BLE001  a parsing bug must cost one row, not the run (as in _build_one)
            bad_rows.append({**where, "source": None, "kind": "internal", "error": f"{type(e).__name__}: {e}"})
            continue
        for src, opts, k in items:
            t = tasks.setdefault(k, (src, opts, []))
            t[2].append(i)
    _release_arrow_memory()
    if not tasks and not bad_rows:
        # Every row read, none with media under the keys asked for (D41: rows of {"messages": ...} gave "0 new,
        # 0 hit, 0 failed"): the keys are wrong, for JSONL, parquet and HF alike, so the run fails and says where
        # it looked and what the rows carry.
        raise NoMediaError(no_media_message(n_rows, video_key, image_key, sorted(seen_keys)))
    return [Task(s, o, tuple(r)) for s, o, r in tasks.values()], bad_rows


def _release_arrow_memory() -> None:
    """Hand what Arrow's allocator kept of the rows read back to the system (a parquet page of videos held as
    bytes can be hundreds of MiB; the plan keeps none of it)."""
    pa = sys.modules.get("pyarrow")
    if pa is not None:
        with contextlib.suppress(Exception):
            pa.default_memory_pool().release_unused()


def no_media_message(n_rows: int, video_key: str, image_key: str | None, carried) -> str:
    if not n_rows:
        return "the dataset has no rows"
    where = " or ".join(repr(k) for k in (video_key, image_key) if k)
    return (f"none of the {n_rows} rows has a video or an image under {where} (the rows carry: "
            f"{', '.join(carried) or 'nothing'}); name the fields with --multimodal-keys "
            "'{\"video\": \"<field>\", \"image\": \"<field>\"}' (Python: video_key=, image_key=)")


def check_failures_path(path: str | None) -> None:
    """Refuse an unwritable failures report before any work is done (nothing is created to find out)."""
    if not path:
        return
    path = os.path.abspath(path)
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        why = "it is a directory"
    elif not os.path.isdir(parent):
        why = "its directory does not exist"
    elif not os.access(path if os.path.exists(path) else parent, os.W_OK):
        why = "permission denied"
    else:
        return
    raise ConfigError(f"cannot write the failures report {path} ({why}); choose another path with "
                      "--failures PATH (Python: failures_path=)")


FAILURE_FIELDS = ("row", "line", "source", "kind", "error")     # a failure record's keys, in this order


def in_row_order(failures: list) -> list:
    """Failure records sorted by row (workers finish in any order) with their keys in ``FAILURE_FIELDS``'
    order (then any others), so the printed list and the failures file read the same from run to run."""
    def row(rec):
        return rec["row"] if isinstance(rec.get("row"), int) else -1
    return [{**{k: rec[k] for k in FAILURE_FIELDS if k in rec}, **{k: v for k, v in rec.items()
                                                                    if k not in FAILURE_FIELDS}}
            for rec in sorted(failures, key=row)]


def write_failures(path: str | None, failures: list) -> None:
    """The failures report: written only when something failed; a stale report from an earlier run goes."""
    if not path:
        return
    if failures:
        with open(path, "w") as f:
            for rec in failures:
                f.write(json.dumps(rec) + "\n")
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def default_failures_path(dataset) -> str | None:
    """``<dataset>.failures.jsonl`` beside the dataset; in the current directory when the dataset's directory
    is read-only (a mounted data set must not stop a prewarm)."""
    if not isinstance(dataset, (str, os.PathLike)):
        return None
    path = os.path.abspath(os.fspath(dataset))
    name = os.path.splitext(os.path.basename(path))[0] + ".failures.jsonl"
    beside = os.path.join(os.path.dirname(path), name)
    return beside if os.access(os.path.dirname(path), os.W_OK) else os.path.abspath(name)
