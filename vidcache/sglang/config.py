"""``vidcache sglang-config``: the server flags that make SGLang 0.5.23 reproduce the cache.

Frozen files hold exactly the sampled frames, stamped at ``FROZEN_FPS``.  With
this config SGLang's sampler computes ``nframes = N / 2 * 2 = N`` and
``linspace(0, N-1, N)`` (every frame once), its factor-28 ``smart_resize`` is
the identity on frames already on the grid (the pixel bounds are opened wide),
and ``do_resize: false`` reaches the HF processor through ``videos_kwargs`` so
its own resize is skipped too.
"""
from __future__ import annotations

import json
import math
import os
import shlex

from ..config import ENV_DIR, ENV_SHARED, export_line
from ..families import FAMILIES, unknown_family
from ..serving import FROZEN_FPS
from ..token_layout import (ENV_LAYOUT, SGLANG_TRANSFORMERS_PIN, VERIFIED_TRANSFORMERS,
                            env_layout, implied_layout)
from ..sglang_facts import (MODEL_PACKAGE, MODEL_PACKAGE_ENV, MODES, SGLANG_MAX_FRAMES, SGLANG_MAX_PIXELS,
                            SGLANG_MIN_PIXELS, SGLANG_TOTAL_PIXELS_ENV, SGLANG_URL_CAP, STOCK_GPU_TORCHCODEC,
                            TRAINER_VISION, TRANSFORMERS_IMPL_ARGS, VERIFIED_SGLANG_VERSIONS, VISION_FIXES,
                            default_mode, default_vision_fix, refused_video_keys, stock_pixel_bounds, vision_differs)
from .versions import installed_sglang, installed_transformers, qwen_vl_processor_modules

PLUGIN_PACKAGE = "vidcache.sglang.plugin"
SGLANG_TOTAL_PIXELS = SGLANG_MAX_FRAMES * SGLANG_MAX_PIXELS     # never shrink a video for its length


ENV_SGLANG_VERSION = "VIDCACHE_SGLANG_VERSION"   # the release the servers run, where this node has another or none


def target_sglang(version: str | None = None) -> str:
    """The SGLang release a config is for: ``version``, else ``$VIDCACHE_SGLANG_VERSION``, else the one installed
    here (a Miles image has the servers' own), else the newest verified."""
    return version or os.environ.get(ENV_SGLANG_VERSION) or installed_sglang() or VERIFIED_SGLANG_VERSIONS[-1]


def mm_process_config(sglang_version: str | None = None, family: str | None = None) -> dict:
    """``--mm-process-config`` for that SGLang release (``target_sglang``) serving ``family`` (None: a config
    every family takes)."""
    video = {
        "fps": float(FROZEN_FPS),
        "max_frames": SGLANG_MAX_FRAMES,
        "min_pixels": SGLANG_MIN_PIXELS,          # never upscale: frames are already sized
        "max_pixels": SGLANG_MAX_PIXELS,          # never downscale
        "total_pixels": SGLANG_TOTAL_PIXELS,
        "do_resize": False,                       # forwarded to the HF video processor
    }
    for key in refused_video_keys(family, target_sglang(sglang_version)):
        del video[key]                            # that release's defaults apply (server_env sets the total)
    return {"video": video}


def server_env(sglang_version: str | None = None) -> dict[str, str]:
    """Environment the SGLang server needs beside its flags, for that release (``target_sglang``)."""
    var = SGLANG_TOTAL_PIXELS_ENV.get(target_sglang(sglang_version))
    return {var: str(SGLANG_TOTAL_PIXELS)} if var else {}


def url_cap_args(largest_bytes: int) -> list[str]:
    """The server argument that lets SGLang download a frozen file of ``largest_bytes`` by URL."""
    if largest_bytes <= SGLANG_URL_CAP:
        return []
    return ["--media-url-max-file-size-mb", str(math.ceil(largest_bytes / (1 << 20)) + 1)]


