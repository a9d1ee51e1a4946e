"""Before the first rollout: ``vidcache check-server`` against every SGLang server of the run.

The same check as the CLI (``vidcache.sglang.check.check_server``: version, ``mm_process_config``, plugin,
canary ids, attestation, torchcodec), run once per process against each worker the router lists
(Miles' own ``get_worker_urls``), or against the router's address where it lists none.  A failure stops
the run at its first rollout with the CLI's lines (``vidcache.ParityError``), before any sample is
generated; ``--no-vidcache-check-servers`` switches it off.

``--vidcache-check-computation warn|fail`` (off by default) then runs ``vidcache check-computation`` against each
server with the HF checkpoint's model (``--hf-checkpoint``: transformers' class, not Megatron's; on the GPU in bf16
where that pair has a measured floor, else CPU fp32), logs its table, and
warns or fails above the threshold.  The CPU dry run (examples/miles_cpu_dry_run.py) runs it against a real server
given with ``--server`` (its stand-in serves no model).
"""
from __future__ import annotations

import asyncio
import logging
import threading

from vidcache.errors import ParityError

from vidcache.sglang.config import MILES_TRAIN_HOOK

from .args import VidcacheConfig, _get

logger = logging.getLogger(__name__)
# The fixes a failure names, in this run's spelling (Miles' train.py flags), not the CLI's.
MILES_FLAGS = {"allow_unverified": "--vidcache-allow-unverified-sglang",
               "server_torchcodec": "--vidcache-server-torchcodec", "mode": "--vidcache-mode",
               "server_vision": "--vidcache-server-vision package"}
_DONE: dict[tuple, list[str] | None] = {}      # (urls, family, mode) -> None (passed) or the failure lines
_LOCK = threading.Lock()                        # the check runs in worker threads; one at a time


async def server_urls(args) -> list[str]:
    router = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    try:
        from miles.rollout.inference_rollout.inference_rollout_train import get_worker_urls
        urls = await get_worker_urls(args)
    except Exception as e:  # noqa: BLE001 -- any router without a worker list: check through the router itself
        logger.info("vidcache: the router at %s lists no workers (%s); checking the router's address", router, e)
        urls = []
    return list(urls) or [router]


async def ensure_servers_checked(args, processor, cfg: VidcacheConfig | None = None) -> None:
    """Run the check once per process (per server set and mode); raise ``ParityError`` on any cause."""
    if not _get(args, "vidcache_check_servers"):
        return
    cfg = cfg or VidcacheConfig.from_args(args)
    urls = tuple(await server_urls(args))
    failed = await asyncio.to_thread(_checked, urls, processor, cfg, args)
    if failed:
        raise ParityError("\n".join(failed))


def _checked(urls, processor, cfg: VidcacheConfig, args) -> list[str] | None:
    k = (urls, cfg.options.family, cfg.mode)
    with _LOCK:
        if k not in _DONE:
            _DONE[k] = _check_all(urls, processor, cfg, args)
        return _DONE[k]


def trainer_gets_engine_positions(args) -> bool:
    """Whether Miles' trainer computes SGLang's M-RoPE positions: vidcache's train hooks are its
    ``--custom-megatron-init-path`` and ``--vidcache-positions`` is not ``transformers`` (docs/miles.md,
    "Positions")."""
    hook = getattr(args, "custom_megatron_init_path", None) or ""
    return hook == MILES_TRAIN_HOOK and _get(args, "vidcache_positions") != "transformers"


def positions_verdict(args, family: str) -> tuple[bool, str]:
    """(ok, line): does this run's trainer put every token where SGLang does?  Yes with the train hook; yes when the
    trainer's own transformers agrees (``check-trainer``'s canary); a stated ``--vidcache-positions transformers`` is
    the operator's choice (a warning).  Otherwise the job fails at startup, naming the flag."""
    from vidcache.positions import trainer_rule_problem
    if trainer_gets_engine_positions(args):
        return True, f"OK   [positions] the train hook ({MILES_TRAIN_HOOK}) gives the trainer SGLang's M-RoPE rule"
    problem = trainer_rule_problem(family, "sglang")
    if problem is None:
        return True, f"OK   [positions] this transformers' own {family} rule is SGLang's"
    if _get(args, "vidcache_positions") == "transformers":
        return True, (f"WARN [positions] --vidcache-positions transformers: the trainer keeps transformers' own rule, "
                      f"which is not SGLang's: {problem}")
    return False, (f"FAIL [positions] {problem}. Set --custom-megatron-init-path {MILES_TRAIN_HOOK} (`vidcache "
                   "sglang-config --format miles` includes it), or --vidcache-positions transformers to train at "
                   "transformers' positions knowingly")


def _check_all(urls, processor, cfg: VidcacheConfig, args) -> list[str] | None:
    from vidcache.sglang.check import check_server
    if processor is None:
        return [f"FAIL [processor] --hf-checkpoint has no processor: vidcache cannot send {urls[0]} a canary"]
    cache = cfg.open_cache()
    failed = []
    ok, line = positions_verdict(args, cfg.options.family)
    (logger.info if line.startswith("OK") else logger.warning)("vidcache: %s", line)
    if not ok:
        failed.append(line)
    for url in urls:
        res = check_server(url, cfg.options.family, cfg.mode, processor,
                           allow_unverified=_get(args, "vidcache_allow_unverified_sglang"),
                           server_torchcodec=_get(args, "vidcache_server_torchcodec"), cache=cache,
                           flags=MILES_FLAGS, trainer_positions=False,     # positions_verdict above decides
                           server_vision=_get(args, "vidcache_server_vision"))
        (logger.info if res.ok and not res.warnings else logger.warning)("vidcache: %s", "\n".join(res.lines()))
        if not res.ok:
            failed += res.lines()
        elif _get(args, "vidcache_check_computation") != "off":
            failed += computation_failures(url, args, cfg, cache)
    return failed or None


def computation_failures(url: str, args, cfg: VidcacheConfig, cache) -> list[str]:
    """``check-computation`` against ``url`` with ``--hf-checkpoint``'s model: the lines that fail the job (none
    with ``--vidcache-check-computation warn``: they are logged only)."""
    import torch

    from vidcache.rollout.computation import FLOORS
    from vidcache.sglang.computation import check_computation
    # the trainer's GPU in bf16 where that pair has a measured floor (the pass threshold), else CPU fp32
    cuda = torch.cuda.is_available() and ("cuda", "bfloat16") in FLOORS
    res = check_computation(url, args.hf_checkpoint, cfg.mode, cache=cache, family=cfg.options.family,
                            device="cuda" if cuda else "cpu", dtype="bfloat16" if cuda else "float32",
                            trainer_positions=None if trainer_gets_engine_positions(args) else "transformers")
    if any(c.kind == "positions" for c in res.causes) and not trainer_gets_engine_positions(args):
        # the fix in this run's spelling: Miles' trainer gets the engine's positions from the train hook
        res.notes.append(f"in Miles: set --custom-megatron-init-path {MILES_TRAIN_HOOK} and drop "
                         "--vidcache-positions transformers (the trainer then computes SGLang's M-RoPE positions)")
    (logger.info if res.ok else logger.warning)("vidcache: %s", "\n".join(res.lines()))
    return res.lines() if not res.ok and _get(args, "vidcache_check_computation") == "fail" else []
