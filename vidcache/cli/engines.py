"""The commands for the rollout engines: what SGLang and vLLM must be given to reproduce the cache
(``sglang-config``, ``vllm-config``), whether a live server and the trainer's transformers do
(``check-server``, ``check-trainer``), whether it computes what the trainer's model does (``check-computation``),
and ``serve`` (frozen files over HTTP)."""
from __future__ import annotations

import json
import os
import sys

from ..engines import DEFAULT_ENGINE, ENGINES
from .common import (MODEL_HELP, add_cache_flags, cache_of, command, family_arg, family_help, family_of, has_local,
                     mode_default_help, node_dir, shared_url)


def _add_check_trainer(sub) -> None:
    p = command(sub, "check-trainer", help="does this environment's transformers put every token at the rollout "
                                           "engine's M-RoPE position? (else: pass vidcache.rope_positions)")
    p.add_argument("--family", action="append", metavar="MODEL_TYPE",
                   help="a model type: qwen2_vl, qwen2_5_vl, qwen3_vl, qwen3_5, qwen3_5_moe, qwen4_exp (repeatable; "
                        "default: all)")
    p.add_argument("--engine", default=DEFAULT_ENGINE, choices=sorted(ENGINES), help="the rollout engine")
    p.set_defaults(fn=cmd_check_trainer)


def cmd_check_trainer(args) -> int:
    """Does this environment's transformers compute the engine's M-RoPE positions?  (No GPU, no weights.)"""
    from ..positions import trainer_rule_problem
    bad = 0
    from ..families import MODEL_TYPES
    for family in args.family or MODEL_TYPES:
        problem = trainer_rule_problem(family, args.engine)
        print(f"OK   {family}: transformers' own positions are {args.engine}'s" if problem is None
              else f"FAIL [positions] {family}: {problem}")
        bad += problem is not None
    return 1 if bad else 0


def _add_sglang_config(sub) -> None:
    p = command(sub, "sglang-config", help="SGLang server flags that reproduce the cache")
    add_cache_flags(p)
    from ..sglang_facts import MODES
    p.add_argument("--family", type=family_arg, metavar="FAMILY", help=family_help("model family (or --model DIR)"))
    p.add_argument("--model", metavar="DIR", help=MODEL_HELP)
    p.add_argument("--mode", choices=sorted(MODES), help=mode_default_help())
    p.add_argument("--sglang-version", metavar="VERSION", help="the SGLang release the server runs (default: the "
                   "one installed here, else the newest verified)")
    from ..sglang_facts import VISION_FIXES
    p.add_argument("--vision", choices=VISION_FIXES,
                   help="where SGLang's own vision tower differs from the model's (Qwen2.5-VL: it attends across "
                        "frames), how the server computes the model's: package (vidcache's model package; keeps "
                        "SGLang's radix cache; default in plugin mode) or transformers (--model-impl transformers; "
                        "configuration only, no radix cache for video; default in stock mode)")
    p.add_argument("--embeddings", metavar="LOOKUP",
                   help="serve precomputed vision embeddings (plugin mode, frozen tower only): a directory of records "
                        "(sets VIDCACHE_EMBEDDINGS_DIR) or module:callable (VIDCACHE_EMBEDDINGS_LOOKUP)")
    p.add_argument("--format", choices=("json", "miles", "shell"), default="json",
                   help="json: the whole record; miles: a bash fragment for a Miles launch script (the SGLang "
                        "servers' env_vars as VIDCACHE_SGLANG_ENV, train.py's flags as the array "
                        "VIDCACHE_MILES_ARGS); shell: the env exported and SGLANG_ARGS, for a server started by hand")
    p.set_defaults(fn=cmd_sglang_config)