def sglang_report() -> dict:
    """The SGLang installed here (read from its distribution's metadata: nothing is imported), against
    the verified releases."""
    version = installed_sglang()
    out = {"installed": version, "verified": list(VERIFIED_SGLANG_VERSIONS)}
    if version is not None:
        out["qwen_vl_processor_modules"] = qwen_vl_processor_modules()
    return out


def sglang_config(family: str, mode: str | None = None, cache=None, sglang_version: str | None = None,
                  vision: str | None = None, embeddings: str | None = None) -> dict:
    """The SGLang server configuration for ``family`` in ``mode`` (None: ``facts.default_mode``, plugin
    for Qwen3-VL as in Miles), for the SGLang release ``sglang_version`` (``target_sglang``).  With ``cache``
    (a ``VideoCache``), stock mode also lifts SGLang's URL download cap when the largest frozen file needs it.
    ``vision``: how the server computes the original model's vision tower where SGLang's own code does not
    (``sglang_facts.VISION_FIXES``; None: ``default_vision_fix(mode)``).  ``embeddings``: where the plugin reads
    precomputed vision embeddings (``rollout.embeddings.server_lookup``): a directory of records or a
    ``module:callable`` lookup; plugin mode only."""
    if family not in FAMILIES:
        raise ValueError(unknown_family(family))
    mode = default_mode(family) if mode is None else mode
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    vision = default_vision_fix(mode) if vision is None else vision
    if vision not in VISION_FIXES:
        raise ValueError(f"vision must be one of {VISION_FIXES}, got {vision!r}")
    target = target_sglang(sglang_version)
    cfg = mm_process_config(target, family)
    out = {
        "family": family,
        "mode": mode,
        "sglang_version": target,
        "mm_process_config": cfg,
        "server_args": ["--mm-process-config", json.dumps(cfg, separators=(",", ":"))],
        # SGLang 0.5.23's opt-in Rust server refuses to start when an external processor is registered,
        # and runs its own image path otherwise: vidcache's configs are for the Python server.
        "env": {"SGLANG_RUST_SERVER": "0", **server_env(target)},
        "notes": [],
        "server_requirements": [],
        "sglang": sglang_report(),
        # A command, nothing else (no shell comment: it is a JSON value that may be run as it is).  The flag
        # states that the GPU servers have that torchcodec installed (server_requirements; a CPU server ignores it).
        "check": "vidcache check-server http://<host>:<port> --mode " + mode + (
            f" --server-torchcodec {STOCK_GPU_TORCHCODEC}" if mode == "stock" else ""),
        "token_layout": token_layout_record(family, mode, target),
    }
    _vision(out, family, mode, vision)
    if target not in VERIFIED_SGLANG_VERSIONS:
        out["notes"].append(f"this config is for SGLang {target}, which is UNVERIFIED: vidcache is verified with "
                            f"{', '.join(VERIFIED_SGLANG_VERSIONS)} only")
    if embeddings:
        _embeddings(out, mode, embeddings)
    if mode == "plugin":
        out["env"]["SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE"] = PLUGIN_PACKAGE
        out["env"][ENV_DIR] = "<a node-local directory on each SGLang node (never NFS)>"
        out["env"][ENV_SHARED] = (cache.config.shared if cache is not None and cache.config.shared
                                         else "<the cluster's shared tier: NFS path or s3://bucket/prefix>")
        out["notes"].append("vidcache must be importable by the SGLang server; the plugin resolves each "
                            "reference through this node's VIDCACHE_DIR + VIDCACHE_SHARED (never a path named in "
                            "a request) and refuses references to any other cache.")
    else:
        out["server_requirements"].append(f"torchcodec=={STOCK_GPU_TORCHCODEC}")
        out["notes"].append(f"on GPU servers stock mode needs torchcodec {STOCK_GPU_TORCHCODEC}: with 0.17.0 (SGLang "
                            "0.5.23's pin) frozen frames decode inexactly on CUDA (max error 2). Plugin mode does "
                            "not decode.")
        if FAMILIES[family].scaled_time:
            out["notes"].append("stock SGLang 0.5.23 passes no video_metadata: second_per_grid_ts is always 2/24. "
                                "Use --mode plugin for the model's intended 2/sample_fps.")
        lo, hi = stock_pixel_bounds(family, target)
        if (lo, hi) != (SGLANG_MIN_PIXELS, SGLANG_MAX_PIXELS):
            out["notes"].append(f"SGLang {target} with {family}: its transformers refuses the pixel bounds in the "
                                f"config, so its fixed [{lo}, {hi}] pixels per frame apply: prewarm with "
                                f"min_pixels={lo}, max_pixels={hi} (stock mode refuses frames outside), or use "
                                "--mode plugin")
        if FAMILIES[family].per_frame:
            out["notes"].append(f"stock SGLang 0.5.23 derives {family}'s timestamps from the frozen file "
                                f"({float(FROZEN_FPS)} fps), not from the original video. Use --mode plugin for "
                                "the original timestamps.")
    if cache is not None:
        # No node path: this config is copied to the SGLang nodes, which have their own VIDCACHE_DIR.
        out["cache"] = {"shared": cache.config.shared, "identity": cache.identity}
        if mode == "stock":
            extra = url_cap_args(largest_frozen_bytes(cache))
            out["server_args"] += extra
            if extra:
                out["notes"].append(f"the largest frozen file exceeds SGLang's {SGLANG_URL_CAP >> 20} MiB URL "
                                    f"download cap: {' '.join(extra)} lifts it")
    return out


