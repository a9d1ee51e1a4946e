"""Precomputed vision embeddings on the rollout side: which record serves which video, in the layout engines take,
checked before anything is served.  Engine-neutral: SGLang's plugin (``vidcache.sglang.plugin``) and vLLM's request
builder (``vidcache.vllm.request``) both go through it.

A record (``vidcache.embeddings.VisionEmbeddings``) is found by its full :class:`~vidcache.embeddings.EmbeddingKey`:
the entry's key plus the *tower* (weights digest, dtype, code).  The trainer names its tower (:class:`Tower`); a
record computed for any other key is refused (``EmbeddingsMismatchError``), never served: a fine-tuned tower, another
dtype or another implementation never feeds the decoder stale rows.

Both engines take a Qwen-VL video's embeddings as their vision tower outputs them: ``[merged tokens, hidden]`` for
Qwen2.5-VL, and for Qwen3-VL the main rows and every deepstack level side by side,
``[merged tokens, hidden * (1 + levels)]`` (SGLang 0.5.23 ``srt/models/qwen3_vl.py:1414-1422`` splits them at
``hidden``; vLLM 0.34 ``model_executor/models/qwen3_vl.py:903``).  :func:`decoder_rows` builds that.

Where a server resolves references itself (SGLang's plugin) it reads records through :func:`server_lookup`:
``$VIDCACHE_EMBEDDINGS_LOOKUP`` (``module:callable``, a ``lookup(EmbeddingKey) -> VisionEmbeddings``, e.g. the
embedding tier's) or ``$VIDCACHE_EMBEDDINGS_DIR`` (a directory of ``<key.id>.safetensors`` records,
:class:`DirectoryLookup`).
"""
from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass

from ..errors import ConfigError, CorruptEntryError, NotCachedError
from ..families import FAMILIES

LOOKUP_ENV = "VIDCACHE_EMBEDDINGS_LOOKUP"
DIR_ENV = "VIDCACHE_EMBEDDINGS_DIR"


class EmbeddingsMismatchError(CorruptEntryError):
    """A record that does not belong where it was asked for (another key, grid or row count): never served."""
    kind = "embeddings_mismatch"


@dataclass(frozen=True)
class Tower:
    """What, beside the entry, determines a video's embeddings: the tower's loaded weights' digest
    (``vidcache.embeddings.weights_digest``), the dtype it ran in and its code identity (``EmbeddingKey``'s fields)."""
    weights: str
    dtype: str
    code: str

    def key(self, entry: str):
        from ..embeddings import EmbeddingKey
        return EmbeddingKey(entry, self.weights, self.dtype, self.code)

    def as_dict(self) -> dict:
        return {"weights": self.weights, "dtype": self.dtype, "code": self.code}

    @classmethod
    def of(cls, key) -> "Tower":
        return cls(key.weights, key.dtype, key.code)


def records_for(keys: list[str], embeddings, tower: Tower | None = None) -> list:
    """One record per entry key, in order.  ``embeddings``: the records themselves (one per key), or a
    ``lookup(EmbeddingKey)`` callable (then ``tower`` names the key's other fields).  A record for another entry, or
    for another tower than ``tower``, raises ``EmbeddingsMismatchError``."""
    if callable(embeddings):
        if tower is None:
            raise ValueError("embeddings is a lookup: pass tower=Tower(weights, dtype, code) to name the keys")
        records = [checked(embeddings(tower.key(k)), tower.key(k)) for k in keys]
    else:
        records = list(embeddings)
        if len(records) != len(keys):
            raise ValueError(f"{len(records)} embeddings records for {len(keys)} videos")
        for k, rec in zip(keys, records):
            checked(rec, tower.key(k) if tower is not None else None, entry=k)
    return records


def checked(rec, expect=None, entry: str | None = None):
    """``rec`` if it was computed for ``expect`` (an ``EmbeddingKey``) / for the entry ``entry``; else refused."""
    from ..embeddings import VisionEmbeddings
    if not isinstance(rec, VisionEmbeddings):
        raise TypeError(f"expected a VisionEmbeddings record, got {type(rec).__name__}")
    if expect is not None and rec.key != expect:
        raise EmbeddingsMismatchError(f"embeddings record for {rec.key.as_dict()} was given for "
                                      f"{expect.as_dict()}: another tower's (or entry's) embeddings are never served")
    if entry is not None and rec.key.entry != entry:
        raise EmbeddingsMismatchError(f"embeddings record for entry {rec.key.entry} was given for entry {entry}")
    return rec


