"""``VideoCache``: resolve (source, options) to cached canonical frames, building on a miss."""
from __future__ import annotations

import contextlib
import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import xxhash

from . import manifest as mf
from .digest import Digest
from .errors import NotCachedError, StoreError
from .loader.build import DEFAULT_MAX_DECODED_BYTES, decode_sample_resize
from .loader.fetch import FetchLimits, fetch, fingerprint
from .loader.frozen import DEFAULT_FORMAT, FORMATS, verify_frozen, write_frozen
from .options import VideoOptions
from .store.base import Store
from .store.lmdb import LMDBStore

ENCODINGS = ("raw", "zlib")


def default_cache_dir() -> str:
    return os.environ.get("VIDCACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "vidcache")


def cache_key(source_digest: Digest, options: VideoOptions) -> str:
    """The action key: content digest plus options digest.  Workers, paths and URLs never enter it."""
    return f"{source_digest.hash}.{source_digest.size_bytes}.{options.digest}"


def _source_record_key(source: str) -> str:
    return "src/" + xxhash.xxh3_128_hexdigest(source.encode())


@dataclass(frozen=True)
class EnsureResult:
    key: str
    status: str          # "hit" or "new"
    frame_bytes: int


class VideoCache:
    """A cache directory: an LMDB store of frames and manifests, plus frozen files."""

    def __init__(self, path: str | os.PathLike | None = None, *, store: Store | None = None,
                 shared: str | None = None, shared_storage_options: dict | None = None,
                 decoder: str = "decord", limits: FetchLimits | None = None, encoding: str = "raw",
                 max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES, frozen_format: str = DEFAULT_FORMAT,
                 decoder_threads: int = 0, read_only: bool = False) -> None:
        """``path``: the node-local cache directory (LMDB, frozen files).  ``shared``: an optional
        fsspec URL (NFS path, ``s3://...``) of the shared tier, recorded in ``path/config.json`` so
        handles opened elsewhere in this node find it.  Credentials are never recorded."""
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {ENCODINGS}")
        if frozen_format not in FORMATS:
            raise ValueError(f"frozen_format must be one of {sorted(FORMATS)}")
        self.frozen_format = frozen_format   # not part of the key: every format holds the same frames
        self.decoder_threads = decoder_threads  # 0: FFmpeg's choice; prewarm splits the cores among workers
        self.path = str(Path(path if path is not None else default_cache_dir()).expanduser().absolute())
        config = _read_config(self.path)
        if shared is not None and not read_only:
            config = {"shared": shared, "shared_storage_options": shared_storage_options or {}}
            _write_config(self.path, config)
        if store is None:
            store = LMDBStore(os.path.join(self.path, "lmdb"), read_only=read_only)
            if config.get("shared"):
                from .store.fsspec_cas import FsspecStore
                from .store.tiered import TieredStore
                opts = {**config.get("shared_storage_options", {}), **(shared_storage_options or {})}
                store = TieredStore(store, FsspecStore(config["shared"], storage_options=opts), read_only=read_only)
        self.store = store
        self.decoder = decoder
        self.limits = limits or FetchLimits()
        self.encoding = encoding
        self.max_decoded_bytes = max_decoded_bytes
        self.frozen_dir = os.path.join(self.path, "frozen")
        self.tmp_dir = os.path.join(self.path, "tmp")
        self._manifests: dict[str, dict] = {}

    def __repr__(self) -> str:
        return f"VideoCache({self.path!r})"

    def close(self) -> None:
        self.store.close()

    # --- identity -----------------------------------------------------------
    def known_digest(self, source: str) -> Digest | None:
        """The digest recorded for ``source`` if its validators still match; never downloads."""
        return self._recorded_digest(source, fingerprint(source, self.limits))

    def _recorded_digest(self, source: str, fp: dict | None) -> Digest | None:
        if fp is None:
            return None
        raw = self.store.get(_source_record_key(source))
        if raw is None:
            return None
        rec = json.loads(raw)
        if rec.get("source") != source or rec.get("fingerprint") != fp:
            return None
        return Digest.parse(rec["digest"])

    def lookup(self, source: str, options: VideoOptions) -> str | None:
        """The key of a present entry for (source, options), without fetching; None when unknown."""
        d = self.known_digest(source)
        if d is None:
            return None
        key = cache_key(d, options)
        return key if self.contains([key])[0] else None

    def contains(self, keys: list[str]) -> list[bool]:
        return self.store.exists_many(["ac/" + k for k in keys])

    # --- build --------------------------------------------------------------
    def ensure(self, source: str, options: VideoOptions) -> EnsureResult:
        """Make sure (source, options) is cached; fetch, decode and write it on a miss."""
        fp = fingerprint(source, self.limits)      # one stat / HEAD, reused for the record below
        d = self._recorded_digest(source, fp)
        if d is not None:
            key = cache_key(d, options)
            m = self.manifest(key)
            if m is not None:
                return EnsureResult(key, "hit", int(np.prod(m["frames"]["shape"])))
        os.makedirs(self.tmp_dir, exist_ok=True)
        fetched = fetch(source, self.limits, tmp_dir=self.tmp_dir)
        try:
            key = cache_key(fetched.digest, options)
            record = {}
            if fp is not None:
                record[_source_record_key(source)] = json.dumps(
                    {"source": source, "fingerprint": fp, "digest": str(fetched.digest)}).encode()
            m = self.manifest(key)
            if m is not None:
                if record:
                    self.store.set_many(record)
                return EnsureResult(key, "hit", int(np.prod(m["frames"]["shape"])))
            frames, built = decode_sample_resize(fetched.path, options, self.decoder, self.max_decoded_bytes,
                                                 self.decoder_threads)
        finally:
            fetched.cleanup()
        raw = frames.numpy().tobytes()
        blob = Digest.of(raw)
        payload = raw if self.encoding == "raw" else zlib.compress(raw, 1)
        man = mf.build_manifest(key, str(fetched.digest), options, str(blob), list(frames.shape),
                                self.encoding, built)
        man["provenance"]["created_unix"] = round(time.time(), 3)
        # Blob first, manifest last, in one transaction where the store allows.
        self.store.set_many({"cas/" + str(blob): payload, "ac/" + key: mf.dumps(man), **record})
        return EnsureResult(key, "new", len(raw))

    def get(self, source: str, options: VideoOptions):
        """A handle to (source, options), processing the video first on a miss."""
        from .loader.handle import VideoHandle
        res = self.ensure(source, options)
        return VideoHandle(source, options, self.path, key=res.key)

    def handle(self, source: str, options: VideoOptions):
        """A lazy handle: nothing is fetched or decoded until it is used."""
        from .loader.handle import VideoHandle
        return VideoHandle(source, options, self.path)

    # --- read ---------------------------------------------------------------
    def manifest(self, key: str) -> dict | None:
        m = self._manifests.get(key)          # immutable under a key, so safe to keep
        if m is None:
            raw = self.store.get("ac/" + key)
            if raw is None:
                return None
            m = mf.loads(raw)
            if len(self._manifests) > 4096:
                self._manifests.clear()
            self._manifests[key] = m
        return m

    def require_manifest(self, key: str) -> dict:
        m = self.manifest(key)
        if m is None:
            raise NotCachedError(f"no entry {key} in {self.path}")
        return m

    @contextlib.contextmanager
    def _blob(self, key: str, fr: dict):
        """The frame bytes named by a manifest's ``frames`` record, checked for presence and size."""
        size = Digest.parse(fr["blob"]).size_bytes
        with self.store.read("cas/" + fr["blob"]) as view:
            if view is None:
                raise StoreError(f"manifest {key} names blob {fr['blob']} that is missing")
            src = zlib.decompress(view) if fr["encoding"] == "zlib" else view
            if len(src) != size:
                raise StoreError(f"blob {fr['blob']} has {len(src)} bytes, expected {size}")
            yield src

    @contextlib.contextmanager
    def read_frames(self, key: str):
        """Zero-copy: a read-only uint8 TCHW numpy view into the memory map, valid inside the block."""
        fr = self.require_manifest(key)["frames"]
        with self._blob(key, fr) as src:
            yield np.frombuffer(src, dtype=np.uint8).reshape(fr["shape"])

    def frames(self, key: str, manifest: dict | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
        """The cached uint8 TCHW frames: one copy out of the memory map (into ``out`` if given)."""
        fr = (manifest or self.require_manifest(key))["frames"]
        if out is None:
            out = torch.empty(fr["shape"], dtype=torch.uint8)
        elif out.dtype != torch.uint8 or list(out.shape) != fr["shape"] or not out.is_contiguous():
            raise ValueError(f"out must be a contiguous uint8 tensor of shape {fr['shape']}")
        with self._blob(key, fr) as src:
            np.copyto(out.numpy().reshape(-1), np.frombuffer(src, dtype=np.uint8))   # the one copy
        return out

    def verify(self, key: str) -> None:
        """Re-hash a blob against its digest (corruption check), straight from the memory map."""
        from .errors import DigestMismatchError
        expected = self.require_manifest(key)["frames"]["blob"]
        with self.read_frames(key) as view:
            got = Digest.of(view)
        if str(got) != expected:
            raise DigestMismatchError(f"blob for {key} hashes to {got}, manifest says {expected}")

    def frozen_path(self, key: str, fmt: str | None = None) -> str:
        """Path of the frozen file for ``key``; written and verified once, on first use."""
        fmt = fmt or self.frozen_format
        path = os.path.join(self.frozen_dir, key + FORMATS[fmt].suffix)
        if not os.path.exists(path):
            frames = self.frames(key)
            write_frozen(frames, path, fmt, verify=lambda p: verify_frozen(p, frames))
        return path

    def stats(self) -> dict:
        n_entries = sum(1 for _ in self.store.keys("ac/"))
        n_blobs = sum(1 for _ in self.store.keys("cas/"))
        n_sources = sum(1 for _ in self.store.keys("src/"))
        frozen = [f for f in os.listdir(self.frozen_dir)] if os.path.isdir(self.frozen_dir) else []
        return {"path": self.path, "entries": n_entries, "blobs": n_blobs, "sources": n_sources,
                "frozen_files": len(frozen),
                "frozen_bytes": sum(os.path.getsize(os.path.join(self.frozen_dir, f)) for f in frozen),
                "store": self.store.stats()}


_CONFIG = "config.json"
_SECRET_KEYS = {"key", "secret", "token", "aws_access_key_id", "aws_secret_access_key", "aws_session_token"}


def _read_config(path: str) -> dict:
    try:
        with open(os.path.join(path, _CONFIG)) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def _write_config(path: str, config: dict) -> None:
    clean = {**config, "shared_storage_options": {k: v for k, v in config["shared_storage_options"].items()
                                                  if k not in _SECRET_KEYS}}
    os.makedirs(path, exist_ok=True)
    tmp = os.path.join(path, f".{_CONFIG}.{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(clean, f)
    os.replace(tmp, os.path.join(path, _CONFIG))


_OPEN: dict[tuple[str, int], VideoCache] = {}


def open_cache(path: str | os.PathLike | None = None) -> VideoCache:
    """A per-process shared ``VideoCache`` for ``path`` (reopened after fork)."""
    p = str(Path(path if path is not None else default_cache_dir()).expanduser().absolute())
    k = (p, os.getpid())
    if k not in _OPEN:
        _OPEN[k] = VideoCache(p)
    return _OPEN[k]