def _vision(out: dict, family: str, mode: str, vision: str) -> None:
    """Make the server compute the trainer's vision tower (``sglang_facts.VISION_ACROSS_FRAMES``) the ``vision``
    way, and record it (``out["vision"]``: what check-server verifies)."""
    if not vision_differs(family):
        out["vision"] = {"attention": TRAINER_VISION, "fix": None}
        return
    out["vision"] = {"attention": TRAINER_VISION, "fix": vision}
    why = (f"SGLang's own {family} vision tower attends across a video's frames; the model (and the trainer: "
           "transformers) attends within each temporal patch")
    if vision == "package":
        out["env"][MODEL_PACKAGE_ENV] = MODEL_PACKAGE
        out["notes"].append(f"{why}: {MODEL_PACKAGE_ENV}={MODEL_PACKAGE} makes the server run vidcache's subclass "
                            "of SGLang's model, which attends per temporal patch and keeps SGLang's radix cache "
                            "and chunked prefill (vidcache must be importable on the servers)")
        if mode == "stock":
            out["check"] += " --server-vision package"
            out["notes"].append("stock mode has no vidcache plugin to report the model package: check-server "
                                "needs --server-vision package to take it as stated")
    else:
        out["server_args"] += list(TRANSFORMERS_IMPL_ARGS)
        out["notes"].append(f"{why}: --model-impl transformers runs transformers' model code in the server "
                            "(configuration only), at a cost: SGLang then disables the radix cache and chunked "
                            "prefill for multimodal requests (a GRPO group's samples no longer share their prompt's "
                            "prefill). With vidcache on the servers, --vision package keeps both")


def token_layout_record(family: str, mode: str, sglang_version: str | None = None) -> dict:
    """The token layout the trainer and this server must agree on (``vidcache.token_layout``), read without
    importing transformers: the layout plugin-mode requests carry, and what the releases imply (the trainer's
    processor is probed by ``prepare`` and ``check-server``; a server's transformers is not reported)."""
    here = installed_transformers()
    pin = SGLANG_TRANSFORMERS_PIN.get(target_sglang(sglang_version))
    rec = {"layouts": list(FAMILIES[family].layouts), "model": FAMILIES[family].model_layout,
           "transformers_here": here, "implied_here": implied_layout(family, here),
           "server_pin": pin, "implied_server": implied_layout(family, pin),
           "verified_transformers": list(VERIFIED_TRANSFORMERS)}
    if mode == "plugin":
        rec["request"] = env_layout(family) or FAMILIES[family].model_layout
        rec["how"] = "each reference names it and the plugin expands the prompt in it, whatever the server's transformers"
    else:
        rec["request"] = env_layout(family) or "the server's own (stock SGLang expands in its transformers' layout)"
        rec["how"] = (f"the trainer must expand as the server does: check-server compares them; ${ENV_LAYOUT} or "
                      "token_layout= makes the trainer follow a server on another transformers")
    return rec


