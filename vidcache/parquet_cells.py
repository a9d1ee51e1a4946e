"""One cell of a parquet column, read in memory bounded by the cell, not the row group (D45).

pyarrow decodes a whole data page to give one value, and its writer puts up to ``write_batch_size`` (1024) rows in
a page, or, with the default dictionary encoding, every distinct value of the column chunk in one dictionary page:
a parquet file of 40 videos of 25 MiB held 1,000 MiB in one page, and reading one video cost 2 GiB.  pyarrow does
not expose pages to Python, and no installed library does (fastparquet parses page headers, but is not a
dependency), so this module walks them itself with what the footer gives (``ParquetFile.metadata``: each column
chunk's offset, size and codec) and the format's own page headers (Thrift compact protocol, parsed below).

Within a page, a PLAIN ``BYTE_ARRAY`` value is a 4-byte length and its bytes: the reader skips to the row's value by
those lengths, and keeps only that value.  A page's bytes come:
  - uncompressed: straight from the file (seeks): memory O(cell);
  - zstd, gzip, brotli: through pyarrow's streaming decompressor (``CompressedInputStream``): memory O(cell);
  - snappy (pyarrow's default codec): decoded as read by ``_Snappy`` (no library streams raw snappy): O(cell);
  - lz4_raw: decompressed whole by pyarrow: memory O(page).  The older LZ4 (Hadoop framing) and LZO: pyarrow.
Top-level binary or string columns are read this way, and top-level lists of them (Miles' ``"videos": [bytes]``),
PLAIN or dictionary encoded (the dictionary page is PLAIN).  Anything else (structs, deeper nesting, other encodings
or codecs, a row that spans pages, a page that does not parse) raises ``Unsupported``, and the caller reads the
column with pyarrow: never a guess.
"""
from __future__ import annotations

import io
import struct

import numpy as np

DATA_PAGE, DICTIONARY_PAGE, DATA_PAGE_V2 = 0, 2, 3
PLAIN, PLAIN_DICTIONARY, RLE, RLE_DICTIONARY = 0, 2, 3, 8
STREAMING = {"ZSTD": "zstd", "GZIP": "gzip", "BROTLI": "brotli"}     # pyarrow streams these
WHOLE = {"LZ4_RAW": "lz4_raw"}                   # ...and only decompresses this whole (snappy: _Snappy below)
SKIP_CHUNK = 1 << 20                                                 # bytes discarded at once while skipping
MAX_HEADER = 1 << 20                                                 # a page header is bytes, not megabytes


class Unsupported(Exception):
    """This layout is not read here: read the column with pyarrow instead."""


# --- Thrift compact protocol: only what a PageHeader needs (structs of ints, bools, binaries, lists) -------------
class _Thrift:
    def __init__(self, f) -> None:
        self.f, self.n = f, 0

    def byte(self) -> int:
        b = self.f.read(1)
        if not b:
            raise Unsupported("page header cut short")
        self.n += 1
        if self.n > MAX_HEADER:
            raise Unsupported("page header too long")
        return b[0]

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 70:
                raise Unsupported("bad varint in page header")

    def zigzag(self) -> int:
        v = self.varint()
        return (v >> 1) ^ -(v & 1)

    def value(self, t: int):
        if t in (1, 2):
            return t == 1
        if t == 3:
            return struct.unpack("b", bytes([self.byte()]))[0]
        if t in (4, 5, 6):
            return self.zigzag()
        if t == 7:
            return struct.unpack("<d", bytes(self.byte() for _ in range(8)))[0]
        if t == 8:
            n = self.varint()
            if n > MAX_HEADER:
                raise Unsupported("binary field too long in page header")
            return bytes(self.byte() for _ in range(n))
        if t in (9, 10):
            h = self.byte()
            size, et = h >> 4, h & 0x0F
            if size == 15:
                size = self.varint()
            return [self.byte() == 1 if et in (1, 2) else self.value(et) for _ in range(size)]
        if t == 11:
            size = self.varint()
            if not size:
                return {}
            kv = self.byte()
            return {self.value(kv >> 4): self.value(kv & 0x0F) for _ in range(size)}
        if t == 12:
            return self.struct()
        raise Unsupported(f"thrift type {t} in page header")

    def struct(self) -> dict:
        out, last = {}, 0
        while True:
            h = self.byte()
            if h == 0:
                return out
            delta, t = h >> 4, h & 0x0F
            last = last + delta if delta else self.zigzag()
            out[last] = self.value(t)


