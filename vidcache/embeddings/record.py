"""What one entry's vision embeddings are, what determines them, and their bytes.

An embedding is a pure function of (the entry's frames and processor settings: the entry key; the tower's
weights; the dtype it ran in; the tower's code).  :class:`EmbeddingKey` names all four, so a read can never
return embeddings that another tower, dtype or implementation computed.

Bytes are safetensors (a header of JSON and raw little-endian tensors): no pickle, so bytes from the cache or
the network are never executed.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import xxhash

from ..errors import CorruptEntryError
from ..keys import check_key

FORMAT = "vidcache-embeddings/1"


def weights_digest(state_dict) -> str:
    """xxh3-128 over the tower's *loaded* tensors (names, dtypes, shapes, bytes), in name order.

    Not a path, a hub id or a config: two checkpoints with one name but other weights differ here, and a
    tower that has been trained since it was loaded differs too.
    """
    import torch

    h = xxhash.xxh3_128()
    for name in sorted(state_dict):
        t = state_dict[name].detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


@dataclass(frozen=True)
class EmbeddingKey:
    entry: str          # the frames' cache key (source digest + options digest)
    weights: str        # weights_digest of the vision tower as loaded
    dtype: str          # the dtype the tower ran in, e.g. "bfloat16"
    code: str           # the tower's implementation: "<family>:<module>.<class>@<library version>"

    def __post_init__(self):
        check_key(self.entry)

    @property
    def id(self) -> str:
        """The store name: the entry key, then a digest of everything else (hex only, fixed length)."""
        rest = xxhash.xxh3_128(f"{self.weights}|{self.dtype}|{self.code}".encode()).hexdigest()
        return f"{self.entry}.{rest}"

    def as_dict(self) -> dict:
        return {"entry": self.entry, "weights": self.weights, "dtype": self.dtype, "code": self.code}


@dataclass(frozen=True)
class VisionEmbeddings:
    """One entry's tower output: what the decoder consumes in place of ``pixel_values_videos``.

    ``embeds``: ``[merged tokens, hidden]``, one row per video pad token, in the order the decoder scatters them.
    ``deepstack``: Qwen3-VL's per-layer features (same rows), empty for families without them.
    """
    key: EmbeddingKey
    grid_thw: tuple[int, int, int]
    embeds: "object"                    # torch.Tensor
    deepstack: tuple = ()

    def to_bytes(self) -> bytes:
        from safetensors.torch import save

        tensors = {"embeds": self.embeds.detach().to("cpu").contiguous()}
        for i, t in enumerate(self.deepstack):
            tensors[f"deepstack.{i}"] = t.detach().to("cpu").contiguous()
        meta = {"format": FORMAT, "key": json.dumps(self.key.as_dict(), sort_keys=True),
                "grid_thw": json.dumps(list(self.grid_thw)), "deepstack": str(len(self.deepstack))}
        return save(tensors, metadata=meta)

    @classmethod
    def from_bytes(cls, raw, expect: EmbeddingKey | None = None) -> "VisionEmbeddings":
        """Parse ``raw`` (bytes, or a view valid only for this call: a memory map's); refuse bytes that are not
        ours or that another key computed (``CorruptEntryError``).  Each tensor is copied once, from ``raw`` into
        memory of its own; safetensors' ``load`` takes ``bytes`` and copies twice more (a 64 MB Qwen3-VL record:
        89.7 -> 8.8 ms on the dev VM, warm: benchmarks/embeddings.py)."""
        try:
            header, body = _header(raw)
            meta = header.pop("__metadata__", None) or {}
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}")
            key = EmbeddingKey(**json.loads(meta["key"]))
            grid = tuple(int(v) for v in json.loads(meta["grid_thw"]))
            n = int(meta["deepstack"])
            names = ["embeds", *(f"deepstack.{i}" for i in range(n))]
            tensors = {name: _tensor(name, header[name], body) for name in names}
            out = cls(key, grid, tensors["embeds"], tuple(tensors[f"deepstack.{i}"] for i in range(n)))
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptEntryError(f"embeddings record is not readable: {exc}") from None
        if expect is not None and key != expect:
            raise CorruptEntryError(f"embeddings record was computed for {key.as_dict()}, not {expect.as_dict()}")
        return out


# safetensors' dtype names for the dtypes a tower runs in (what ``to_bytes`` writes); any other is refused.
_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


def _header(raw) -> tuple[dict, memoryview]:
    # safetensors: 8-byte little-endian header length, a JSON header ({name: {dtype, shape, data_offsets}} and
    # "__metadata__": our strings), then the tensors' bytes, which the offsets index.
    mv = memoryview(raw).cast("B")
    n = int.from_bytes(bytes(mv[:8]), "little")
    if len(mv) < 8 or n <= 0 or n > len(mv) - 8:
        raise ValueError("header length out of range")
    header = json.loads(bytes(mv[8:8 + n]))
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    return header, mv[8 + n:]


def _tensor(name: str, info: dict, body: memoryview):
    import numpy as np
    import torch

    dtype = getattr(torch, _DTYPES[info["dtype"]])
    shape = [int(d) for d in info["shape"]]
    start, end = (int(o) for o in info["data_offsets"])
    size = math.prod(shape) * dtype.itemsize
    if not 0 <= start <= end <= len(body) or end - start != size or any(d < 0 for d in shape):
        raise ValueError(f"tensor {name}: offsets {start}..{end} do not hold {shape} {dtype} in {len(body)} bytes")
    out = torch.empty(size, dtype=torch.uint8)
    out.numpy()[:] = np.frombuffer(body[start:end], np.uint8)       # the one copy
    return out.view(dtype).reshape(shape)


def _metadata(raw) -> dict:
    return _header(raw)[0].get("__metadata__") or {}


# --- the stored form: the record's bytes behind their own digest -----------------------------------------------
# A frame blob is named by its digest (``cas/<digest>``); an embedding record is named by what computed it
# (``emb/<id>``), so its digest travels in front of it, checked on every read as a blob's is: one line
# ``vidcache-emb/1 <digest>\n``, then the safetensors bytes.
SEAL = b"vidcache-emb/1 "


def seal(raw: bytes) -> bytes:
    """``raw`` (``VisionEmbeddings.to_bytes``) as a tier stores it: its digest first."""
    from ..digest import Digest
    return SEAL + str(Digest.of(raw)).encode() + b"\n" + bytes(raw)


def unseal(value) -> memoryview:
    """The record's bytes from a stored value; ``DigestMismatchError`` unless they hash to the digest in front."""
    from ..digest import Digest
    from ..errors import DigestMismatchError
    mv = memoryview(value).cast("B")
    head = bytes(mv[:len(SEAL) + 80])
    end = head.find(b"\n")
    if not head.startswith(SEAL) or end < 0:
        raise DigestMismatchError("embeddings object has no digest line (not written by vidcache's tier)")
    try:
        want = Digest.parse(head[len(SEAL):end].decode())
    except (ValueError, UnicodeDecodeError):
        raise DigestMismatchError("embeddings object's digest line is damaged") from None
    body = mv[end + 1:]
    if (got := Digest.of(body)) != want:
        raise DigestMismatchError(f"embeddings object hashes to {got}, its digest line says {want}")
    return body


def claimed_id(raw) -> str:
    """The ``EmbeddingKey.id`` a record's bytes say they were computed for (from the header alone)."""
    try:
        return EmbeddingKey(**json.loads(_metadata(raw)["key"])).id
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptEntryError(f"embeddings record is not readable: {exc}") from None