def decoder_rows(rec):
    """The record's rows as the engines' towers output them (module docstring): main rows, then each deepstack
    level's, side by side.  Whether the decoder takes deepstack levels (Qwen3-VL does, Qwen2.5-VL and Qwen3.5 do
    not) is the model's, not the family's: the record holds the levels its tower computed for that decoder
    (``embeddings.compute``), and a server refuses rows whose width is not its decoder's (``decoder_width``)."""
    import torch
    rows = rec.embeds.shape[0]
    if any(d.shape[0] != rows for d in rec.deepstack):
        raise EmbeddingsMismatchError(f"embeddings record {rec.key.as_dict()}: deepstack rows differ from its embeds'")
    return torch.cat([rec.embeds, *rec.deepstack], dim=-1) if rec.deepstack else rec.embeds


def decoder_width(config) -> int:
    """The width a model's decoder takes precomputed rows at (its tower's output): the text hidden size times
    (1 + Qwen3-VL's deepstack levels), from the checkpoint's config."""
    text = getattr(config, "text_config", config)
    levels = len(getattr(getattr(config, "vision_config", None), "deepstack_visual_indexes", None) or ())
    return int(text.hidden_size) * (1 + levels)


def check_grid(rec, grid_thw, family: str) -> None:
    """The record's grid must be the video's (the processor's ``video_grid_thw`` row) and its rows the grid's merged
    tokens: rows for another sampling or size would be scattered into the wrong placeholders."""
    grid = tuple(int(v) for v in grid_thw)
    if tuple(rec.grid_thw) != grid:
        raise EmbeddingsMismatchError(f"embeddings record {rec.key.entry} has grid {list(rec.grid_thw)}, the video "
                                      f"{list(grid)}")
    t, h, w = grid
    merge = FAMILIES[family].merge
    want = t * h * w // (merge * merge)
    if rec.embeds.shape[0] != want:
        raise EmbeddingsMismatchError(f"embeddings record {rec.key.entry} has {rec.embeds.shape[0]} rows, its grid "
                                      f"{list(grid)} has {want} tokens")


def embeddings_digest(rows) -> str:
    """The attestation's digest of what the decoder gets (``decoder_rows``): dtype, shape, bytes."""
    from ..attest import tensor_digest
    return tensor_digest(rows)


class DirectoryLookup:
    """``lookup(EmbeddingKey)`` over a directory of records named ``<key.id>.safetensors``: for tests and a
    single node; the embedding tier provides the real one.  Bytes are parsed by ``VisionEmbeddings.from_bytes``
    (safetensors, never pickle) and must carry the key asked for."""

    def __init__(self, root):
        self.root = os.fspath(root)

    def path(self, key) -> str:
        return os.path.join(self.root, key.id + ".safetensors")

    def put(self, rec, key=None) -> str:
        """Write ``rec`` under ``key`` (default: its own key; another key is how a test plants a wrong record)."""
        os.makedirs(self.root, exist_ok=True)
        path = self.path(key or rec.key)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(rec.to_bytes())
        os.replace(tmp, path)            # never a partial record visible
        return path

    def __call__(self, key):
        from ..embeddings import VisionEmbeddings
        try:
            with open(self.path(key), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            raise NotCachedError(f"no embeddings for {key.as_dict()} in {self.root}") from None
        try:
            return VisionEmbeddings.from_bytes(raw, expect=key)
        except CorruptEntryError as e:
            raise EmbeddingsMismatchError(str(e)) from None


@functools.lru_cache(maxsize=1)
def _lookup_from(spec: str | None, root: str | None):
    if spec:
        mod, _, name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError) as e:
            raise ConfigError(f"${LOOKUP_ENV}={spec!r} does not name an importable module:callable ({e})") from None
        return fn
    if root:
        return DirectoryLookup(root)
    raise ConfigError(f"this server has no embeddings lookup: set ${LOOKUP_ENV} (module:callable) or ${DIR_ENV}")


def server_lookup():
    """The lookup a server resolves embedding references with (module docstring); ``ConfigError`` when none is set."""
    return _lookup_from(os.environ.get(LOOKUP_ENV) or None, os.environ.get(DIR_ENV) or None)