# --- page bodies ---------------------------------------------------------------------------------------------------
class _Raw(io.RawIOBase):
    """``n`` bytes of a file from its current position: a page body as the file holds it."""

    def __init__(self, f, n: int) -> None:
        self.f, self.left = f, n

    def readable(self) -> bool:
        return True

    def readinto(self, m) -> int:
        k = min(len(m), self.left)
        data = self.f.read(k) if k else b""
        m[:len(data)] = data
        self.left -= len(data)
        return len(data)

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(min(self.left, n) if n >= 0 else self.left)
        self.left -= len(data)
        return data

    def skip(self, n: int) -> None:
        n = min(n, self.left)
        self.f.seek(n, 1)
        self.left -= n


class _Stream:
    """A page body through a decompressor: ``read`` as a file does, ``skip`` by reading and discarding."""

    def __init__(self, reader) -> None:
        self.r = reader

    def read(self, n: int) -> bytes:
        first = self.r.read(n)            # all of it, unless the stream ends: no second copy of a value
        if len(first) == n or not len(first):
            return bytes(first)
        parts, got = [first], len(first)
        while got < n:
            b = self.r.read(n - got)
            if not len(b):
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    def skip(self, n: int) -> None:
        while n > 0:
            got = len(self.r.read(min(n, SKIP_CHUNK)))
            if not got:
                return
            n -= got


