"""A CPU dry run of a Miles video GRPO step with vidcache: Miles' own rollout loop, vidcache's data source and
generate function, and an SGLang stand-in that runs SGLang's own Qwen-VL processor on every request.

    bash scripts/install.sh --test                 # once: the test peers (SGLang's processor) and Miles' packages
    MILES_SRC=/path/to/miles .venv/bin/python examples/miles_cpu_dry_run.py [--mode stock|plugin] [--keep DIR]
        [--server URL --server-model CKPT [--startup-only]] [-- TRAIN.PY FLAGS, e.g. --vidcache-check-computation warn]

What it does, in a scratch directory (or ``--keep DIR``), with nothing downloaded:
  1. writes a toy Qwen2.5-VL checkpoint (vidcache.testing's offline processor), three small clips and a Miles
     prompt file (a ``<video>`` row, a message-list row with a per-video fps, a text-only row);
  2. prewarms it with the CLI (``vidcache prewarm``), as docs/miles.md section 3 says;
  3. starts the stand-in server (tests/support/sglang_standin.py: Miles' MockSGLangServer whose ``/generate``
     runs SGLang's ``QwenVLImageProcessor`` with the config `vidcache sglang-config` prints);
  4. takes train.py's vidcache flags from ``vidcache sglang-config --format miles`` (what
     examples/miles/qwen2_5_vl_video_grpo.sh sources) and runs one training rollout through Miles' own
     ``load_function``: ``--data-source-path`` / ``--rollout-function-path`` / ``--custom-generate-function-path``
     as a launch sets them.  The startup check (check-server) runs first, as in a job.
  5. prints each sample and checks that the tensors the trainer gets equal SGLang's processor output for the
     same request (``torch.equal``), and that SGLang's expanded prompt equals the sample's tokens.
Exit 0 when every check holds.  tests/test_examples.py runs it in CI.

With ``--server URL --server-model CKPT`` (a real SGLang server of this ``--mode`` serving the checkpoint CKPT, on
this node: plugin mode resolves references through ``$VIDCACHE_DIR``, as the server does), step 4 first runs what a
job runs before its first rollout against that server, with CKPT as ``--hf-checkpoint``: ``check-server``, and with
``--vidcache-check-computation warn|fail`` (``fail`` unless a flag after ``--`` says otherwise) ``check-computation``,
whose table is logged.  A failure stops the dry run there (exit 1), as it stops a job; ``warn`` logs and goes on.  The
stand-in serves no model, so the computation check never runs against it.  tests/sglang_server/ runs this against
SGLang's own CPU server.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]     # vidcache and the test support (the stand-in, the toy checkpoint)
FAMILY = "qwen2_5_vl"
ROLLOUT_FN = "miles_integration.rollout.VidcacheRolloutFn"
OPTIONS = ["--fps", "1", "--min-pixels", "3136", "--max-pixels", "50176"]     # small clips, small prompts


def vidcache_cli(*argv: str, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "vidcache.cli", *argv], check=True, text=True,
                          capture_output=True, env=env, **kw)


def miles_flags(mode: str, sglang_version: str) -> list[str]:
    """train.py's flags from `vidcache sglang-config --format miles` (the VIDCACHE_MILES_ARGS array it defines)."""
    out = vidcache_cli("sglang-config", "--family", FAMILY, "--mode", mode, "--sglang-version", sglang_version,
                       "--format", "miles").stdout
    body = re.search(r"^VIDCACHE_MILES_ARGS=\((.*?)^\)", out, re.S | re.M).group(1)
    return shlex.split(body, comments=True)


def write_inputs(root: Path) -> Path:
    from support.toy_processors import save_checkpoint
    from vidcache.testing.videos import make_video
    save_checkpoint(FAMILY, root / "ckpt", CHAT_TEMPLATE)
    (root / "videos").mkdir(exist_ok=True)
    for name, seed in (("a", 0), ("b", 1)):
        make_video(str(root / "videos" / f"{name}.mp4"), codec="h264", width=160, height=120, fps=10, n_frames=30,
                   seed=seed)
    rows = [{"prompt": "<video>\nWhat colour is the square?", "videos": ["videos/a.mp4"], "label": "red"},
            {"prompt": [{"role": "user", "content": [{"type": "video", "video": "videos/b.mp4", "fps": 2.0},
                                                     {"type": "text", "text": "What moves?"}]}], "label": "red"},
            {"prompt": "What is 1+7?", "label": "8"}]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data


