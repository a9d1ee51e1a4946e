"""``VideoOptions``: every option that changes the cached bytes, resolved explicitly.

Semantics are those of qwen-vl-utils 0.0.14 ``fetch_video``; the defaults it
reads from module constants and environment variables (``MODEL_SEQ_LEN``,
``FORCE_QWENVL_VIDEO_READER``) are written out here so that a key never
depends on the environment or on which decoders happen to be installed.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import typing
from dataclasses import dataclass
from typing import Any, Mapping

import xxhash

from .errors import OptionsError
from .families import FAMILIES, Family, unknown_family
from .sglang_facts import STOCK_QWEN3_GRID, stock_distorts, stock_grid, stock_sglang_problems

# The decoders a cache can be configured with (vidcache.loader.decode implements them; the CLI offers them).
# A decoder is not part of any key: where two decode one stream, their bytes are equal (tests/scenarios).
DECODERS = ("decord", "torchcodec", "pyav")
# qwen-vl-utils' own default reader, where it installs: decord 0.6.0 (2021, its last release) has wheels for x86_64
# only, so on aarch64 (GH200/GB200 nodes) the default is PyAV, whose frames equal decord's on 8-bit streams
# (tests/scenarios/test_codecs.py; the decoder never enters the cache key for them).  find_spec: no import here.
DEFAULT_DECODER = "decord" if importlib.util.find_spec("decord") is not None else "pyav"

# Bump when vidcache's own sampling/resizing/storage code or a default changes the bytes:
# it disowns every earlier entry (Bazel's "salt").
#   2: qwen3_vl's default grid went from 224 (stock SGLang's identity grid) to the model's own 32,
#      as in qwen-vl-utils (issue 10).  An explicit size_factor=224 still builds the old bytes,
#      but under a new key.
PIPELINE_SALT = "vidcache-pipeline-2"

# qwen-vl-utils 0.0.14 constants (vision_process.py), with MODEL_SEQ_LEN fixed
# at its default instead of read from the environment.
QVU_VERSION = "0.0.14"
MODEL_SEQ_LEN = 128000
VIDEO_MIN_TOKEN_NUM = 128
VIDEO_MAX_TOKEN_NUM = 768
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
FRAME_FACTOR = 2

# The largest integer option: every JSON reader holds it exactly (2**53), and it stays far below
# anything a frame count or pixel budget means.
MAX_INT_OPTION = 2 ** 53

# The row fields a Miles prompt file holds its prompt and its videos under, unless told otherwise (Miles'
# --input-key, --multimodal-keys).
INPUT_KEY = "prompt"
VIDEO_KEY = "videos"

# Keys of a Miles / qwen-vl-utils message content item that change the bytes.
CONTENT_ITEM_KEYS = (
    "fps", "nframes", "min_frames", "max_frames", "min_pixels", "max_pixels", "total_pixels",
    "resized_height", "resized_width", "video_start", "video_end",
)


def _finite(v: int | float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:        # an int beyond any float
        return False


def _shown(v: object) -> str:
    """``repr(v)``, cut short: a 5000-digit number or a huge string is not echoed whole into an error."""
    try:
        r = repr(v)
    except ValueError:           # an int past Python's digit limit for str()
        return f"an int of {v.bit_length()} bits"
    return r if len(r) <= 60 else r[:57] + "..."


# One help line per option, with its default as resolved(): the CLI's flags and Miles' --vidcache-* flags
# both take their help from here (f: the model's factor, 28, or 32 for qwen3_vl).
OPTION_HELP = {
    "family": "model family: sets the patch size (14, or 16 for qwen3_vl) and the grid factor f (28 or 32)",
    "fps": f"frames sampled per second of video (default {FPS}; exclusive with nframes)",
    "nframes": "exact number of frames to sample, rounded to a multiple of 2 (default: from fps)",
    "min_frames": f"fewest frames fps sampling may give (default {FPS_MIN_FRAMES})",
    "max_frames": f"most frames fps sampling may give (default min({FPS_MAX_FRAMES}, frames in the video))",
    "min_pixels": f"smallest frame area in pixels (default {VIDEO_MIN_TOKEN_NUM}*f*f)",
    "max_pixels": f"largest frame area in pixels (default: from total_pixels / frames, at most "
                  f"{VIDEO_MAX_TOKEN_NUM}*f*f)",
    "total_pixels": f"pixel budget of the whole video (default {MODEL_SEQ_LEN}*f*f*0.9)",
    "resized_height": "exact frame height; needs resized_width (default: from the pixel bounds)",
    "resized_width": "exact frame width; needs resized_height (default: from the pixel bounds)",
    "video_start": "start of the clip, in seconds (default: the video's start)",
    "video_end": "end of the clip, in seconds (default: the video's end)",
    "size_factor": f"frame sides are multiples of this (default f; {STOCK_QWEN3_GRID} for "
                   "stock SGLang with qwen3_vl)",
}


@dataclass(frozen=True)
class VideoOptions:
    """How a video is sampled and resized.  ``resolved()`` fills every default."""

    family: str = "qwen2_5_vl"
    fps: float | None = None
    nframes: int | None = None
    min_frames: int | None = None
    max_frames: int | None = None      # None: qwen-vl-utils' min(768, total_frames)
    min_pixels: int | None = None
    max_pixels: int | None = None      # None: derived per video from total_pixels / nframes
    total_pixels: float | None = None
    resized_height: int | None = None
    resized_width: int | None = None
    video_start: float | None = None
    video_end: float | None = None
    size_factor: int | None = None     # None: the model factor (28, or 32 for qwen3_vl), as in qwen-vl-utils

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or self.family not in FAMILIES:
            raise OptionsError(unknown_family(self.family))
        if self.fps is not None and self.nframes is not None:
            raise OptionsError("give either fps or nframes, not both (qwen-vl-utils semantics)")
        if (self.resized_height is None) != (self.resized_width is None):
            raise OptionsError("resized_height and resized_width only count together; give both or neither")
        # NaN, Infinity and 1e400 are valid JSON for Python: refused here, where the options are made,
        # never later in the key's digest (a row's bad value must cost that row only).
        for name in ("fps", "total_pixels", "video_start", "video_end"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not _finite(v) or v < 0):
                raise OptionsError(f"{name} must be a finite non-negative number, got {_shown(v)}")
        for name in ("nframes", "min_frames", "max_frames", "min_pixels", "max_pixels",
                     "resized_height", "resized_width", "size_factor"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_INT_OPTION):
                raise OptionsError(f"{name} must be a positive integer up to 2**53, got {_shown(v)}")
        if self.fps == 0:
            raise OptionsError("fps must be > 0")
        if self.size_factor is not None and self.size_factor % self.factor:
            raise OptionsError(f"size_factor {self.size_factor} must be a multiple of {self.factor} for {self.family}")

    # --- the family's record (vidcache.families) ---------------------------
    @property
    def fam(self) -> Family:
        return FAMILIES[self.family]

    @property
    def patch_size(self) -> int:
        return self.fam.patch

    @property
    def factor(self) -> int:
        """The model's spatial factor: patch size x merge size (28 or 32)."""
        return self.fam.grid

    # --- resolution -------------------------------------------------------
    def resolved(self) -> "VideoOptions":
        f = self.factor
        return dataclasses.replace(
            self,
            fps=(FPS if self.fps is None else float(self.fps)) if self.nframes is None else None,
            min_frames=FPS_MIN_FRAMES if self.min_frames is None else self.min_frames,
            min_pixels=VIDEO_MIN_TOKEN_NUM * f * f if self.min_pixels is None else self.min_pixels,
            # Same expression and order as qwen-vl-utils, so the float is identical.
            total_pixels=MODEL_SEQ_LEN * f * f * 0.9 if self.total_pixels is None else self.total_pixels,
            # qwen-vl-utils resizes to the model factor itself; anything coarser is an explicit choice.
            size_factor=f if self.size_factor is None else self.size_factor,
        )

    @classmethod
    def for_stock_sglang(cls, family: str = "qwen2_5_vl", **kw: Any) -> "VideoOptions":
        """Options on a grid stock SGLang 0.5.23 leaves alone (``mode='stock'`` refuses any other).

        Only Qwen3-VL needs this: its frames move to the 224 grid (``sglang_facts.STOCK_QWEN3_GRID``), which
        distorts aspect ratios (see benchmarks/aspect_distortion.py); plugin mode serves the default 32
        grid exactly.  Qwen2/2.5-VL options are returned unchanged: their 28 grid already is SGLang's.
        """
        if kw.get("size_factor") is None and family in FAMILIES and stock_distorts(family):
            kw["size_factor"] = stock_grid(family)
        opts = cls(family=family, **kw)          # validates every value first
        problems = stock_sglang_problems(family, opts.resolved().size_factor)
        if problems:
            raise OptionsError(f"size_factor {opts.size_factor}: " + " ".join(problems))
        return opts

    @classmethod
    def flag_fields(cls) -> list[tuple[str, type]]:
        """(name, type) of every option but ``family``: what the CLI and Miles generate their flags from."""
        hints = typing.get_type_hints(cls)
        return [(f.name, next(t for t in typing.get_args(hints[f.name]) if t is not type(None)))
                for f in dataclasses.fields(cls) if f.name != "family"]

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "VideoOptions":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise OptionsError(f"unknown option(s) {sorted(unknown)}; known: {sorted(names)}")
        return cls(**dict(d))

    def with_content_item(self, item: Mapping[str, Any]) -> "VideoOptions":
        """Apply per-video options from a message item ``{"type": "video", "video": ..., "fps": ...}``."""
        over = {k: item[k] for k in CONTENT_ITEM_KEYS if k in item}
        if not over:
            return self
        base = self.to_dict()
        if "fps" in over:
            base.pop("nframes", None)
        if "nframes" in over:
            base.pop("fps", None)
        return VideoOptions.from_dict({**base, **over})

    # --- identity ---------------------------------------------------------
    def canonical_json(self) -> str:
        """Canonical JSON of the resolved options plus the pipeline constants and salt."""
        r = self.resolved()
        record = {
            "options": r.to_dict(),
            "pipeline": {
                "salt": PIPELINE_SALT,
                "semantics": f"qwen-vl-utils=={QVU_VERSION}",
                "model_seq_len": MODEL_SEQ_LEN,
                "video_tokens": [VIDEO_MIN_TOKEN_NUM, VIDEO_MAX_TOKEN_NUM],
                "fps_frames": [FPS_MIN_FRAMES, FPS_MAX_FRAMES, FRAME_FACTOR],
                "index_rounding": "torch.linspace(float32).round()",
                "resize": "torchvision.resize(bicubic, antialias=True) on uint8",
                "frames": "uint8 TCHW RGB",
            },
        }
        return json.dumps(record, sort_keys=True, separators=(",", ":"), allow_nan=False)

    @property
    def digest(self) -> str:
        return xxhash.xxh3_128_hexdigest(self.canonical_json().encode())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, VideoOptions) and self.canonical_json() == other.canonical_json()

    def __hash__(self) -> int:
        return hash(self.canonical_json())