class _Snappy:
    """A raw snappy page decoded as it is read, keeping only the last ``WINDOW`` bytes of output.

    No library streams raw snappy (python-snappy and pyarrow decompress a whole buffer; snappy's framing format is
    another format), yet pyarrow's writer compresses with snappy by default.  The format is small: a varint length,
    then literals and copies of earlier output.  Snappy's compressor works in 64 KiB blocks, so a copy never
    reaches further back than that; a copy that does (another compressor) is ``Unsupported``, and the page goes to
    pyarrow.  Incompressible bytes (a video) are a few literals a block, so walking past them costs little."""

    WINDOW = 1 << 16

    def __init__(self, raw: "_Raw", size: int) -> None:
        self.raw, self.size = raw, size
        self.buf, self.pos, self.made = bytearray(), 0, 0     # output kept, where reading is in it, output so far
        n = shift = 0
        while True:
            b = self._in(1)[0]
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
            if shift > 35:
                raise Unsupported("bad snappy preamble")
        if n != size:
            raise Unsupported(f"snappy page of {n} bytes, its header says {size}")

    def _in(self, n: int) -> bytes:
        data = self.raw.read(n)
        if len(data) != n:
            raise Unsupported("snappy page cut short")
        return data

    def _element(self) -> None:
        tag = self._in(1)[0]
        kind = tag & 3
        if kind == 0:                               # a literal
            n = tag >> 2
            if n >= 60:
                n = int.from_bytes(self._in(n - 59), "little")
            self.buf += self._in(n + 1)
            self.made += n + 1
            return
        if kind == 1:
            n, offset = 4 + ((tag >> 2) & 7), ((tag >> 5) << 8) | self._in(1)[0]
        else:
            n, offset = 1 + (tag >> 2), int.from_bytes(self._in(2 if kind == 2 else 4), "little")
        if not 0 < offset <= len(self.buf):
            raise Unsupported(f"snappy copy {offset} bytes back, beyond the {len(self.buf)} kept")
        start = len(self.buf) - offset
        if n <= offset:
            self.buf += self.buf[start:start + n]
        else:                                       # overlapping: the last `offset` bytes repeat
            pattern = bytes(self.buf[start:])
            self.buf += (pattern * (n // offset + 1))[:n]
        self.made += n

    def _fill(self, n: int) -> None:
        while len(self.buf) - self.pos < n and self.made < self.size:
            self._element()
        if self.made > self.size:
            raise Unsupported("snappy page longer than its header says")

    def _trim(self) -> None:
        if self.pos > 4 * self.WINDOW:              # drop what was read, keeping a window for later copies
            cut = self.pos - self.WINDOW
            del self.buf[:cut]
            self.pos -= cut

    def read(self, n: int) -> bytes:
        self._fill(n)
        with memoryview(self.buf) as view:          # one copy of a value, not two
            out = bytes(view[self.pos:self.pos + n])
        self.pos += len(out)
        self._trim()
        return out

    def skip(self, n: int) -> None:
        while n > 0:
            k = min(n, SKIP_CHUNK)
            self._fill(k)
            k = min(k, len(self.buf) - self.pos)
            if not k:
                return
            self.pos += k
            n -= k
            self._trim()


def _exact(body, n: int) -> bytes:
    data = body.read(n)
    if len(data) != n:
        raise Unsupported("page body shorter than its values")
    return data


def _values_body(f, header: dict, codec: str, *, levels_len: int = 0):
    """The (decompressed) bytes of a page after its first ``levels_len`` bytes (v2: its uncompressed levels)."""
    import pyarrow as pa
    compressed = header[3] - levels_len
    v2 = header.get(8, {})
    if codec == "UNCOMPRESSED" or (header[1] == DATA_PAGE_V2 and v2.get(7) is False):
        return _Raw(f, compressed)
    if codec == "SNAPPY":
        return _Snappy(_Raw(f, compressed), header[2] - levels_len)
    if codec in STREAMING:
        return _Stream(pa.CompressedInputStream(pa.PythonFile(_Raw(f, compressed), mode="r"), STREAMING[codec]))
    if codec in WHOLE:
        data = f.read(compressed)
        out = pa.Codec(WHOLE[codec]).decompress(data, decompressed_size=header[2] - levels_len)
        del data
        return _Stream(pa.BufferReader(out))
    raise Unsupported(f"codec {codec}")


# --- levels and dictionary indices: the RLE / bit-packed hybrid ----------------------------------------------------
def _hybrid(buf: bytes, bit_width: int, count: int) -> np.ndarray:
    runs, pos, n = [], 0, 0
    width = (bit_width + 7) // 8
    while n < count:
        header = shift = 0
        while True:
            if pos >= len(buf):
                raise Unsupported("RLE run cut short")
            b = buf[pos]
            pos += 1
            header |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if header & 1:                      # bit-packed: groups of 8 values, least significant bit first
            nbytes = (header >> 1) * bit_width
            if pos + nbytes > len(buf):
                raise Unsupported("bit-packed run cut short")
            bits = np.unpackbits(np.frombuffer(buf, np.uint8, nbytes, pos), bitorder="little")
            vals = (bits.reshape(-1, bit_width).astype(np.int64) << np.arange(bit_width)).sum(1) if bit_width \
                else np.zeros((header >> 1) * 8, np.int64)
            pos += nbytes
        else:                               # a run of one value
            vals = np.full(header >> 1, int.from_bytes(buf[pos:pos + width], "little"), np.int64)
            pos += width
        runs.append(vals)
        n += len(vals)
    return np.concatenate(runs)[:count] if runs else np.zeros(0, np.int64)


class _Dictionary:
    """A dictionary page read forward from its start, on a file handle of its own: value ``k`` skips from the
    last value read, or starts over for an earlier one (a page decompressed whole is kept, not decompressed
    again)."""

    def __init__(self, path: str, header: dict, offset: int, codec: str) -> None:
        ph = header.get(7, {})
        if ph.get(2, PLAIN) not in (PLAIN, PLAIN_DICTIONARY):
            raise Unsupported("dictionary page encoding")
        self.path, self.header, self.offset, self.codec = path, header, offset, codec
        self.size, self.f, self.body, self.next = ph.get(1, 0), None, None, 0

    def value(self, k: int) -> bytes:
        if not 0 <= k < self.size:
            raise Unsupported(f"dictionary index {k} of {self.size}")
        if self.body is None or k < self.next:
            if self.body is not None and self.codec in WHOLE:
                self.body.r.seek(0)          # decompressed whole already: kept, not decompressed again
            else:
                if self.f is None:
                    self.f = open(self.path, "rb")
                self.f.seek(self.offset)
                self.body = _values_body(self.f, self.header, self.codec)
            self.next = 0
        _skip(self.body, k - self.next)
        self.next = k + 1
        return _value(self.body)

    def close(self) -> None:
        if self.f is not None:
            self.f.close()


class _Page:
    """One data page: where it starts, its slots, and once opened, where each row starts (``starts``), its slots'
    definition levels (None: all present), and the dictionary indices or the body at its next PLAIN value."""

    def __init__(self, header: dict, offset: int) -> None:
        self.header, self.offset = header, offset
        self.v2 = header[1] == DATA_PAGE_V2
        ph = header[8] if self.v2 else header[5]
        self.num_values, self.encoding = ph[1], ph[4 if self.v2 else 2]
        if self.encoding not in (PLAIN, PLAIN_DICTIONARY, RLE_DICTIONARY):
            raise Unsupported(f"page encoding {self.encoding}")
        self.dictionary = self.encoding != PLAIN


class ColumnChunk:
    """The pages of one binary column chunk of one row group: a top-level ``BYTE_ARRAY`` column, or a top-level
    list of them (``list_nulls``: whether the list, and its elements, may be null; Miles' ``"videos": [bytes]``).
    ``cell(r)``: row ``r``'s value (bytes or None; for a list, a list of them, or None).  Only page headers, and
    the levels of the pages before the row's, are read to find its page; within it, one value is kept at a time.
    Reading forward continues where the last read stopped (a DataLoader's order); an earlier row starts its page
    over.  ``close()`` (or ``with``) closes its files."""

    def __init__(self, path: str, metadata, row_group: int, column: int,
                 list_nulls: tuple[int, int] | None = None) -> None:
        col = metadata.schema.column(column)
        self.max_rep, self.max_def = col.max_repetition_level, col.max_definition_level
        if list_nulls is None:
            ok = self.max_rep == 0 and self.max_def <= 1 and "." not in col.path
        else:                               # optional list (+1), its repeated group (+1), optional element (+1)
            ok = self.max_rep == 1 and self.max_def == list_nulls[0] + 1 + list_nulls[1] and col.path.count(".") == 2
        if col.physical_type != "BYTE_ARRAY" or not ok:
            raise Unsupported(f"column {col.path} is neither a flat binary column nor a list of them")
        cc = metadata.row_group(row_group).column(column)
        self.path, self.codec, self.list_nulls = path, cc.compression, list_nulls
        self.num_rows = metadata.row_group(row_group).num_rows
        if self.codec not in ("UNCOMPRESSED", "SNAPPY") and self.codec not in STREAMING and self.codec not in WHOLE:
            raise Unsupported(f"codec {self.codec}")
        starts = [cc.data_page_offset] + ([cc.dictionary_page_offset] if cc.has_dictionary_page and
                                           cc.dictionary_page_offset else [])
        start = min(starts)
        self.f = open(path, "rb")
        self.dictionary = None
        try:
            self.pages, self.dictionary = self._pages(start, start + cc.total_compressed_size)
            # rows a page: its slots, unless values repeat; then its rows start where its repetition levels are 0
            # (v2 headers say how many; a v1 page's levels are read, which come before its values)
            self.firsts = np.cumsum([0] + [self._rows_of(p) for p in self.pages])
        except BaseException:
            self.close()
            raise
        if int(self.firsts[-1]) != self.num_rows:
            self.close()
            raise Unsupported(f"the pages hold {int(self.firsts[-1])} rows, the footer says {self.num_rows}")
        self.page: _Page | None = None       # the page open now

    def _pages(self, start: int, end: int):
        """The data pages and the dictionary (or None) of the chunk, from their headers only (bodies are seeked
        over)."""
        pages, dictionary, pos = [], None, start
        while pos < end:
            self.f.seek(pos)
            t = _Thrift(self.f)
            header = t.struct()
            if not {1, 2, 3} <= set(header) or header[3] < 0 or header[2] < 0:
                raise Unsupported("page header without its sizes")
            body = pos + t.n
            if header[1] == DICTIONARY_PAGE:
                if dictionary is not None or pages:
                    raise Unsupported("a dictionary page that is not the chunk's first")
                dictionary = _Dictionary(self.path, header, body, self.codec)
            elif header[1] in (DATA_PAGE, DATA_PAGE_V2):
                pages.append(_Page(header, body))
            pos = body + header[3]           # an index page holds no values: passed over
        if pos != end:
            raise Unsupported("pages overrun their column chunk")
        if any(p.dictionary for p in pages) and dictionary is None:
            raise Unsupported("dictionary-encoded pages without a dictionary page")
        return pages, dictionary

    def _rows_of(self, page: _Page) -> int:
        if not self.max_rep:
            return page.num_values
        self._open(page)
        return len(page.starts)

    def _open(self, page: _Page) -> None:
        """Read ``page``'s levels (and indices); a PLAIN page's body is left at its first value."""
        h, n, f = page.header, page.num_values, self.f
        rep_width, def_width = int(self.max_rep).bit_length(), int(self.max_def).bit_length()
        f.seek(page.offset)
        if page.v2:
            v2 = h[8]
            rlen, dlen = v2.get(6, 0), v2.get(5, 0)
            reps = _hybrid(_exact(_Raw(f, rlen), rlen), rep_width, n) if self.max_rep else None
            defs = _hybrid(_exact(_Raw(f, dlen), dlen), def_width, n) if self.max_def else None
            body = _values_body(f, h, self.codec, levels_len=rlen + dlen)
        else:
            body = _values_body(f, h, self.codec)
            reps = defs = None
            for name, width, enc in (("reps", rep_width, 4), ("defs", def_width, 3)):
                if not width:
                    continue
                if h[5].get(enc, RLE) != RLE:
                    raise Unsupported("levels not RLE")
                (length,) = struct.unpack("<I", _exact(body, 4))
                levels = _hybrid(_exact(body, length), width, n)
                reps, defs = (levels, defs) if name == "reps" else (reps, levels)
        if reps is not None and n and reps[0] != 0:
            raise Unsupported("a row that starts in an earlier page")
        page.starts = np.arange(n) if reps is None else np.flatnonzero(reps == 0)    # each row's first slot
        present = np.ones(n, bool) if defs is None else defs == self.max_def
        page.defs, page.before = defs, np.cumsum(present) - present      # values before each slot
        page.body, page.done, page.indices = body, 0, None
        if page.dictionary:
            count = int(present.sum())
            bit_width = _exact(body, 1)[0] if count else 0
            if bit_width > 32:
                raise Unsupported("dictionary index width")
            page.indices = _hybrid(body.read(h[2]), bit_width, count)   # a few bits a value
            page.body = None
        self.page = page

    def _slot(self, page: _Page, slot: int):
        """The value of one present slot of the open page."""
        nth = int(page.before[slot])
        if page.dictionary:
            return self.dictionary.value(int(page.indices[nth]))
        if nth < page.done:                  # behind the body: start the page over
            self._open(page)
        _skip(page.body, nth - page.done)
        page.done = nth + 1
        return _value(page.body)

    def cell(self, r: int):
        if not 0 <= r < self.num_rows:
            raise IndexError(f"row {r} of {self.num_rows}")
        i = int(np.searchsorted(self.firsts, r, side="right")) - 1
        page = self.pages[i]
        if self.page is not page:
            self._open(page)
        k = r - int(self.firsts[i])
        first = int(page.starts[k])
        if self.list_nulls is None:
            return None if page.defs is not None and page.defs[first] < self.max_def else self._slot(page, first)
        end = int(page.starts[k + 1]) if k + 1 < len(page.starts) else page.num_values
        list_null, _ = self.list_nulls
        out = []
        for slot in range(first, end):
            level = int(page.defs[slot])
            if level < list_null:            # the list itself is null (one slot)
                return None
            if level == list_null:           # an empty list (one slot)
                return []
            out.append(self._slot(page, slot) if level == self.max_def else None)
        return out

    def close(self) -> None:
        self.f.close()
        if self.dictionary is not None:
            self.dictionary.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _value(body) -> bytes:
    (n,) = struct.unpack("<I", _exact(body, 4))
    return _exact(body, n)


def _skip(body, k: int) -> None:
    for _ in range(k):
        (n,) = struct.unpack("<I", _exact(body, 4))
        body.skip(n)
