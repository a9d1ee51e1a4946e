"""A dataset's files, a row at a time: Miles' JSONL prompt files, parquet files (large cells read one at a time by
``parquet_cells``, not their row group) and Hugging Face datasets (a saved directory or an in-memory one).  What a
row *means* (its prompt, videos and images, and where local media may come from) is ``dataset``'s.
"""
from __future__ import annotations

import json
import os
from typing import Iterator, Sequence

from .errors import BadRowError, DatasetFormatError, UnknownColumnError


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
