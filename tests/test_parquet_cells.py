"""D45: one cell of a parquet file is read in memory bounded by the cell, not its row group.

``parquet_cells`` walks a column chunk's pages itself (pyarrow decodes a whole page for one value, and its default
writer puts every value of a row group in one dictionary page).  It must never give another answer than pyarrow:
a hypothesis test compares every row, read one at a time and in order, with pyarrow's own reading of generated
files (codecs, page sizes, write batch sizes, row groups, dictionary on and off, data page v1 and v2, nulls, lists
of bytes with null and empty lists and null elements).  A layout it does not read (here: lz4, a struct column)
goes to pyarrow, and the tests check which reader served."""
from __future__ import annotations

import importlib.util
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vidcache.prompt_files as dataset     # the file readers (CELL_BYTES: which columns go a cell at a time)
from vidcache.prompt_files import _ParquetRows

ROOT = os.path.join(os.path.dirname(__file__), "..")
READ_HERE = ("NONE", "SNAPPY", "ZSTD", "GZIP")           # the codecs parquet_cells reads (pyarrow's names)


def _benchmark():
    spec = importlib.util.spec_from_file_location("parquet_cell_memory",
                                                  os.path.join(ROOT, "benchmarks", "parquet_cell_memory.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


values = st.one_of(st.none(), st.binary(max_size=3000), st.sampled_from([b"", b"same", b"\x00" * 700]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(rows=st.lists(values, min_size=1, max_size=120),
       codec=st.sampled_from(["none", "snappy", "zstd", "gzip", "lz4"]),
       page_size=st.sampled_from([64, 4096, 1 << 20]), batch=st.sampled_from([1, 7, 1024]),
       group=st.integers(1, 130), dictionary=st.booleans(), version=st.sampled_from(["1.0", "2.0"]),
       seed=st.integers(0, 2**16))
def test_every_cell_equals_pyarrows(tmp_path_factory, monkeypatch, rows, codec, page_size, batch, group,
                                    dictionary, version, seed):
    monkeypatch.setattr(dataset, "CELL_BYTES", 0)           # every binary/string column read a cell at a time
    path = str(tmp_path_factory.mktemp("pq") / "f.parquet")
    rng = random.Random(seed)
    lists = [None if v is None and rng.random() < 0.5 else [] if v is None else
             [v] + [rng.choice([None, v[:10], b"x" * rng.randint(0, 900)]) for _ in range(rng.randint(0, 3))]
             for v in rows]
    table = pa.table({"prompt": [f"row {i}" for i in range(len(rows))],
                      "video": pa.array(rows, pa.binary()),
                      "caption": pa.array([None if v is None else v.hex()[:50] for v in rows], pa.string()),
                      "n": list(range(len(rows))),
                      "videos": pa.array(lists, pa.list_(pa.binary())),          # Miles' rows: a list of bytes
                      "required": pa.array([[x for x in v or [] if x is not None] for v in lists],   # no nulls
                                           pa.list_(pa.field("item", pa.binary(), nullable=False))),
                      "struct": [{"bytes": v, "path": None} for v in rows]})     # HF's storage: pyarrow's
    pq.write_table(table, path, compression=codec, data_page_size=page_size, write_batch_size=batch,
                   row_group_size=group, use_dictionary=dictionary, data_page_version=version)
    expected = pq.read_table(path).to_pylist()
    reader = _ParquetRows(path)
    assert [row for _, row in reader.records()] == expected
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    fresh = _ParquetRows(path)
    for i in order[:40] + sorted(order[:40]):                 # random rows, then forward (a DataLoader's order)
        assert fresh.raw(i) == expected[i], (i, codec)
    served = {name: chunk is not None for name, chunk in fresh._chunks.items()}
    # the cell reader served the binary and string columns and lists of the codecs it reads, and nothing else
    assert served.get("video") == served.get("caption") == served.get("videos") == served.get("required") == (
        codec.upper() in READ_HERE), served
    assert "struct" not in served and "n" not in served


def test_a_damaged_page_is_pyarrows_to_report(tmp_path, monkeypatch):
    """A page header that does not parse is never guessed at: pyarrow reads the column and names the damage
    (one ``BadRowError`` for the group)."""
    monkeypatch.setattr(dataset, "CELL_BYTES", 0)
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "videos": [b"x" * 5000, b"y" * 5000]}), path,
                   compression="none", use_dictionary=False)
    md = pq.ParquetFile(path).metadata
    data = bytearray(path.read_bytes())
    off = md.row_group(0).column(1).data_page_offset
    data[off:off + 8] = b"\xff" * 8                                     # the page header, garbled
    path.write_bytes(bytes(data))
    with pytest.raises(dataset.BadRowError, match="row group 0"):
        _ParquetRows(str(path)).raw(1)


@pytest.mark.parametrize("codec,layout", [("none", "flat"), ("snappy", "flat"), ("zstd", "flat"), ("gzip", "flat"),
                                          ("snappy", "list")])
def test_one_row_costs_a_few_rows_not_the_row_group(tmp_path, codec, layout):
    """The issue's layout, smaller: 20 rows of 4 MiB in one row group, pyarrow's default writer (every value in
    one dictionary page).  Reading the last row, in a fresh interpreter, adds at most 3 rows' worth to the peak
    RSS (the row, a copy while it is assembled) and 8 MiB (decompressor buffers, snappy's window).  Measured: 9 to
    14 MiB; before, 181 MiB (the 80 MiB page, twice over)."""
    bench = _benchmark()
    path = str(tmp_path / "f.parquet")
    bench.write_apart(path, rows=20, mib=4, codec=codec, layout=layout)      # list: Miles' "videos": [bytes]
    got = bench.measure(path, "after", "row")
    assert got["cell_mib"] == 4
    assert got["read_mib"] < 3 * got["cell_mib"] + 8, got
    planned = bench.measure(path, "after", "plan")            # prewarm's pass over every row
    assert planned["read_mib"] < 5 * planned["cell_mib"] + 8, planned
