"""The ``--vidcache-*`` flags and what they build: ``VideoOptions``, the node's cache and the transfer settings.

``add_vidcache_arguments`` is what the Miles plugins' ``add_arguments`` hooks call; it is idempotent because
Miles may call the hook of the rollout function and of the generate function on the same parser.
``VidcacheConfig.from_args`` tolerates a namespace where the flags were never registered (e.g. when only
``--data-source-path`` points at vidcache: Miles does not scan that path for ``add_arguments``) and then
uses the defaults below.

The node configuration is vidcache's own: ``--vidcache-cache`` / ``$VIDCACHE_DIR`` (node-local, never NFS) and
``--vidcache-shared`` / ``$VIDCACHE_SHARED`` (the cluster's shared tier).  Set the two environment variables on
every node (Ray runtime env) so that the rollout manager, SGLang servers (plugin mode) and train actors all
resolve the same handles and references.
"""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from vidcache import VideoOptions
from vidcache.cli import parse_size        # the CLI's sizes (20GB, 500MiB, bytes): one parser for every size flag
from vidcache.errors import ModelTypeError
from vidcache.engines import ENGINES
from vidcache.families import FAMILIES
from vidcache.options import OPTION_HELP
from vidcache import families
from vidcache.sglang_facts import MODES, STOCK_QWEN3_GRID, default_mode, stock_sglang_problems
from vidcache.sglang.transport import TRANSPORTS

TRAIN_INPUTS = ("tensors", "handles")
FALLBACK_FAMILY = "qwen2_5_vl"
# config.json model_type -> vidcache family: the one table of model types (vidcache.families).
MODEL_TYPES = families.FAMILY_OF_MODEL_TYPE


OPTION_NAMES = tuple(n for n, _ in VideoOptions.flag_fields())

DEFAULTS = {
    "vidcache_cache": None,             # None: $VIDCACHE_DIR or ~/.cache/vidcache
    "vidcache_shared": None,            # None: $VIDCACHE_SHARED, else what the cache directory recorded
    "vidcache_family": None,            # None: the checkpoint's config.json model_type, else FALLBACK_FAMILY
    "vidcache_mode": None,              # None: plugin for qwen3_vl (faithful frames), stock otherwise
    "vidcache_transport": None,         # None: the shared tier's URLs when there is one, else file://
    "vidcache_base_url": None,
    "vidcache_train_inputs": "tensors",
    "vidcache_positions": "sglang",     # the M-RoPE rule the trainer's model is given (train_hooks)
    "vidcache_video_key": None,         # None: --multimodal-keys' "video" entry, else "videos"
    "vidcache_require_cached": False,
    "vidcache_media_root": None,        # None: a row's relative paths stay under the prompt file's directory
    "vidcache_prepare_cache_size": 16,
    "vidcache_read_ahead": None,        # None: two rollout batches (2 x --rollout-batch-size), else 64; 0: off
    "vidcache_read_ahead_bytes": 2 << 30,
    "vidcache_server_read_ahead": 0,    # off: every server node pulls what a request names (traffic x nodes)
    "vidcache_check_servers": True,
    "vidcache_check_computation": "off",   # warn / fail: the canaries' KL against the HF checkpoint at startup
    "vidcache_logprob_monitor": 0,      # every N rollouts: the rollout-vs-train logprob difference per modality
    "vidcache_allow_unverified_sglang": None,
    "vidcache_server_torchcodec": None,
    "vidcache_server_vision": None,     # "package": the servers run vidcache's model package (stock mode states it)
    **{"vidcache_" + n: None for n in OPTION_NAMES},
}