def cmd_sglang_config(args) -> int:
    from ..families import FAMILIES
    from ..sglang.config import render, sglang_config
    from ..sglang_facts import stock_distorts, stock_grid
    path = node_dir(args)
    # The cache (identity, largest frozen file) when this node has one or reaches a shared tier; on a fresh
    # node without either, the config alone.
    cache = cache_of(args, read_only=True) if (has_local(path) or shared_url(args, path)) else None
    family = family_of(args)
    if family is None:
        from ..errors import ConfigError
        raise ConfigError("sglang-config needs --family or --model DIR (the checkpoint)")
    cfg = sglang_config(family, args.mode, cache, args.sglang_version, vision=args.vision, embeddings=args.embeddings)
    if args.model:              # the checkpoint the user named, in place of MODEL in the launch line
        cfg["model"] = os.path.abspath(args.model)
    sys.stdout.write(render(cfg, args.format))
    if cfg["mode"] == "stock" and stock_distorts(family):
        print(f"note: stock mode serves {family} only on the {stock_grid(family)} grid (VideoOptions.for_stock_sglang), "
              f"which distorts aspect ratios; the default {FAMILIES[family].grid}-grid frames need --mode plugin",
              file=sys.stderr)
    return 0


def _add_vllm_config(sub) -> None:
    p = command(sub, "vllm-config", help="the vLLM engine settings that reproduce the cache (docs/vllm.md)")
    p.add_argument("--format", choices=("shell", "json"), default="shell",
                   help="shell: the `vllm serve` flags, shell-quoted; json: engine kwargs, flags and per-request kwargs")
    p.add_argument("--family", type=family_arg, metavar="FAMILY",
                   help=family_help("the served model's family (plain, uncached video files then go to vLLM's own "
                                    "loader for it)"))
    p.add_argument("--model", metavar="DIR", help=MODEL_HELP + "; printed in place of MODEL")
    add_cache_flags(p)
    p.set_defaults(fn=cmd_vllm_config)


# What every vLLM node needs besides the flags (docs/vllm.md): the loader resolves each reference in this node's
# cache, and a VLLM_PLUGINS list that leaves vidcache out never registers the loader.
VLLM_NODE_NOTE = ("on each vLLM node: the loader resolves every reference through that node's own VIDCACHE_DIR + "
                  "VIDCACHE_SHARED; if VLLM_PLUGINS restricts vLLM's plugins, it must include vidcache")


def vllm_node_env(args) -> dict:
    """The node settings the loader needs: the shared tier this node is configured with, else placeholders (as
    ``sglang-config`` prints them; a shell fragment turns those into ``${VAR:?...}``)."""
    from ..config import ENV_DIR, ENV_SHARED
    shared = shared_url(args, node_dir(args))
    return {ENV_DIR: "<a node-local directory on each vLLM node (never NFS)>",
            ENV_SHARED: shared or "<the cluster's shared tier: NFS path or s3://bucket/prefix>"}


def cmd_vllm_config(args) -> int:
    from ..config import export_line
    from ..vllm.config import MM_PROCESSOR_KWARGS, engine_kwargs, serve_flags
    args.family = family_of(args)
    if args.family is None:     # the loader then hands plain (uncached) files to opencv, not the model's own loader
        print("note: without --family, plain (uncached) video files go to VLLM_VIDEO_LOADER_BACKEND (opencv), not "
              "the model's own loader", file=sys.stderr)
    env = vllm_node_env(args)
    if args.format == "json":
        print(json.dumps({"engine_kwargs": engine_kwargs(args.family), "serve_flags": serve_flags(args.family),
                          "mm_processor_kwargs": MM_PROCESSOR_KWARGS, "env": env, "notes": [VLLM_NODE_NOTE]},
                         indent=2))
    else:               # shell-quoted: pasted into a shell, the JSON reaches vLLM with its quotes
        import shlex
        print(f"# {VLLM_NODE_NOTE}")
        for k, v in env.items():
            print(export_line(k, v))
        model = shlex.quote(os.path.abspath(args.model)) if args.model else "MODEL"
        print(f"vllm serve {model} {shlex.join(serve_flags(args.family))}")
    return 0


