"""Frozen frames: lossless video files holding exactly the cached frames, for stock SGLang.

Two formats, both intra-only, lossless for RGB and verified bit-exact with
decord, torchcodec and PyAV (benchmarks/formats.py):
  ``ffv1``     FFV1 bgr0 in Matroska: the smallest.
  ``utvideo``  UT Video gbrp in NUT: ~1.5x larger, ~5x faster to decode, which is
               what stock SGLang pays on every request (``serving.SERVING_FORMAT``).
Any YUV format would round-trip inexactly.  Files are stamped at a fixed rate
so that SGLang's fps sampler, configured by ``vidcache sglang-config``, selects
every stored frame once; at 2 fps Matroska's 1 ms timebase is exact too.

Where they live: a node-local copy under ``<VIDCACHE_DIR>/frozen/`` (written and
verified once), and, with a shared tier, an immutable object ``frozen/<key><suffix>``
published there once, so that every SGLang node can read it by URL.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

from .. import keys
from ..encode import write_video
from ..errors import FrozenFileError
from ..integrity import frozen_problem
from ..serving import FROZEN_FPS, SERVING_FORMAT
from ..store.publish import publish


@dataclass(frozen=True)
class FrozenFormat:
    name: str
    container: str
    suffix: str
    codec: str
    pix_fmt: str
    media_type: str


FORMATS = {
    "ffv1": FrozenFormat("ffv1", "matroska", ".mkv", "ffv1", "bgr0", "video/x-matroska"),
    "utvideo": FrozenFormat("utvideo", "nut", ".nut", "utvideo", "gbrp", "video/x-nut"),
}
BY_SUFFIX = {f.suffix: f for f in FORMATS.values()}


def write_frozen(frames: torch.Tensor, path: str, fmt: str = SERVING_FORMAT, rate: Fraction = FROZEN_FPS,
                 verify=None) -> None:
    """Write uint8 TCHW RGB ``frames`` to ``path`` atomically: temp file, ``verify(tmp)``, publish."""
    f = FORMATS[fmt]
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"expected uint8 TCHW RGB frames, got {tuple(frames.shape)} {frames.dtype}")
    thwc = frames.permute(0, 2, 3, 1).contiguous().numpy()

    def fill(tmp: str) -> None:
        write_video(tmp, thwc, codec=f.codec, rate=rate, pix_fmt=f.pix_fmt, container=f.container,
                    exact_time_base=f.container == "nut")
        if verify is not None:
            verify(tmp)
    publish(path, fill)


def decode_all(path: str, decoder: str) -> tuple[torch.Tensor, float]:
    """All frames of ``path`` as uint8 TCHW, plus the fps the decoder reports."""
    if decoder == "decord":
        import decord
        vr = decord.VideoReader(path, ctx=decord.cpu(0))
        arr = vr.get_batch(list(range(len(vr)))).asnumpy()
        return torch.from_numpy(np.ascontiguousarray(arr)).permute(0, 3, 1, 2), vr.get_avg_fps()
    if decoder == "torchcodec":
        from torchcodec.decoders import VideoDecoder
        dec = VideoDecoder(path, num_ffmpeg_threads=1)
        return dec.get_frames_in_range(0, dec.metadata.num_frames).data, float(dec.metadata.average_fps)
    if decoder == "pyav":
        import av
        with av.open(path) as c:
            s = c.streams.video[0]
            arr = np.stack([f.to_ndarray(format="rgb24") for f in c.decode(s)])
            fps = float(s.average_rate)
        return torch.from_numpy(arr).permute(0, 3, 1, 2), fps
    raise ValueError(f"unknown decoder {decoder!r}")


def available_decoders() -> list[str]:
    names = ["decord", "pyav"]
    try:
        from torchcodec.decoders import VideoDecoder  # noqa: F401
        names.insert(1, "torchcodec")
    except (ImportError, OSError, RuntimeError):  # torchcodec missing, or its FFmpeg/torch libraries do not load
        pass
    return names


def verify_frozen(path: str, frames: torch.Tensor, rate: Fraction = FROZEN_FPS,
                  decoders: list[str] | None = None) -> dict:
    """Re-decode ``path`` with every available decoder; raise unless all give ``frames`` bit-exactly."""
    report = {}
    for name in decoders or available_decoders():
        got, fps = decode_all(path, name)
        if got.shape != frames.shape or not torch.equal(got, frames):
            diff = "shape " + str(tuple(got.shape)) if got.shape != frames.shape else \
                f"max |diff| {int((got.int() - frames.int()).abs().max())}"
            raise FrozenFileError(f"{name} re-decodes {path} inexactly ({diff})")
        if fps != float(rate):
            raise FrozenFileError(f"{name} reports {fps} fps for {path}, expected exactly {float(rate)}")
        report[name] = fps
    return report


# --- in the cache ---------------------------------------------------------------------------
# Every frozen copy is checked before it is handed out: its bytes must hash to the digest its tier recorded
# when the copy was verified by decoding (vidcache.integrity).  A process checks a copy once while it is
# unchanged (same size, mtime and inode for a file; once per process for a shared object).
_SOUND_FILES: set[tuple] = set()
_SOUND_SHARED: set[tuple] = set()


def _stat_id(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


def _decodes_to_frames(cache, key: str, value: bytes, suffix: str) -> bool:
    """A copy without a record (made by an older vidcache): sound only if it decodes to the frames."""
    import tempfile
    os.makedirs(cache.tmp_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=suffix, dir=cache.tmp_dir) as tmp:
        tmp.write(value)
        tmp.flush()
        try:
            verify_frozen(tmp.name, cache.frames(key))
        except (FrozenFileError, RuntimeError, ValueError, OSError):
            return False
    return True


def _copy_is_sound(cache, tier: str, key: str, f: FrozenFormat) -> bool | None:
    """Whether ``tier``'s copy is sound (None: absent).  Unrecorded copies are checked by decoding and
    recorded; bad ones are quarantined."""
    value, record = cache.frozen_bytes(tier, key, f.suffix)
    if value is None:
        return None
    if record is None and _decodes_to_frames(cache, key, value, f.suffix):
        cache.record_frozen(tier, key, f.suffix, value)
        return True
    if record is not None and frozen_problem(value, record) is None:
        return True
    cache.quarantine_frozen(tier, key, f.suffix)
    if cache.read_only:
        raise FrozenFileError(f"{tier} frozen file {key}{f.suffix} is corrupt and this cache is read-only: "
                              "`vidcache verify --repair` on a writable node")
    return False


def local_frozen_path(cache, key: str, fmt: str | None = None) -> str:
    """The node-local frozen file for ``key``, checked against its recorded digest; written from the
    digest-checked frames and verified by re-decoding when absent (or found corrupt)."""
    f = FORMATS[fmt or SERVING_FORMAT]
    path = os.path.join(cache.frozen_dir, keys.check_key(key) + f.suffix)
    if (sid := _stat_id(path)) in _SOUND_FILES:
        return path
    if sid is not None and _copy_is_sound(cache, "local", key, f):
        _SOUND_FILES.add(_stat_id(path))
        return path
    frames = cache.frames(key)
    write_frozen(frames, path, f.name, verify=lambda p: verify_frozen(p, frames))
    with open(path, "rb") as fh:
        cache.record_frozen("local", key, f.suffix, fh.read())
    _SOUND_FILES.add(_stat_id(path))
    return path


def published_frozen_key(cache, key: str, fmt: str | None = None) -> str:
    """The shared tier's frozen file of ``key`` (its store key), checked against its recorded digest once
    per process; published from the verified local copy when absent or found corrupt (immutable, first
    writer wins, its digest recorded after it)."""
    f = FORMATS[fmt or SERVING_FORMAT]
    skey = keys.frozen(key, f.suffix)
    shared = cache.shared
    if shared is None:
        raise ValueError(f"{cache!r} has no shared tier to publish frozen files into")
    memo = (cache.identity, skey)
    if memo in _SOUND_SHARED:
        return skey
    for _ in range(2):                  # a writer on another node may win the publish: check theirs
        if _copy_is_sound(cache, "shared", key, f):
            _SOUND_SHARED.add(memo)
            return skey
        with open(local_frozen_path(cache, key, f.name), "rb") as fh:
            value = fh.read()
        if shared.set_if_not_exists(skey, value):
            cache.record_frozen("shared", key, f.suffix, value)
            _SOUND_SHARED.add(memo)
            return skey
    raise FrozenFileError(f"shared frozen file {skey} could not be published soundly")


def repair_frozen(cache, key: str) -> list[str]:
    """``verify --repair`` for frozen files: check unrecorded copies by decoding (recorded or
    quarantined), and remake every copy that a check moved aside.  The formats remade."""
    remade = []
    quarantine = cache.layout.quarantine_dir
    for f in FORMATS.values():
        sound = _copy_is_sound(cache, "local", key, f)
        if sound is False or (sound is None and os.path.exists(os.path.join(quarantine, key + f.suffix))):
            local_frozen_path(cache, key, f.name)
            remade.append(f"local {f.suffix}")
        if cache.shared is None:
            continue
        bad = _copy_is_sound(cache, "shared", key, f) is False
        if bad or (not cache.shared.exists_many([keys.frozen(key, f.suffix)])[0]
                   and cache.shared.exists_many([keys.quarantined(keys.frozen(key, f.suffix))])[0]):
            _SOUND_SHARED.discard((cache.identity, keys.frozen(key, f.suffix)))
            published_frozen_key(cache, key, f.name)
            remade.append(f"shared {f.suffix}")
    return remade