def add_vidcache_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Register the ``--vidcache-*`` flags on ``parser`` (a no-op if they are already there)."""
    if "--vidcache-cache" in getattr(parser, "_option_string_actions", {}):
        return parser
    g = parser.add_argument_group("vidcache (video cache for Qwen-VL video RL)")
    g.add_argument("--vidcache-cache", default=None, metavar="DIR",
                   help="this node's local cache directory, never on NFS (default: $VIDCACHE_DIR or ~/.cache/vidcache)")
    g.add_argument("--vidcache-shared", default=None, metavar="URL",
                   help="the cluster's shared tier: an NFS path or s3://bucket/prefix (default: $VIDCACHE_SHARED)")
    g.add_argument("--vidcache-family", default=None, choices=sorted(FAMILIES),
                   help=OPTION_HELP["family"] + " (default: from --hf-checkpoint's config.json model_type; a "
                        "contradicting value is refused at startup)")
    for name, typ in VideoOptions.flag_fields():
        flag = name.replace("_", "-")
        g.add_argument(f"--vidcache-{flag}", default=None, type=typ,
                       help=f"{OPTION_HELP[name]} (as `vidcache prewarm --{flag}`)")
    g.add_argument("--vidcache-mode", default=None, choices=MODES,
                   help="stock: SGLang as shipped (frozen files); plugin: SGLang with vidcache's processor plugin "
                        "(default: plugin for qwen3_vl, stock otherwise)")
    g.add_argument("--vidcache-transport", default=None, choices=TRANSPORTS,
                   help="stock mode: how frozen files reach SGLang (default: the shared tier's URLs, else file://)")
    g.add_argument("--vidcache-base-url", default=None, help="address of `vidcache serve`, for --vidcache-transport http")
    g.add_argument("--vidcache-train-inputs", default=DEFAULTS["vidcache_train_inputs"], choices=TRAIN_INPUTS,
                   help="tensors: pixel tensors filled at rollout (no Miles change); handles: a small handle "
                        "travels and train actors rebuild the tensors (needs --custom-megatron-init-path "
                        "miles_integration.train_hooks.install_train_hooks)")
    g.add_argument("--vidcache-positions", default=DEFAULTS["vidcache_positions"],
                   choices=(*ENGINES, "transformers"),
                   help="the M-RoPE position rule the trainer's Qwen2-VL / Qwen2.5-VL model computes (installed by "
                        "--custom-megatron-init-path miles_integration.train_hooks.install_train_hooks): the rollout "
                        "engine's; 'transformers' leaves transformers' own, which puts text after a long video "
                        "elsewhere than SGLang does")
    g.add_argument("--vidcache-video-key", default=None,
                   help='row key of the video list (default: the "video" entry of --multimodal-keys, else "videos")')
    g.add_argument("--vidcache-media-root", action="append", default=None, metavar="DIR",
                   help="a directory the prompt file's local images and videos may be read from (repeatable; "
                        "as `vidcache prewarm --media-root`). Without it a relative path must stay under the prompt "
                        "file's directory; with it every local path must lie under one of these")
    g.add_argument("--vidcache-require-cached", action="store_true",
                   help="fail at data-source init if a video is not prewarmed (default: build on first use)")
    g.add_argument("--vidcache-prepare-cache-size", type=int, default=DEFAULTS["vidcache_prepare_cache_size"],
                   help="prepared prompts kept per rollout process, so a group's n samples share one processor run")
    g.add_argument("--vidcache-read-ahead", type=int, default=DEFAULTS["vidcache_read_ahead"], metavar="SAMPLES",
                   help="prompts ahead of the sampler whose videos the data source pulls into this node's local tier "
                        "in the background (default: two rollout batches; 0: off)")
    g.add_argument("--vidcache-read-ahead-bytes", type=parse_size, default=DEFAULTS["vidcache_read_ahead_bytes"],
                   metavar="SIZE", help="frames pulled ahead and not yet sampled, at most: 4GB, 500MiB or bytes, as "
                                        "every vidcache size (default: 2GiB; with a local budget, at most half of it)")
    g.add_argument("--vidcache-server-read-ahead", type=int, default=DEFAULTS["vidcache_server_read_ahead"],
                   metavar="KEYS", help="plugin mode: name the next KEYS entries of the sampler's order (at most "
                   "32) in each request, so the SGLang node pulls them before its next requests ask (every node "
                   "that gets a request pulls them all: off by default)")
    g.add_argument("--vidcache-check-servers", action=argparse.BooleanOptionalAction,
                   default=DEFAULTS["vidcache_check_servers"],
                   help="before the first rollout, run `vidcache check-server` against every SGLang server and "
                        "stop on any cause (default: on)")
    g.add_argument("--vidcache-check-computation", default=DEFAULTS["vidcache_check_computation"],
                   choices=("off", "warn", "fail"),
                   help="before the first rollout, also run `vidcache check-computation` against every SGLang server "
                        "with --hf-checkpoint's model (transformers, on this process's GPU in bf16 where a floor is "
                        "measured for it, else CPU fp32), log the table, and on a KL above the threshold warn or fail (default: off; needs the "
                        "checkpoint's weights on the trainer node)")
    g.add_argument("--vidcache-logprob-monitor", type=int, default=DEFAULTS["vidcache_logprob_monitor"], metavar="N",
                   help="every N rollouts, log Miles' rollout-vs-train logprob difference split by modality (text / "
                        "after an image / after a video) and the video share of it (needs --custom-megatron-init-path "
                        "miles_integration.train_hooks.install_train_hooks; default 0: off)")
    g.add_argument("--vidcache-allow-unverified-sglang", default=None, metavar="VERSION",
                   help="accept this exact SGLang version although vidcache is not verified with it")
    g.add_argument("--vidcache-server-torchcodec", default=None, metavar="VERSION",
                   help="stock mode on GPU servers: the torchcodec version installed there")
    g.add_argument("--vidcache-server-vision", default=None, choices=("package",),
                   help="stock mode: the SGLang servers run vidcache's model package (SGLANG_EXTERNAL_MODEL_PACKAGE; "
                        "nothing reports it in stock mode); `vidcache sglang-config --vision package` adds it")
    return parser


def _get(args, name):
    v = getattr(args, name, DEFAULTS[name]) if args is not None else DEFAULTS[name]
    return DEFAULTS[name] if v is None else v


def family_of_checkpoint(checkpoint: str | None, family: str | None = None) -> str | None:
    """The vidcache family of a local HF checkpoint directory, derived from its processor classes and vision
    config (``vidcache.families.derive``; ``family``: the one named, which lets an unknown model type whose
    processing is that family's run, unverified).  None where there is nothing to read (a hub id, no
    config.json); ``ModelTypeError`` where the checkpoint's processing is not one vidcache can vouch for."""
    if not checkpoint or not os.path.isfile(os.path.join(checkpoint, "config.json")):
        return None           # a hub id or a processor without its model config: nothing to infer from here
    return families.derive(checkpoint, family).family


