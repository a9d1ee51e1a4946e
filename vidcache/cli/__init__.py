"""The ``vidcache`` command: prewarm, ls, stats, verify, inspect, evict, gc, sglang-config, doctor, ...

Thin commands over the library (the node's settings, VIDCACHE_DIR and VIDCACHE_SHARED, are read by
``vidcache.config``; prewarm draws its own bar).  It imports lazily: commands that
only read manifests (``--help``, ``stats``, ``ls``, ``verify``, ``inspect``, ``sglang-config``, ``evict``,
``gc``, ``doctor``) never import torch, so they answer in a fraction of torch's import time
(benchmarks/cli_speed.py).

Each command's flags (``_add_<command>(sub)``) sit next to its handler (``cmd_<command>``), grouped by job:
  datasets   prewarm, pull, demo, embed: the commands that read a dataset's rows
  entries    ls, stats, verify, evict, gc, inspect: what a cache holds (prefixes: keys as ``ls`` prints them)
  engines    check-trainer, sglang-config, vllm-config, check-server, check-computation, serve: the rollout engines
  tier       tier-id, doctor: this node's settings and its shared tier
  common     what they share: the help format, the cache and option flags, sizes, the node's cache
This module assembles the parser, in the order ``--help`` lists the commands, and runs one.
"""
from __future__ import annotations

import argparse
import os
import sys

from . import datasets, engines, entries, tier
from .common import Help, node_dir, parse_size  # noqa: F401  (parse_size: Miles' size flags, tests)

EXAMPLES = """examples:
  vidcache demo --dir demo && vidcache prewarm demo/dataset.jsonl --cache demo/cache --workers 2
  VIDCACHE_DIR=/local/vidcache VIDCACHE_SHARED=s3://bucket/vidcache vidcache prewarm train.jsonl --ray
  vidcache ls && vidcache stats && vidcache doctor
  VIDCACHE_SHARED=s3://bucket/vidcache vidcache pull train.jsonl     # a fresh node, before the job starts
  vidcache prewarm train.jsonl --family qwen2_5_vl --fps 2 --max-pixels 200704 --failures failures.jsonl
  vidcache inspect clip.mp4 --family qwen3_vl --contact-sheet clip.png
  vidcache sglang-config --family qwen2_5_vl --mode plugin
  vidcache prewarm train.jsonl --model /ckpt/Qwen3.5-9B     # the family from the checkpoint (Qwen3.5: qwen3_vl)
  vidcache vllm-config --family qwen3_5                     # a model type is taken as its family, and said so
  vidcache embed train.jsonl --model /ckpt/Qwen3-VL-8B --dtype bfloat16   # frozen tower: embeddings, once
"""


def _version() -> str:
    from .. import __version__
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))      # vidcache/, above cli/
    return f"vidcache {__version__} ({package})"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="vidcache", description="Content-addressed video frame cache for VLM RL.",
                                 epilog=EXAMPLES, formatter_class=Help)
    ap.add_argument("--version", action="version", version=_version())
    sub = ap.add_subparsers(dest="cmd", required=True)
    for add in (engines._add_check_trainer, datasets._add_prewarm, datasets._add_pull, entries._add_ls,
                entries._add_stats, entries._add_verify, entries._add_evict, entries._add_gc, entries._add_inspect,
                engines._add_sglang_config, engines._add_vllm_config, tier._add_tier_id, tier._add_doctor,
                engines._add_check_server, engines._add_check_computation, engines._add_serve, datasets._add_demo, datasets._add_embed):
        add(sub)
    return ap


# Commands that walk the node's LMDB file and end on their own.  A few damaged pages make LMDB's C code read
# past the end of its map and die of SIGBUS, which no Python can catch; run as a program (``entry``), these
# commands work in a forked child, so that death becomes the same one-line [store] error as LMDB's own checks.
WALKS = ("ls", "stats", "verify", "evict", "gc", "inspect", "doctor")


def _walk_in_child(args) -> int | None:
    """Fork: None in the child (it runs the command); in the parent, the child's exit code, with a SIGBUS
    death reported as the damaged LMDB file it is."""
    import signal
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        _die_with_parent(parent)
        return None
    # What stops the parent (kill, timeout, a scheduler stopping the pid it started) stops the child (D36: a
    # killed `verify --upgrade` went on deleting); SIGKILL cannot be caught: the child's death signal covers it.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: os.kill(pid, signum))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except KeyboardInterrupt:       # Ctrl-C reached the child too: its exit is the answer
            continue
    if not os.WIFSIGNALED(status):
        return os.WEXITSTATUS(status)
    sig = signal.Signals(os.WTERMSIG(status))
    if sig == signal.SIGBUS:
        from ..config import NodeLayout
        from ..store.lmdb import crash_error
        e = crash_error(NodeLayout(node_dir(args)).lmdb_dir, sig.name)
        print(f"vidcache: error: [{e.kind}] {e}", file=sys.stderr)
        return 1
    print(f"vidcache: error: [internal] `vidcache {args.cmd}` died of {sig.name}", file=sys.stderr)
    return 128 + sig.value


def _die_with_parent(parent: int) -> None:
    """In a forked child: be sent SIGTERM when the parent dies, however it dies (Linux ``PR_SET_PDEATHSIG``),
    and exit now if it already has (the race between fork and the call)."""
    import ctypes
    import signal
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)        # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):                      # not Linux: only the forwarded signals stop it
        return
    if os.getppid() != parent:
        os._exit(1)


def entry() -> None:
    """The ``vidcache`` program (and ``python -m vidcache.cli``)."""
    try:
        try:
            code = main(isolate=True)
        except SystemExit as e:         # argparse's --help and usage errors: their output is flushed below too
            code = e.code
        sys.stdout.flush()              # inside the try: a pipe closed early fails here, not at exit
    except BrokenPipeError:
        # `vidcache inspect KEY | head`: the reader has gone, which is no error of the user's.  Later writes go
        # nowhere (Python would otherwise print a second error flushing stdout at exit), and the command ends as
        # one that SIGPIPE stopped reports itself to a shell (128 + 13), without a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 141
    sys.exit(code)


def main(argv: list[str] | None = None, *, isolate: bool = False) -> int:
    """Run one command; ``isolate`` (the program, not an in-process call) runs LMDB walks in a child."""
    from ..errors import VidcacheError
    args = build_parser().parse_args(argv)
    if isolate and args.cmd in WALKS and hasattr(os, "fork") \
            and (code := _walk_in_child(args)) is not None:
        return code
    try:
        return args.fn(args)
    except KeyboardInterrupt:                 # a second Ctrl-C (the first is the command's to handle)
        print(f"\nvidcache {args.cmd}: interrupted", file=sys.stderr)
        return 130
    except VidcacheError as e:
        print(f"vidcache: error: [{e.kind}] {e}", file=sys.stderr)
        if os.environ.get("VIDCACHE_DEBUG"):
            raise
        print("set VIDCACHE_DEBUG=1 for a full traceback", file=sys.stderr)
        return 1