def _add_check_server(sub) -> None:
    from ..sglang_facts import MODES
    p = command(sub, "check-server", help="check that a live SGLang server reproduces the trainer's inputs "
                                          "(exit 0 only when parity is established)")
    p.add_argument("url", metavar="URL", help="the SGLang server, e.g. http://127.0.0.1:30000")
    add_cache_flags(p)
    p.add_argument("--family", type=family_arg, metavar="FAMILY",
                   help=family_help("default: derived from --processor DIR (its processor classes and vision "
                                    "config) and the server's model_type; else"))
    p.add_argument("--mode", choices=sorted(MODES), help=mode_default_help())
    p.add_argument("--processor", metavar="DIR", help="the checkpoint's processor (default: the server's "
                                                      "tokenizer_path, when it exists here)")
    p.add_argument("--allow-unverified-sglang", metavar="VERSION",
                   help="accept this exact SGLang version although vidcache is not verified with it")
    p.add_argument("--server-torchcodec", metavar="VERSION",
                   help="stock mode on a GPU server: the torchcodec version installed there")
    p.add_argument("--server-vision", choices=("package",),
                   help="stock mode: the servers run vidcache's model package (SGLANG_EXTERNAL_MODEL_PACKAGE; no "
                        "endpoint reports it, and in stock mode there is no plugin to ask)")
    p.add_argument("--token-layout", metavar="LAYOUT", help="the token layout the trainer's ids are in (default: "
                   "$VIDCACHE_TOKEN_LAYOUT, else the model's own in plugin mode and this transformers' in stock mode)")
    p.add_argument("--engine", choices=sorted(ENGINES), default=DEFAULT_ENGINE,
                   help="the server's engine (default: %(default)s; vllm: a vLLM OpenAI server with vidcache's "
                        "loader, docs/vllm.md)")
    p.add_argument("--allow-unverified-vllm", metavar="VERSION",
                   help="--engine vllm: accept this exact vLLM version although vidcache is not verified with it")
    # One bound for the whole check: a per-read timeout never trips on a server that drips a byte a second (D60).
    p.add_argument("--timeout", type=float, default=300.0, metavar="S",
                   help="give up on the server, as a [server] failure, once the whole check has waited on it this "
                        "many seconds (default %(default)g)")
    p.set_defaults(fn=cmd_check_server)


def cmd_check_server(args) -> int:
    from ..rollout.check import check_deadline, check_url
    args.url = check_url(args.url)          # a [config] error naming the fix, before any import or request
    cache = cache_of(args) if (args.cache or args.shared) else None       # default: this node's configuration
    eng = ENGINES[args.engine]
    check_server = eng.adapter("check").check_server
    if not eng.modes:                   # one path (vidcache's loader): --mode and the SGLang-only flags do not apply
        run = lambda: check_server(args.url, args.family, args.processor, args.allow_unverified_vllm,  # noqa: E731
                                   cache=cache, token_layout=args.token_layout, timeout=args.timeout)
    else:
        run = lambda: check_server(args.url, args.family, args.mode, args.processor,  # noqa: E731
                                   args.allow_unverified_sglang, args.server_torchcodec, cache=cache,
                                   token_layout=args.token_layout, timeout=args.timeout,
                                   server_vision=args.server_vision)
    with check_deadline(args.timeout):  # from here, not from the imports above (seconds on a busy trainer node)
        res = run()
    print("\n".join(res.lines()))
    return 0 if res.ok else 1


def _add_check_computation(sub) -> None:
    from ..sglang_facts import MODES
    p = command(sub, "check-computation", help="do a live server's logprobs equal the trainer's model's on canary "
                                               "requests (text, image, videos, a second turn)? (exit 0 only then)")
    p.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:30000")
    add_cache_flags(p)
    p.add_argument("--model", metavar="CKPT", required=True, help="the checkpoint the server runs and the trainer "
                   "trains (its directory: transformers' class for it scores the canaries)")
    p.add_argument("--engine", choices=sorted(ENGINES), default=DEFAULT_ENGINE, help="the server's engine")
    p.add_argument("--mode", choices=sorted(MODES), help="SGLang: the servers' mode (" + mode_default_help() + ")")
    p.add_argument("--device", default="cpu", help="where the trainer's model runs: cpu, cuda, cuda:N")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="the trainer's model's dtype")
    p.add_argument("--top-k", type=int, metavar="K", help="logprobs asked per position (default: the full "
                   "vocabulary up to 4096 tokens, else 20; vLLM: at most its --max-logprobs)")
    p.add_argument("--max-logprobs", type=int, default=20, metavar="N",
                   help="--engine vllm: the server's --max-logprobs (default vLLM's 20)")
    p.add_argument("--threshold", type=float, metavar="X", help="pass bound on the mean KL per token, nats (any one "
                   "token: 10x); default: from the measured floor for --device/--dtype (docs/benchmarks.md)")
    p.add_argument("--trainer-positions", choices=("engine", "transformers"), default="engine",
                   help="diagnostic: the M-RoPE rule the trainer side scores at (engine: vidcache.rope_positions, "
                        "what the trainer must use; transformers: its own rule, as a trainer without it)")
    p.add_argument("--token-layout", metavar="LAYOUT", help="the token layout the trainer's ids are in (as "
                   "check-server; vLLM's chat endpoint: wrapped for Qwen3-VL)")
    p.set_defaults(fn=cmd_check_computation)