CHAT_TEMPLATE = (   # Qwen2.5-VL's, reduced to what these prompts use
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] == 'video' or 'video' in c %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("stock", "plugin"), default="stock")
    ap.add_argument("--keep", metavar="DIR", help="work in DIR and keep it (default: a scratch directory)")
    ap.add_argument("--server", metavar="URL", help="a real SGLang server of this --mode for the startup check")
    ap.add_argument("--server-model", metavar="CKPT", help="the checkpoint --server serves (the trainer's model)")
    ap.add_argument("--startup-only", action="store_true", help="stop after the startup check against --server")
    ap.add_argument("train_flags", nargs="*", metavar="-- FLAG",
                    help="more train.py flags after --, e.g. --vidcache-check-computation warn")
    a = ap.parse_args(argv)
    if bool(a.server) != bool(a.server_model) or (a.startup_only and not a.server):
        ap.error("--server and --server-model go together (and --startup-only needs them)")

    from support.miles_compat import SKIP_REASON, add_miles_to_path, install_test_shims, miles_src
    src = miles_src(REPO)
    if src is None:
        print(f"miles_cpu_dry_run: {SKIP_REASON}", file=sys.stderr)
        return 2
    add_miles_to_path(src)
    install_test_shims()        # only where the installed SGLang lacks a module Miles imports (see miles_compat)
    with (tempfile.TemporaryDirectory(prefix="vidcache-dry-run-") if a.keep is None else _kept(a.keep)) as d:
        return run_step(Path(d), a.mode, a.train_flags, a.server, a.server_model, a.startup_only)


class _kept:
    def __init__(self, d):
        Path(d).mkdir(parents=True, exist_ok=True)
        self.d = d

    def __enter__(self):
        return self.d

    def __exit__(self, *exc):
        return False


def run_step(root: Path, mode: str, extra: list[str] = (), server_url: str | None = None,
             server_model: str | None = None, startup_only: bool = False) -> int:
    import importlib.metadata as md

    import torch
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput
    from miles.utils import http_utils
    from miles.utils.async_utils import run
    from miles.utils.http_utils import find_available_port
    from miles.utils.misc import load_function

    from miles_integration.meta import request_state
    from support import sglang_peer
    from support.miles_smoke_example import make_miles_args
    from support.sglang_standin import SGLangStandIn
    from support.toy_processors import build_processor

    data = write_inputs(root)
    cache, shared = root / "node-cache", root / "shared-tier"
    print(f"dry run: {root} ({mode} mode)")
    print(vidcache_cli("prewarm", str(data), "--cache", str(cache), "--shared", str(shared), "--family", FAMILY,
                       *OPTIONS, "--no-progress", "--workers", "1").stderr.strip().splitlines()[-1])

    version = md.version("sglang")              # the stand-in runs the installed SGLang's own processor
    flags = miles_flags(mode, version)
    if server_url and "--vidcache-check-computation" not in extra:
        extra = ["--vidcache-check-computation", "fail", *extra]
    print("train.py flags from sglang-config:", shlex.join(flags), "+", shlex.join(extra))
    parser = argparse.ArgumentParser()
    parser.add_argument("--sglang-mm-process-config", type=json.loads)
    parser.add_argument("--sglang-model-impl")                  # stock mode: SGLang runs transformers' model code
    parser.add_argument("--custom-megatron-init-path")          # the train hook: SGLang's positions in the trainer
    # the --vidcache-* flags as Miles registers them: its parser calls the rollout function's ``add_arguments``
    # (miles/utils/arguments.py, add_user_provided_function_arguments)
    load_function(ROLLOUT_FN).add_arguments(parser)
    parsed = parser.parse_args(flags + ["--vidcache-fps", "1", "--vidcache-min-pixels", "3136",
                                        "--vidcache-max-pixels", "50176", *extra])
    if server_url and not startup_check(server_url, server_model, parsed):
        return 1
    if startup_only:
        return 0

    os.environ.update(VIDCACHE_DIR=str(root / "server-node-cache"), VIDCACHE_SHARED=str(shared))  # plugin mode
    plugin_cls = None
    if mode == "plugin":        # SGLang's processor replaced by vidcache's plugin, as SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE does
        from vidcache.sglang.plugin.qwen_vl import VidcacheQwenVLProcessor as plugin_cls
    peer = sglang_peer.build_peer(FAMILY, build_processor(FAMILY), processor_cls=plugin_cls,
                                  video_config=parsed.sglang_mm_process_config["video"])
    server = SGLangStandIn(family=FAMILY, model_name=str(root / "ckpt"), host="127.0.0.1",
                           port=find_available_port(32000), peer=peer)
    server.server_info["mm_process_config"] = parsed.sglang_mm_process_config
    server.start()
    try:
        args = make_miles_args(hf_checkpoint=str(root / "ckpt"), router_port=server.port, prompt_data=str(data),
                               input_key="prompt", multimodal_keys={"video": "videos"}, rollout_batch_size=3,
                               over_sampling_batch_size=3, n_samples_per_prompt=2, rollout_max_response_len=32,
                               data_source_path="miles_integration.data_source.VidcacheDataSource",
                               rollout_function_path=ROLLOUT_FN,
                               custom_generate_function_path="miles_integration.generate.generate",
                               custom_rm_path="examples_dry_run.reward", vidcache_cache=str(cache),
                               vidcache_shared=str(shared))
        vidcache_flags(args, parsed)
        args.vidcache_check_computation = "off"     # the stand-in serves no model (the check ran against --server)
        from miles_integration.server_check import positions_verdict
        print("positions:", positions_verdict(args, FAMILY)[1])      # the startup check fails the job on FAIL
        http_utils.init_http_client(args)
        from miles.utils.misc import function_registry

        async def reward(args, sample, **kw):
            return float("red" in (sample.response or ""))

        with function_registry.temporary("examples_dry_run.reward", reward):
            data_source = load_function(args.data_source_path)(args)
            rollout = load_function(args.rollout_function_path)(
                RolloutFnConstructorInput(args=args, data_source=data_source))
            groups = run(rollout(RolloutFnTrainInput(rollout_id=0))).samples
        data_source.close()
        return report(groups, server, torch, request_state)
    finally:
        server.stop()