def family_from_args(args) -> str:
    """``--vidcache-family``, checked against the checkpoint; inferred from it when not given.

    Entries of one family given to another family's processor fail deep inside transformers (a reshape
    error); this refuses the mismatch at startup, naming both."""
    explicit = _get(args, "vidcache_family")
    checkpoint = getattr(args, "hf_checkpoint", None) if args is not None else None
    try:
        inferred = family_of_checkpoint(checkpoint)
    except ModelTypeError:
        if explicit is None:
            raise
        inferred = family_of_checkpoint(checkpoint, explicit)      # an unknown model type, named: unverified
    if explicit is not None and inferred is not None and explicit != inferred:
        raise ValueError(f"--vidcache-family {explicit} contradicts --hf-checkpoint {checkpoint} (config.json "
                         f"model_type: {inferred}); drop --vidcache-family to use {inferred}")
    return explicit or inferred or FALLBACK_FAMILY


def video_options_from_args(args) -> VideoOptions:
    kw = {n: v for n in OPTION_NAMES if (v := _get(args, "vidcache_" + n)) is not None}
    return VideoOptions(family=family_from_args(args), **kw)


def read_ahead_from_args(args) -> int:
    """``--vidcache-read-ahead``, else two rollout batches (what the next two ``get_samples`` take), else 64."""
    n = _get(args, "vidcache_read_ahead")
    if n is None:
        batch = getattr(args, "rollout_batch_size", None) if args is not None else None
        n = 2 * int(batch) if batch else 64
    if int(n) < 0:
        raise ValueError(f"--vidcache-read-ahead must be 0 (off) or a number of prompts, got {n}")
    return int(n)


