"""The ``--vidcache-*`` flags and what they build: ``VideoOptions``, the cache and the transfer settings.

``add_vidcache_arguments`` is what the Miles plugins' ``add_arguments`` hooks call; it is idempotent because
Miles may call the hook of the rollout function and of the generate function on the same parser.
``VidcacheConfig.from_args`` tolerates a namespace where the flags were never registered (e.g. when only
``--data-source-path`` points at vidcache: Miles does not scan that path for ``add_arguments``) and then
uses the defaults below.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from vidcache import VideoOptions
from vidcache.options import PATCH_SIZE

MODES = ("stock", "plugin")
TRANSPORTS = ("file", "http", "data")
TRAIN_INPUTS = ("tensors", "handles")

# (flag suffix, dest suffix, argparse kwargs); every dest is "vidcache_" + suffix.
_OPTION_FLAGS = (
    ("fps", dict(type=float)),
    ("nframes", dict(type=int)),
    ("min-frames", dict(type=int)),
    ("max-frames", dict(type=int)),
    ("min-pixels", dict(type=int)),
    ("max-pixels", dict(type=int)),
    ("total-pixels", dict(type=float)),
    ("size-factor", dict(type=int)),
)
OPTION_NAMES = tuple(f.replace("-", "_") for f, _ in _OPTION_FLAGS)

DEFAULTS = {
    "vidcache_cache": None,             # None: $VIDCACHE_DIR or ~/.cache/vidcache (vidcache.cache.default_cache_dir)
    "vidcache_family": "qwen2_5_vl",
    "vidcache_mode": "stock",
    "vidcache_transport": "file",
    "vidcache_base_url": None,
    "vidcache_train_inputs": "tensors",
    "vidcache_video_key": None,         # None: --multimodal-keys' "video" entry, else "videos"
    "vidcache_require_cached": False,
    "vidcache_prepare_cache_size": 16,
    **{"vidcache_" + n: None for n in OPTION_NAMES},
}


def add_vidcache_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the ``--vidcache-*`` flags on ``parser`` (a no-op if they are already there)."""
    if "--vidcache-cache" in getattr(parser, "_option_string_actions", {}):
        return parser
    g = parser.add_argument_group("vidcache (video cache for Qwen-VL video RL)")
    g.add_argument("--vidcache-cache", default=DEFAULTS["vidcache_cache"],
                   help="cache directory, shared by the rollout manager, SGLang nodes (stock/file) and, with "
                        "--vidcache-train-inputs handles, the train actors (default: $VIDCACHE_DIR or ~/.cache/vidcache)")
    g.add_argument("--vidcache-family", default=DEFAULTS["vidcache_family"], choices=sorted(PATCH_SIZE))
    for flag, kw in _OPTION_FLAGS:
        g.add_argument(f"--vidcache-{flag}", default=None, **kw,
                       help="video option, qwen-vl-utils semantics (same as `vidcache prewarm --%s`)" % flag)
    g.add_argument("--vidcache-mode", default=DEFAULTS["vidcache_mode"], choices=MODES,
                   help="stock: SGLang as shipped (frozen files); plugin: SGLang with vidcache's processor plugin")
    g.add_argument("--vidcache-transport", default=DEFAULTS["vidcache_transport"], choices=TRANSPORTS,
                   help="how video_data reaches SGLang: file:// on a shared filesystem, http (vidcache serve), data: inline")
    g.add_argument("--vidcache-base-url", default=None, help="base URL serving the cache's frozen/ and refs/ directories, for --vidcache-transport http")
    g.add_argument("--vidcache-train-inputs", default=DEFAULTS["vidcache_train_inputs"], choices=TRAIN_INPUTS,
                   help="tensors: pixel tensors filled at rollout (no Miles change); handles: a small handle "
                        "travels and train actors rebuild the tensors (needs --custom-megatron-init-path "
                        "miles_integration.train_hooks.install_train_hooks)")
    g.add_argument("--vidcache-video-key", default=None,
                   help='row key of the video list (default: the "video" entry of --multimodal-keys, else "videos")')
    g.add_argument("--vidcache-require-cached", action="store_true",
                   help="fail at data-source init if a video is not prewarmed (default: build on first use)")
    g.add_argument("--vidcache-prepare-cache-size", type=int, default=DEFAULTS["vidcache_prepare_cache_size"],
                   help="prepared prompts kept per rollout process, so a group's n samples share one processor run")
    return parser


def _get(args, name):
    return getattr(args, name, DEFAULTS[name]) if args is not None else DEFAULTS[name]


def video_options_from_args(args) -> VideoOptions:
    kw = {n: v for n in OPTION_NAMES if (v := _get(args, "vidcache_" + n)) is not None}
    return VideoOptions(family=_get(args, "vidcache_family"), **kw)


def video_key_from_args(args) -> str:
    if (k := _get(args, "vidcache_video_key")) is not None:
        return k
    mm = getattr(args, "multimodal_keys", None) or {}
    return mm.get("video", "videos") if isinstance(mm, dict) else "videos"


@dataclass(frozen=True)
class VidcacheConfig:
    cache: str
    options: VideoOptions
    mode: str = "stock"
    transport: str = "file"
    base_url: str | None = None
    train_inputs: str = "tensors"
    video_key: str = "videos"
    require_cached: bool = False
    prepare_cache_size: int = 16

    def __post_init__(self) -> None:
        for name, allowed in (("mode", MODES), ("transport", TRANSPORTS), ("train_inputs", TRAIN_INPUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"--vidcache-{name.replace('_', '-')} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.transport == "http" and not self.base_url:
            raise ValueError("--vidcache-transport http needs --vidcache-base-url (the address of `vidcache serve`)")

    @classmethod
    def from_args(cls, args) -> "VidcacheConfig":
        from vidcache.cache import default_cache_dir
        import os
        cache = _get(args, "vidcache_cache") or default_cache_dir()
        return cls(cache=os.path.abspath(os.path.expanduser(cache)), options=video_options_from_args(args),
                   mode=_get(args, "vidcache_mode"), transport=_get(args, "vidcache_transport"),
                   base_url=_get(args, "vidcache_base_url"), train_inputs=_get(args, "vidcache_train_inputs"),
                   video_key=video_key_from_args(args), require_cached=bool(_get(args, "vidcache_require_cached")),
                   prepare_cache_size=int(_get(args, "vidcache_prepare_cache_size")))

    def open_cache(self):
        from vidcache import open_cache
        return open_cache(self.cache)