def vidcache_flags(args, parsed) -> None:
    """The parsed train.py flags onto Miles' args (those this dry run did not set itself)."""
    for k, v in vars(parsed).items():
        if k.startswith("vidcache_") and v is not None:
            setattr(args, k, v)
    args.custom_megatron_init_path = parsed.custom_megatron_init_path


def startup_check(url: str, ckpt: str, parsed) -> bool:
    """What a job runs before its first rollout (``VidcacheRolloutFn._call_train``'s ``ensure_servers_checked``)
    against the real server at ``url``, ``ckpt`` as ``--hf-checkpoint``; the node's cache from ``$VIDCACHE_DIR``."""
    import logging
    from urllib.parse import urlsplit

    from miles.rollout.inference_rollout.inference_rollout_common import GenerateState
    from miles.utils.async_utils import run

    from miles_integration.server_check import ensure_servers_checked
    from support.miles_smoke_example import make_miles_args
    from vidcache.errors import ParityError
    log = logging.getLogger("miles_integration")        # the check's table and verdicts, as a job's log has them
    if not log.handlers:
        h = logging.StreamHandler(sys.stdout)
        h.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        log.addHandler(h)
    log.setLevel(logging.INFO)
    u = urlsplit(url)
    args = make_miles_args(hf_checkpoint=ckpt, router_ip=u.hostname, router_port=u.port)
    vidcache_flags(args, parsed)
    print(f"startup check against {url} (--hf-checkpoint {ckpt}, --vidcache-check-computation "
          f"{args.vidcache_check_computation})")
    t0 = time.monotonic()
    try:
        run(ensure_servers_checked(args, GenerateState(args).processor))
    except ParityError as e:
        print(f"dry run: startup check FAILED ({time.monotonic() - t0:.0f} s), the job would stop here:\n{e}")
        return False
    print(f"startup check: ok ({time.monotonic() - t0:.0f} s)")
    return True


def report(groups, server, torch, request_state) -> int:
    by_ids = {json.dumps(r["payload"]["input_ids"]): r for r in server.log if r["payload"].get("video_data")}
    bad = 0
    for g in groups:
        for s in g:
            st = request_state(s.metadata)
            if st is None:
                print(f"  text row: {len(s.tokens)} tokens, Miles' own single_turn, reward {s.reward}")
                continue
            rec = by_ids[json.dumps(st["compact_ids"])]
            same_ids = s.tokens[: st["prompt_len"]] == rec["expanded"]
            mm, peer = s.multimodal_train_inputs, rec["peer"]
            same = all(torch.equal(mm[k], torch.as_tensor(peer[k], dtype=mm[k].dtype)) for k in
                       ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts"))
            bad += not (same and same_ids and str(s.status).endswith("COMPLETED"))
            print(f"  video row: {len(st['compact_ids'])} compact ids to SGLang, {st['prompt_len']} expanded "
                  f"(SGLang's: {'equal' if same_ids else 'DIFFERENT'}), video_data {st['video_data'][0][:48]}..., "
                  f"train tensors {'torch.equal to' if same else 'DIFFER from'} SGLang's processor output, "
                  f"reward {s.reward}")
    print(f"dry run: {'ok' if not bad else f'{bad} sample(s) FAILED'}: {sum(map(len, groups))} samples, "
          f"{len(server.log)} requests to the stand-in")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