def video_key_from_args(args) -> str:
    if (k := _get(args, "vidcache_video_key")) is not None:
        return k
    mm = getattr(args, "multimodal_keys", None) or {}
    return mm.get("video", "videos") if isinstance(mm, dict) else "videos"


@dataclass(frozen=True)
class VidcacheConfig:
    cache: str | None                 # node-local directory (None: $VIDCACHE_DIR)
    options: VideoOptions
    mode: str = "stock"
    transport: str | None = None
    base_url: str | None = None
    train_inputs: str = "tensors"
    video_key: str = "videos"
    require_cached: bool = False
    media_roots: tuple[str, ...] | None = None    # --vidcache-media-root (vidcache.dataset's source rule)
    prepare_cache_size: int = 16
    shared: str | None = None         # shared tier URL (None: $VIDCACHE_SHARED)
    read_ahead: int = 64              # prompts ahead of the sampler (0: off)
    read_ahead_bytes: int = 2 << 30
    server_read_ahead: int = 0        # plugin mode: next entries named in each request (0: none)

    def __post_init__(self) -> None:
        for name, allowed in (("mode", MODES), ("train_inputs", TRAIN_INPUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"--vidcache-{name.replace('_', '-')} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.transport is not None and self.transport not in TRANSPORTS:
            raise ValueError(f"--vidcache-transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.transport == "http" and not self.base_url:
            raise ValueError("--vidcache-transport http needs --vidcache-base-url (the address of `vidcache serve`)")
        grid = self.options.resolved().size_factor
        if self.mode == "stock" and stock_sglang_problems(self.options.family, grid):
            # Fail at startup, not at the first rollout: stock SGLang would resize these frames.
            raise ValueError(f"{self.options.family} frames on the {grid}-pixel grid cannot go through stock SGLang: "
                             f"use --vidcache-mode plugin (recommended, faithful frames), or --vidcache-size-factor "
                             f"{STOCK_QWEN3_GRID} (stock-safe, distorts aspect ratios; see README)")

    @classmethod
    def from_args(cls, args) -> "VidcacheConfig":
        options = video_options_from_args(args)
        return cls(cache=_get(args, "vidcache_cache"), options=options,
                   mode=_get(args, "vidcache_mode") or default_mode(options.family),
                   transport=_get(args, "vidcache_transport"), base_url=_get(args, "vidcache_base_url"),
                   train_inputs=_get(args, "vidcache_train_inputs"), video_key=video_key_from_args(args),
                   require_cached=bool(_get(args, "vidcache_require_cached")),
                   media_roots=tuple(_get(args, "vidcache_media_root") or ()) or None,
                   prepare_cache_size=int(_get(args, "vidcache_prepare_cache_size")),
                   shared=_get(args, "vidcache_shared"), read_ahead=read_ahead_from_args(args),
                   read_ahead_bytes=int(_get(args, "vidcache_read_ahead_bytes")),
                   server_read_ahead=int(_get(args, "vidcache_server_read_ahead")))

    def open_cache(self):
        """This node's cache: the flags if given, else ``$VIDCACHE_DIR`` / ``$VIDCACHE_SHARED``; one per process.

        Its identity is read here, which registers it in the process: handles that name it (rebuilt from
        ``sample.metadata`` or a handle tensor) resolve to this cache even when it was configured by flags."""
        from vidcache import node_cache, open_cache
        # vidcache.node keeps one cache per (directory, shared tier) per process: no registry of our own.
        cache = node_cache() if self.cache is None and self.shared is None else open_cache(self.cache, shared=self.shared)
        cache.identity  # noqa: B018 -- registers the cache for handle resolution in this process
        return cache