def cmd_check_computation(args) -> int:
    from ..rollout.check import check_url
    from ..sglang_facts import default_mode
    args.url = check_url(args.url)
    cache = cache_of(args) if (args.cache or args.shared) else None       # default: this node's configuration
    kw = {"device": args.device, "dtype": args.dtype, "top_k": args.top_k, "threshold": args.threshold,
          "trainer_positions": None if args.trainer_positions == "engine" else args.trainer_positions}
    eng = ENGINES[args.engine]
    check_computation = eng.adapter("computation").check_computation
    if not eng.modes:
        res = check_computation(args.url, args.model, cache=cache, token_layout=args.token_layout,
                                max_logprobs=args.max_logprobs, **kw)
    else:
        from ..families import derive
        mode = args.mode or default_mode(derive(args.model).family)
        res = check_computation(args.url, args.model, mode, cache=cache, token_layout=args.token_layout, **kw)
    print("\n".join(res.lines()))
    return 0 if res.ok else 1


def _add_serve(sub) -> None:
    p = command(sub, "serve", help="serve frozen files over HTTP (for SGLang nodes without a shared filesystem)")
    add_cache_flags(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8765, help="port to listen on")
    from .. import sglang_facts as srv     # the server's defaults (a facts module: cheap to import)
    p.add_argument("--workers", type=int, metavar="N",
                   help=f"threads handling requests; idle connections hold none (default {srv.DEFAULT_WORKERS})")
    p.add_argument("--timeout", type=float, metavar="S",
                   help=f"close a connection idle or stalled this many seconds (default {srv.DEFAULT_TIMEOUT_S:g})")
    # A total deadline: --timeout is per read, and a client dripping a byte at a time never trips it.
    p.add_argument("--header-timeout", type=float, metavar="S",
                   help="close a connection whose request line and headers are not all in this many seconds "
                        f"after it connected (default {srv.DEFAULT_HEADER_TIMEOUT_S:g})")
    # Bounds the send of a response: a client reading a trickle would otherwise hold a worker for ever.
    p.add_argument("--min-rate", type=float, metavar="BYTES_PER_S",
                   help="close a connection that reads a response slower than this on average, after --timeout "
                        f"seconds of grace (default {srv.DEFAULT_MIN_RATE})")
    # So that one client cannot take every worker or fill the server's table of connections.
    p.add_argument("--max-per-client", type=int, metavar="N",
                   help="connections one client address may hold at once; more are refused with a 503; raise it "
                        f"for a node that fetches more files in parallel (default {srv.DEFAULT_MAX_PER_CLIENT})")
    # So that one address's slow readers cannot hold every worker (its connection cap is above the pool size).
    p.add_argument("--max-workers-per-client", type=int, metavar="N",
                   help="workers one client address may occupy at once; its further requests wait for one of "
                        "them; raise it when a single node is the only client (default half of --workers, at "
                        f"least 1: {srv.default_max_workers_per_client(srv.DEFAULT_WORKERS)} of "
                        f"{srv.DEFAULT_WORKERS})")
    p.set_defaults(fn=cmd_serve)


def cmd_serve(args) -> int:
    from ..sglang.server import make_server
    limits = {k: v for k, v in (("workers", args.workers), ("timeout_s", args.timeout),
                                ("header_timeout_s", args.header_timeout), ("min_rate", args.min_rate),
                                ("max_per_client", args.max_per_client),
                                ("max_workers_per_client", args.max_workers_per_client)) if v is not None}
    srv = make_server(cache_of(args), args.host, args.port, **limits)
    host, port = srv.server_address[:2]
    from ..sglang.frozen import FORMATS
    from ..serving import SERVING_FORMAT
    print(f"serving frozen files of {args.cache or 'the default cache'} at "
          f"http://{host}:{port}/frozen/<key>{FORMATS[SERVING_FORMAT].suffix} "
          f"({srv.workers} workers, {srv.timeout_s:g} s timeout)", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
    return 0