def largest_frozen_bytes(cache) -> int:
    """The largest frozen file this cache may send: published ones, else an upper bound from the raw
    frames (lossless compression of noisy frames can approach the raw size)."""
    from .. import keys
    store = cache.store
    sizes = [store.size(k) or 0 for k in store.keys(keys.FROZEN)]
    for key in cache.entries():
        m = cache.manifest(key)
        if m is not None:
            sizes.append(m.frames.nbytes)
    return max(sizes, default=0)


# --- the same configuration as shell text: what `vidcache sglang-config --format miles|shell` prints --------------
FORMATS = ("json", "miles", "shell")
NODE_ENV = (ENV_DIR, ENV_SHARED)     # each node's own settings (docs/miles.md section 1), not the servers'


def _command(cfg: dict) -> str:
    """The ``vidcache sglang-config`` call that prints ``cfg`` (no cache path: it differs per node)."""
    fix = (cfg.get("vision") or {}).get("fix")
    return (f"vidcache sglang-config --family {cfg['family']} --mode {cfg['mode']} "
            f"--sglang-version {cfg['sglang_version']}" + (f" --vision {fix}" if fix else ""))


# Miles' train hook: the trainer's transformers Qwen2-VL / Qwen2.5-VL models compute the engine's M-RoPE positions
# (and rebuild handles, --vidcache-train-inputs handles).  miles_integration/train_hooks.py.
MILES_TRAIN_HOOK = "miles_integration.train_hooks.install_train_hooks"


def miles_args(cfg: dict) -> list[str]:
    """``cfg`` as Miles' ``train.py`` flags: the ``--vidcache-*`` flags that select the same family and mode, and
    every SGLang server argument in Miles' spelling (``--sglang-<field>``: Miles forwards them to ``ServerArgs``).
    Stock mode states the GPU servers' torchcodec (the startup check asks for it; a CPU server ignores it).
    Qwen2-VL and Qwen2.5-VL add the train hook, so the trainer computes SGLang's positions (the startup check fails
    without it)."""
    out = ["--vidcache-family", cfg["family"], "--vidcache-mode", cfg["mode"]]
    # A family whose transformers model computes other positions than the engines (``Family.trainer_rope``;
    # vidcache.mrope: a video is one item whose temporal extent can pass its spatial one).
    if FAMILIES[cfg["family"]].trainer_rope is not None:
        out += ["--custom-megatron-init-path", MILES_TRAIN_HOOK]
    if (cfg.get("vision") or {}).get("fix") == "package" and cfg["mode"] == "stock":
        out += ["--vidcache-server-vision", "package"]
    for a in cfg["server_args"]:
        out.append("--sglang-" + a[2:] if a.startswith("--") else a)
    if cfg["mode"] == "stock":
        out += ["--vidcache-server-torchcodec", STOCK_GPU_TORCHCODEC]
    if cfg["sglang_version"] not in VERIFIED_SGLANG_VERSIONS:
        out += ["--vidcache-allow-unverified-sglang", cfg["sglang_version"]]
    return out


def miles_env(cfg: dict) -> dict[str, str]:
    """The SGLang servers' environment for the Ray job's ``env_vars`` (Miles starts them as actors of the job),
    without the node settings ``NODE_ENV``, which every node sets to its own values."""
    return {k: v for k, v in cfg["env"].items() if k not in NODE_ENV}


