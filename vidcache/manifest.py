"""The manifest: what a cache key resolves to (Bazel's ActionResult).  Plain JSON, never pickle.

Frozen dataclasses with ``to_json``/``from_json``.  Field names say where each
value came from, as torchcodec names ``num_frames_from_header``: ``*_from_decoder``
is what the decoder reported (and what sampling used), ``*_from_header`` what the
container declares.  ``check`` recomputes everything that follows from the
shape and the options, so a manifest that disagrees with itself or its blob is
corruption (``CorruptManifestError``), never served.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import platform
import re
import zlib
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit
from dataclasses import dataclass, field
from importlib import metadata as md
from typing import Any

import xxhash

from .digest import Digest
from .errors import CorruptManifestError, InvalidKeyError, OptionsError
from .keys import AC, check_blob, check_key, entry_key
from .loader.record import Built, Sampling, Source
from .families import FAMILIES
from .options import VideoOptions

# 3: sealed (``seal``, an xxh3-128 of every other field), so a flipped byte anywhere, or a manifest pointed
#    at another entry's blob of the same shape, is corruption.
# 2: typed manifest (provenance-carrying field names, aspect distortion).  Still read, unsealed: an
#    upgrade must not quarantine a shared tier whose sources are gone.  Schema 1 is unknown: rebuilt.
SCHEMA = 3
READ_SCHEMAS = (2, 3)


@functools.lru_cache(maxsize=1)
def _versions() -> dict:
    import torch
    out = {"python": platform.python_version()}
    for name in ("torch", "torchvision", "qwen-vl-utils", "decord", "av", "vidcache"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def versions() -> dict:
    """Library versions and CPU capability: provenance, recorded but never part of a key."""
    return dict(_versions())


def grid_thw(options: VideoOptions, num_frames: int, height: int, width: int) -> tuple[int, int, int]:
    fam = FAMILIES[options.family]
    return (-(-num_frames // fam.temporal_patch), height // fam.patch, width // fam.patch)


def pad_tokens(grid: tuple[int, int, int], options: VideoOptions) -> int:
    t, h, w = grid
    merge = FAMILIES[options.family].merge
    return t * h * w // (merge * merge)


# How a blob's frame bytes may be stored (``Frames.encode`` / ``decode``; a cache picks one: CacheConfig.encoding).
ENCODINGS = ("raw", "zlib")


@dataclass(frozen=True)
class Frames:
    """The stored blob: canonical uint8 frames."""
    blob: str                                  # digest of the stored (decoded) bytes
    shape: tuple[int, int, int, int]           # T, C, H, W
    dtype: str = "uint8"
    layout: str = "TCHW"
    encoding: str = "raw"                      # "raw" or "zlib"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape)

    # The one codec of a stored blob: ``encoding`` says how its frame bytes are kept (zlib level 1: a read is
    # decompression-bound, and level 1 keeps most of the size gain).
    def encode(self, raw) -> bytes | memoryview:
        """The value stored for frame bytes ``raw`` (as they are, or compressed)."""
        return raw if self.encoding == "raw" else zlib.compress(raw, 1)

    def decode(self, value) -> bytes | memoryview:
        """The frame bytes of a stored value (``zlib.error`` when a zlib value is damaged)."""
        return decode_frames(value, self.encoding)


def decode_frames(value, encoding: str) -> bytes | memoryview:
    """The frame bytes of a value stored in ``encoding`` (``FrameRecord``'s codec; ``zlib.error`` when damaged)."""
    return value if encoding == "raw" else zlib.decompress(value)


@dataclass(frozen=True)
class Tokens:
    video_grid_thw: tuple[int, int, int]
    video_pad_tokens: int


@dataclass(frozen=True)
class Manifest:
    key: str
    source_digest: str
    options: dict                              # the resolved options record
    options_digest: str
    frames: Frames
    source: Source
    sampling: Sampling
    tokens: Tokens
    aspect_distortion: float                   # stored W/H over source W/H (loader.resize.aspect_distortion)
    provenance: dict = field(default_factory=dict, compare=False)   # recorded, never keyed
    schema: int = SCHEMA

    # --- derived ----------------------------------------------------------------
    @property
    def family(self) -> str:
        return self.options["family"]

    @property
    def num_frames(self) -> int:
        return self.frames.shape[0]

    @property
    def height(self) -> int:
        return self.frames.shape[2]

    @property
    def width(self) -> int:
        return self.frames.shape[3]

    def video_options(self) -> VideoOptions:
        return VideoOptions.from_dict(self.options)

    def metadata(self) -> dict:
        """The flat summary handles expose (``VideoHandle.metadata``)."""
        return {
            "key": self.key, "family": self.family,
            "fps": self.source.average_fps_from_decoder, "fps_from_header": self.source.fps_from_header,
            "total_num_frames": self.sampling.total_num_frames, "frame_indices": list(self.sampling.frame_indices),
            "sample_fps": self.sampling.sample_fps,
            "num_frames": self.num_frames, "height": self.height, "width": self.width,
            "video_grid_thw": list(self.tokens.video_grid_thw), "video_pad_tokens": self.tokens.video_pad_tokens,
            "aspect_distortion": self.aspect_distortion,
        }

    # --- JSON -----------------------------------------------------------------------
    def to_json(self) -> bytes:
        d = dataclasses.asdict(self)
        if self.schema >= 3:
            d["seal"] = _seal(d)
        return _canonical(d)

    @classmethod
    def from_json(cls, raw: bytes | memoryview, key: str | None = None) -> "Manifest":
        """Parse and ``check`` a manifest; anything else is ``CorruptManifestError`` naming the key."""
        where = f"manifest {key}" if key else "manifest"
        try:
            d = json.loads(bytes(raw))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CorruptManifestError(f"{where} is not JSON: {e}") from None
        if not isinstance(d, dict):
            raise CorruptManifestError(f"{where} is not a JSON object")
        schema = d.get("schema")
        if schema not in READ_SCHEMAS or isinstance(schema, bool):
            raise CorruptManifestError(f"{where} has schema {schema!r}, this vidcache reads {READ_SCHEMAS} "
                                       "(rebuild it: `vidcache prewarm` or `vidcache verify --repair`)")
        seal = d.pop("seal", None)
        try:
            m = cls(key=d["key"], source_digest=d["source_digest"], options=dict(d["options"]),
                    options_digest=d["options_digest"],
                    frames=Frames(**{**d["frames"], "shape": tuple(d["frames"]["shape"])}),
                    source=Source(**d["source"]),
                    sampling=Sampling(**{**d["sampling"], "frame_indices": tuple(d["sampling"]["frame_indices"])}),
                    tokens=Tokens(**{**d["tokens"], "video_grid_thw": tuple(d["tokens"]["video_grid_thw"])}),
                    aspect_distortion=float(d["aspect_distortion"]), provenance=dict(d.get("provenance") or {}),
                    schema=schema)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptManifestError(f"{where} does not have the schema-{SCHEMA} fields: "
                                       f"{type(e).__name__}: {e}") from None
        if key is not None and m.key != key:
            raise CorruptManifestError(f"manifest stored under {key} names key {m.key}")
        m.check()                                # the specific reasons first, then the seal for the rest
        if schema >= 3 and seal != _seal(d):
            raise CorruptManifestError(f"{where} does not match its seal (a changed byte: never served)")
        if schema < 3 and seal is not None:      # schema 2 never had a seal: a flipped schema number
            raise CorruptManifestError(f"{where} says schema {schema} but carries a seal")
        return m

    def check(self) -> None:
        """Everything that follows from the options and the shape must agree (no blob read)."""
        def bad(why: str):
            return CorruptManifestError(f"manifest {self.key}: {why}")
        try:
            check_key(self.key)
            blob = Digest.parse(check_blob(self.frames.blob))
            opts = VideoOptions.from_dict(self.options)
        except (InvalidKeyError, OptionsError, ValueError, TypeError) as e:
            raise bad(str(e)) from None
        if self.options != opts.resolved().to_dict() or self.options_digest != opts.digest:
            raise bad("options record or digest does not match the options")
        if not self.key.endswith("." + self.options_digest):
            raise bad("key does not end with the options digest")
        h, size, _ = self.key.split(".")
        if self.source_digest != str(Digest(h, int(size))):
            raise bad("key does not start with the source digest")
        shape = self.frames.shape
        if len(shape) != 4 or any(not isinstance(x, int) or x <= 0 for x in shape) or shape[1] != 3:
            raise bad(f"frames shape {shape} is not T x 3 x H x W")
        if (self.frames.dtype, self.frames.layout) != ("uint8", "TCHW") or self.frames.encoding not in ENCODINGS:
            raise bad("frames are not uint8 TCHW raw/zlib")
        if blob.size_bytes != self.frames.nbytes:
            raise bad(f"blob holds {blob.size_bytes} bytes, shape {shape} needs {self.frames.nbytes}")
        t, _, hh, ww = shape
        grid = opts.resolved().size_factor
        if hh % grid or ww % grid:
            raise bad(f"{ww}x{hh} frames are not on the {grid}-pixel grid of these options")
        if len(self.sampling.frame_indices) != t:
            raise bad(f"{len(self.sampling.frame_indices)} frame indices for {t} frames")
        self._check_timing(bad)
        g = grid_thw(opts, t, hh, ww)
        if tuple(self.tokens.video_grid_thw) != g or self.tokens.video_pad_tokens != pad_tokens(g, opts):
            raise bad(f"token counts {self.tokens} do not follow from the shape (grid {g}, {pad_tokens(g, opts)} pads)")


    def _check_timing(self, bad) -> None:
        """The timing fields feed ``second_per_grid_ts`` and Qwen3's timestamps: they must agree with each
        other as qwen-vl-utils' sampling makes them (``loader.sample``), not only parse."""
        s, src = self.sampling, self.source
        n, fps = src.num_frames_from_decoder, src.average_fps_from_decoder
        idx = s.frame_indices
        if not (isinstance(n, int) and n > 0 and isinstance(fps, (int, float)) and not isinstance(fps, bool) and math.isfinite(fps) and fps > 0):
            raise bad(f"source frame count {n!r} / fps {fps!r} are not a positive count and rate")
        if any(not isinstance(i, int) or isinstance(i, bool) for i in idx) or list(idx) != sorted(idx) \
                or idx[0] < 0 or idx[-1] >= n:
            raise bad(f"frame indices are not ascending indices into the {n}-frame stream")
        if not (isinstance(s.total_num_frames, int) and 0 < s.total_num_frames <= n):
            raise bad(f"{s.total_num_frames!r} frames in range, but the stream has {n}")
        if s.sample_fps != len(idx) / max(s.total_num_frames, 1e-6) * fps:   # loader.sample's own arithmetic
            raise bad(f"sample_fps {s.sample_fps!r} does not follow from {len(idx)} frames of "
                      f"{s.total_num_frames} at {fps} fps")
        if not (isinstance(self.aspect_distortion, (int, float)) and math.isfinite(self.aspect_distortion)
                and self.aspect_distortion > 0):
            raise bad(f"aspect distortion {self.aspect_distortion!r} is not a positive ratio")


def _canonical(d: dict) -> bytes:
    return json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def _seal(d: dict) -> str:
    """xxh3-128 of the canonical JSON of every field but the seal itself."""
    return xxhash.xxh3_128_hexdigest(_canonical({k: v for k, v in d.items() if k != "seal"}))


# --- source records (``src/``): source -> content digest -----------------------------------------
# Query parameters that carry credentials (presigned S3/GCS/Azure URLs, tokens): recorded as "REDACTED".
_SECRET_PARAMS = re.compile(r"(?i)^(x-amz-(signature|credential|security-token)|x-goog-(signature|credential)|"
                            r"sig|signature|token|access_token|api_key|apikey|key|password|secret|"
                            r"awsaccesskeyid|se|sp|sv)$")


def redact_source(source: str) -> str:
    """``source`` as recorded in the shared tier: without userinfo or credential-bearing query values.
    Every node can read ``src/`` records, so no password or signature goes in."""
    try:
        u = urlsplit(source)
    except ValueError:
        return source
    if not u.scheme or u.scheme == "file" or (u.username is None and u.password is None and not u.query):
        return source
    netloc = u.netloc.rpartition("@")[2]
    query = u.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(_SECRET_PARAMS.match(k) for k, _ in pairs):
            query = urlencode([(k, "REDACTED" if _SECRET_PARAMS.match(k) else v) for k, v in pairs])
    return urlunsplit((u.scheme, netloc, u.path, query, u.fragment))


@dataclass(frozen=True)
class SourceRecord:
    """``src/<id>``: what ``source`` (redacted) hashed to, valid while its validators (``fingerprint``:
    size + ETag, or size + mtime + inode) still match.  A hint, never trusted past its validators."""
    source: str
    fingerprint: dict
    digest: Digest

    @classmethod
    def of(cls, source: str, fingerprint: dict, digest: Digest) -> "SourceRecord":
        return cls(redact_source(source), fingerprint, digest)

    def to_json(self) -> bytes:
        return _canonical({"source": self.source, "fingerprint": self.fingerprint, "digest": str(self.digest)})

    @classmethod
    def from_json(cls, raw) -> "SourceRecord | None":
        """The record, or None when it is damaged (a damaged hint is a miss: the source is hashed again)."""
        try:
            d = json.loads(bytes(raw))
            if not isinstance(d.get("source"), str) or not isinstance(d.get("fingerprint"), dict):
                return None
            return cls(d["source"], d["fingerprint"], Digest.parse(d["digest"]))
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            return None

    def matches(self, source: str, fingerprint: dict | None) -> bool:
        return fingerprint is not None and self.source == redact_source(source) and self.fingerprint == fingerprint


def blob_of(raw) -> str | None:
    """The blob a manifest's bytes name, read leniently: for quarantined, unsealed or older manifests too,
    where only the name matters (which entries share a blob).  None when there is none to read."""
    try:
        return json.loads(bytes(raw))["frames"]["blob"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return None


def blob_users(tier) -> dict[str, list[str]]:
    """Blob digest -> the entries of ``tier`` (a store) whose manifests name it: the same frames under other
    options share one blob, so deleting a blob is for its last user only (``evict``, ``upgrade``)."""
    users: dict[str, list[str]] = {}
    for k in tier.keys(AC):
        if (b := blob_of(tier.get(k))) is not None:
            users.setdefault(b, []).append(entry_key(k))
    return users


def options_of(raw) -> dict | None:
    """The options record a manifest's bytes name, read leniently (a quarantined manifest still says what it
    was built with); None when there is none to read."""
    try:
        d = json.loads(bytes(raw))["options"]
    except (ValueError, TypeError, KeyError, UnicodeDecodeError):
        return None
    return d if isinstance(d, dict) else None


def build_manifest(key: str, source_digest: Digest, options: VideoOptions, blob: Digest, shape: tuple,
                   encoding: str, built: Built, provenance: dict[str, Any]) -> Manifest:
    """A manifest from ``decode_sample_resize``'s :class:`Built` record."""
    t, _, h, w = shape
    grid = grid_thw(options, t, h, w)
    return Manifest(
        key=key, source_digest=str(source_digest), options=options.resolved().to_dict(),
        options_digest=options.digest,
        frames=Frames(str(blob), tuple(int(x) for x in shape), encoding=encoding),
        source=built.source, sampling=built.sampling,
        tokens=Tokens(grid, pad_tokens(grid, options)),
        aspect_distortion=built.aspect_distortion,
        provenance={**built.provenance, **versions(), **provenance},
    )