def _array(name: str, argv: list[str]) -> list[str]:
    """A bash array, one flag (with its value) per line."""
    lines, i = [f"{name}=("], 0
    while i < len(argv):
        take = 2 if i + 1 < len(argv) and not argv[i + 1].startswith("--") else 1
        lines.append("  " + shlex.join(argv[i:i + take]))
        i += take
    return lines + [")"]


def format_miles(cfg: dict) -> str:
    """A bash fragment to ``source`` in a Miles launch script: ``VIDCACHE_SGLANG_ENV`` (a JSON object to merge into
    ``--runtime-env-json``'s ``env_vars``) and the array ``VIDCACHE_MILES_ARGS`` (train.py's flags)."""
    env = json.dumps(miles_env(cfg), separators=(",", ":"))
    head = [f"# {_command(cfg)} --format miles", f"# SGLang {cfg['sglang_version']}, {cfg['family']}, "
            f"{cfg['mode']} mode; the Ray job's env_vars for the SGLang servers (merge into --runtime-env-json):"]
    if cfg["mode"] == "plugin":
        head.append(f"# plugin mode: every node also needs its own {' and '.join(NODE_ENV)} (docs/miles.md section 1)")
    return "\n".join(head + [f"VIDCACHE_SGLANG_ENV={shlex.quote(env)}", "# train.py's flags:"]
                     + _array("VIDCACHE_MILES_ARGS", miles_args(cfg)) + _notes(cfg)) + "\n"


def format_shell(cfg: dict) -> str:
    """A bash fragment for an SGLang server started by hand: the environment exported and ``SGLANG_ARGS``."""
    lines = [f"# {_command(cfg)} --format shell"]
    lines += [export_line(k, v) for k, v in cfg["env"].items()]     # placeholders: ${VAR:?...}, never text
    lines += _array("SGLANG_ARGS", list(cfg["server_args"]))
    model = shlex.quote(cfg["model"]) if cfg.get("model") else "MODEL"     # sglang-config --model DIR
    lines += [f'# python3 -m sglang.launch_server --model-path {model} "${{SGLANG_ARGS[@]}}"',
              f"# then: {cfg['check']}"]
    return "\n".join(lines + _notes(cfg)) + "\n"


def _notes(cfg: dict) -> list[str]:
    out = [f"# requires on GPU servers: {r}" for r in cfg["server_requirements"]]
    return out + [f"# note: {n}" for n in cfg["notes"]]


def render(cfg: dict, fmt: str = "json") -> str:
    """``cfg`` (``sglang_config``'s) printed as ``fmt``: ``json``, ``miles`` or ``shell``."""
    if fmt == "json":
        return json.dumps(cfg, indent=2) + "\n"
    if fmt == "miles":
        return format_miles(cfg)
    if fmt == "shell":
        return format_shell(cfg)
    raise ValueError(f"format must be one of {FORMATS}, got {fmt!r}")


def _embeddings(out: dict, mode: str, lookup: str) -> None:
    """The server env that serves precomputed embeddings: ``module:callable`` or a directory of records."""
    from ..errors import OptionsError
    from ..rollout.embeddings import DIR_ENV, LOOKUP_ENV
    if mode != "plugin":
        raise OptionsError("precomputed embeddings are served by vidcache's plugin only: use --mode plugin "
                           "(stock SGLang's /generate cannot carry them)")
    if ":" in lookup and not os.path.isabs(lookup):
        out["env"][LOOKUP_ENV] = lookup
    else:
        out["env"][DIR_ENV] = os.path.abspath(lookup)
    out["notes"].append("precomputed embeddings (frozen vision tower only): requests built with "
                        "prepare(..., embeddings=...) are served from the records this lookup returns, checked against "
                        "the requested key, grid and attested digest; SGLang's vision tower is not run for them "
                        "(docs/embeddings.md).")
