"""SGLang 0.5.23's own server (``python -m sglang.launch_server``: its tokenizer manager, scheduler, ``/generate``)
on the CPU, on tiny random-weight checkpoints of transformers' own classes (Qwen2.5-VL, Qwen3-VL), started with
exactly ``vidcache sglang-config``'s flags and env for each family and mode.  EXPERIMENTAL: the environment is
``scripts/setup_sglang_server.sh``'s, with ``support/sgl_kernel_shim`` for the ``sgl_kernel`` CPU symbols SGLang
reads at import (see docs/testing.md, "SGLang's own server on CPU").  fp32, CPU, torch-native attention.

One server per (family, mode, vision), shared by every test of it:

* ``qwen2_5_vl`` plugin: sglang-config's default, vidcache's model package (``SGLANG_EXTERNAL_MODEL_PACKAGE``);
* ``qwen2_5_vl`` stock: sglang-config's default, ``--model-impl transformers`` (no vidcache code on the server);
* ``qwen2_5_vl`` plugin, SGLang's model *as shipped* (the fix taken out): what the fix fixes;
* ``qwen3_vl`` plugin and stock: SGLang's own Qwen3-VL code (it attends per frame already).

Every server reads precomputed vision embeddings from the node's directory of records (``$VIDCACHE_EMBEDDINGS_DIR``);
the plugin servers serve them (``prepare(..., embeddings=)``): SGLang skips its tower, and its logprobs sit at the
noise floor against transformers fed the same record, on every plugin server, SGLang's shipped Qwen2.5-VL included
(its tower is not run); a record of another tower, or other rows under the right key, is refused.

What it shows, per server:
* ``vidcache check-server`` (the CLI) establishes parity, or, on the shipped Qwen2.5-VL model, fails naming the vision
  tower and the fix;
* a prepared request's ``/generate``: the guard passes (SGLang's ``prompt_token_ids`` are the trainer's
  ``expanded_ids``), and SGLang's full-vocabulary prompt + sample logprobs against transformers' model **as shipped**
  (per-temporal-patch vision attention) on ``train_inputs``, with M-RoPE positions from
  ``vidcache.rope_positions(request=req)`` (checked ``torch.equal`` to SGLang's own ``get_rope_index``):
  - one temporal patch: at the noise floor everywhere;
  - several temporal patches: at the noise floor wherever the server computes the model's vision tower; on the
    shipped model far above it, and back at the floor only when transformers is made to attend across the video as
    SGLang's does (this pins SGLang's behaviour: the test fails when SGLang changes it);
  - transformers' own position rule instead of the engine's, where it differs: far above the floor.
The figures go to docs/benchmarks.md's KL table (printed with ``-s``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import sglang_server as ss

if not ss.server_python().exists():     # install.sh --test builds it: its absence is a failure, never a skip
    pytest.fail(f"SGLang server environment not built ({ss.server_venv()}): run scripts/setup_sglang_server.sh "
                "(scripts/install.sh --test does)", pytrace=False)

import torch  # noqa: E402

import vidcache  # noqa: E402
from support.tiny_checkpoint import load_tiny_model, write_tiny_checkpoint  # noqa: E402
from vidcache import VideoCache, VideoOptions, prepare  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER  # noqa: E402
from vidcache.rollout.computation import across_video_attention, kl_per_token, threshold_for  # noqa: E402
from vidcache.rollout.embeddings import DIR_ENV, DirectoryLookup  # noqa: E402
from vidcache.testing.videos import make_video  # noqa: E402

pytestmark = [pytest.mark.peer, pytest.mark.slow]
VIDCACHE = Path(sys.executable).parent / "vidcache"
# The floor measured here (fp32, SGLang's torch-native CPU path vs transformers' SDPA): mean KL ~1e-8 nats/token,
# max |d logprob| ~1e-4.  The bounds (check-computation's CPU fp32 threshold) sit far below what a computation
# mismatch gives (~1-2 nats/token).
_CPU_FP32 = threshold_for("cpu", "float32")
FLOOR_MEAN_KL, FLOOR_MAX_KL = _CPU_FP32.mean, _CPU_FP32.max
FAR = 1e-2
PROMPT = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe.<|im_end|>\n<|im_start|>assistant\n"

# (family, mode, vision): sglang-config's defaults per family and mode, and Qwen2.5-VL as SGLang ships it.
# sglang-config's default Qwen2.5-VL plugin server (a test marked with it runs there only)
DEFAULT_QWEN2_5_PLUGIN = pytest.mark.servers(lambda family, mode, vision: (family, mode, vision) ==
                                             ("qwen2_5_vl", "plugin", None))
SERVERS = [("qwen2_5_vl", "plugin", None), ("qwen2_5_vl", "stock", None), ("qwen2_5_vl", "plugin", ss.SHIPPED),
           ("qwen3_vl", "plugin", None), ("qwen3_vl", "stock", None)]


def options(family: str, mode: str, seconds: int) -> VideoOptions:
    """1 s at 2 fps with qwen-vl-utils' floor of 4 frames lowered to 2: one temporal patch; 4 s: 8 frames, four.
    Stock Qwen3-VL needs the 224 grid (``for_stock_sglang``)."""
    kw = {"fps": 2.0, **({"min_frames": 2} if seconds == 1 else {})}
    if family == "qwen2_5_vl":
        return VideoOptions(family=family, min_pixels=3136, max_pixels=20000, **kw)
    if mode == "stock":
        return VideoOptions.for_stock_sglang(family, min_pixels=40000, max_pixels=60000, **kw)
    return VideoOptions(family=family, min_pixels=4096, max_pixels=20000, **kw)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One node: the client's and the server's ``VIDCACHE_DIR`` (plugin references resolve through it)."""
    d = tmp_path_factory.mktemp("sglang-server")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(d / "node"))
        mp.delenv("VIDCACHE_SHARED", raising=False)
        yield d


@pytest.fixture(scope="module")
def checkpoints(env):
    """family -> a tiny checkpoint of transformers' own class (written once) and its model as the trainer loads it."""
    made = {}

    def get(family):
        if family not in made:
            path = write_tiny_checkpoint(family, env / f"ckpt-{family}")
            made[family] = (path, load_tiny_model(path))
        return made[family]
    return get


@pytest.fixture(scope="module")
def clips(env):
    """1 s and 4 s of 160x120 H.264 at 10 fps."""
    return {t: make_video(str(env / f"clip{t}.mp4"), codec="h264", width=160, height=120, fps=10, n_frames=10 * t,
                          seed=t) for t in (1, 4)}


def _server_id(case) -> str:
    family, mode, vision = case
    return f"{family}-{mode}" + (f"-{vision}" if vision else "")


@pytest.fixture(scope="module", params=SERVERS, ids=_server_id)
def server(request, env, checkpoints):
    family, mode, vision = request.param
    ckpt, _ = checkpoints(family)
    name = _server_id(request.param)
    # every server reads precomputed embeddings from the node's directory of records (the tests below write them)
    with ss.Server(ckpt, mode, node_dir=env / "node", log=env / f"server-{name}.log", family=family,
                   vision=vision, extra_env={DIR_ENV: str(env / "embeddings")}) as srv:
        srv.ckpt = ckpt
        print(f"\nSGLang 0.5.23 {name} server on CPU: started in {srv.start_s:.1f} s")
        yield srv


FIGURES: dict[tuple, float] = {}        # (server, clip, positions, vision) -> mean KL, for docs/benchmarks.md


@pytest.fixture(scope="module", autouse=True)
def kl_table(tmp_path_factory):
    """Printed (``-s``) and written to ``<pytest's base temp>/sglang_kl_table.txt`` for docs/benchmarks.md."""
    yield
    if FIGURES:
        lines = ["KL table (mean nats/token; SGLang 0.5.23 CPU server vs transformers' model as shipped):"]
        lines += [f"  {srv:28s} {clip:10s} positions={pos:12s} trainer vision={vis:13s} {kl:+.2e}"
                  for (srv, clip, pos, vis), kl in sorted(FIGURES.items())]
        print("\n" + "\n".join(lines))
        (tmp_path_factory.getbasetemp() / "sglang_kl_table.txt").write_text("\n".join(lines) + "\n")


def test_check_server_cli(server):
    out = subprocess.run([str(VIDCACHE), "check-server", server.url, "--mode", server.mode],
                         capture_output=True, text=True, timeout=900,
                         env={**os.environ, "PYTHONPATH": str(ss.ROOT)})
    lines = out.stdout.splitlines()
    if server.vision == ss.SHIPPED:
        # SGLang's own Qwen2.5-VL attends across frames: the check fails, naming the vision tower and the fix.
        assert out.returncode == 1, out.stdout + out.stderr
        vision = [ln for ln in lines if ln.startswith("FAIL [vision]")]
        assert vision and "SGLANG_EXTERNAL_MODEL_PACKAGE=vidcache.sglang.models" in vision[0], out.stdout
        assert "across each video's frames" in vision[0] and "0.5.23" in vision[0], out.stdout
        return
    assert out.returncode == 0, out.stdout + out.stderr + server.log_tail()
    ok = [ln for ln in lines if ln.startswith("OK") and f"{server.mode} mode: parity established" in ln]
    assert ok and "vision tower attends per temporal patch" in ok[0], out.stdout
    if server.family == "qwen2_5_vl":
        # how the server was made to: the plugin reports the model package; stock mode shows --model-impl
        assert ("vidcache's model package" if server.mode == "plugin" else "--model-impl transformers") in ok[0]
        assert any(ln.startswith("WARN [positions]") for ln in lines), out.stdout     # transformers' own rule
    if server.family == "qwen2_5_vl" and server.mode == "plugin":
        log = server.log_tail(10 ** 7)      # the subclass ran, and SGLang kept its fast path for video
        assert "vidcache.sglang.models: Qwen2_5_VLForConditionalGeneration" in log
        assert "Radix cache is disabled" not in log and "Chunked prefill is disabled" not in log


def test_check_computation_cli(server):
    """``vidcache check-computation`` (the CLI): every canary at the CPU fp32 floor where the server computes the
    model; on SGLang's own Qwen2.5-VL tower one temporal patch passes and several fail, named as the vision tower's
    temporal attention (rescored across the video: at the floor); with the trainer at transformers' own positions,
    Qwen2.5-VL fails naming the position rule."""
    def check(*extra):
        out = subprocess.run([str(VIDCACHE), "check-computation", server.url, "--model", server.ckpt,
                              "--mode", server.mode, *extra], capture_output=True, text=True, timeout=1200,
                             env={**os.environ, "PYTHONPATH": str(ss.ROOT)})
        print(f"\n$ vidcache check-computation ({_server_id((server.family, server.mode, server.vision))}) "
              f"{' '.join(extra)}\n{out.stdout}{out.stderr[-3000:]}")
        return out, out.stdout.splitlines()

    out, lines = check()
    assert "Traceback" not in out.stderr, out.stderr
    assert "full vocabulary" in lines[0] and "mean KL <= 1e-06" in lines[0], out.stdout
    row = {ln.split("  mean KL")[0].strip(): ln for ln in lines if "  mean KL" in ln}
    assert set(row) == {"text", "image", "video 1 patch", "video 4 patches", "two videos", "second turn"}, out.stdout
    if server.vision == ss.SHIPPED:
        assert out.returncode == 1, out.stdout
        assert "ABOVE" not in row["text"] and "ABOVE" not in row["video 1 patch"] and "ABOVE" in row["video 4 patches"]
        fail = [ln for ln in lines if ln.startswith("FAIL")]
        assert len(fail) == 1 and fail[0].startswith("FAIL [vision]") and "temporal attention" in fail[0], out.stdout
        assert "attend across each whole video" in fail[0], out.stdout       # the rescore matched
        return
    assert out.returncode == 0 and lines[-1].startswith("OK   computation equal on 6 canaries"), out.stdout
    assert not any("ABOVE" in ln for ln in row.values()), out.stdout
    if server.family == "qwen2_5_vl" and server.mode == "plugin":
        out, lines = check("--trainer-positions", "transformers")
        assert out.returncode == 1, out.stdout
        fail = [ln for ln in lines if ln.startswith("FAIL")]
        assert len(fail) == 1 and fail[0].startswith("FAIL [positions] the position rule"), out.stdout
        assert "video 4 patches" in fail[0] and "rope_positions" in fail[0], out.stdout


def _generate(server, clip, seconds: int):
    proc = vidcache_processor(server.ckpt)
    h = vidcache.get(clip, options(server.family, server.mode, seconds), VideoCache())
    # stock: FFV1 in Matroska for the 2-frame clip, as decord opens no 2-frame NUT (vidcache refuses to write one)
    stock = {"transport": "file", "frozen_format": "ffv1" if seconds == 1 else None} if server.mode == "stock" else {}
    req = prepare(proc, PROMPT, [h], mode=server.mode, **stock)
    vocab = len(proc.tokenizer)
    t0 = time.monotonic()
    status, out = server.generate({"input_ids": req.compact_ids, "video_data": req.video_data,
                                   "return_prompt_token_ids": True, "return_logprob": True, "logprob_start_len": 0,
                                   "top_logprobs_num": vocab,
                                   "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    took = time.monotonic() - t0
    assert status == 200, (out, server.log_tail())
    req.check(out)                                             # the guard: SGLang's prompt ids are the trainer's
    assert list(out["prompt_token_ids"]) == req.expanded_ids
    meta = out["meta_info"]
    eng = torch.cat([ss.engine_logprobs(meta, "input_top_logprobs", vocab),
                     ss.engine_logprobs(meta, "output_top_logprobs", vocab)])
    assert not torch.isnan(eng).any(), "SGLang did not return the full vocabulary"
    ids = req.expanded_ids + list(out["output_ids"])
    # The trainer's positions by SGLang's rule, from the request itself, are SGLang's own get_rope_index's.
    ti = req.train_inputs
    config = model_config(server.ckpt)
    pos = vidcache.rope_positions(proc, ids, request=req, engine="sglang", config=config)
    assert torch.equal(pos, ss.sglang_positions(server.ckpt, ids, ti["video_grid_thw"],
                                                ti.get("second_per_grid_ts"))[:, 0])
    pos_tf = vidcache.rope_positions(proc, ids, request=req, engine="transformers", config=config)
    return req, ids, eng, took, pos[:, None, :], pos_tf[:, None, :]


def vidcache_processor(ckpt):
    import transformers
    return transformers.AutoProcessor.from_pretrained(ckpt)


def model_config(ckpt):
    import transformers
    return transformers.AutoConfig.from_pretrained(ckpt)


def _kl(model, req, ids, eng, pos, vision_per_video=False):
    import contextlib
    ti = req.train_inputs
    # transformers' full-attention blocks over the whole video, as SGLang's
    with across_video_attention() if vision_per_video else contextlib.nullcontext():
        hf = ss.hf_logprobs(model, ids, ti, pos)[: len(ids) - 1].double()
    assert hf.shape == eng.shape
    kl = kl_per_token(eng, hf)
    return kl, bool((eng.argmax(-1) == hf.argmax(-1)).all()), float((eng - hf).abs().max())


def _record(server, clip, pos, vis, kl):
    FIGURES[(_server_id((server.family, server.mode, server.vision)), clip, pos, vis)] = float(kl.mean())


def test_generate_one_temporal_patch_is_at_the_floor(server, checkpoints, clips):
    _, model = checkpoints(server.family)
    req, ids, eng, took, pos, _ = _generate(server, clips[1], 1)
    assert req.train_inputs["video_grid_thw"][0, 0] == 1
    kl, argmax_equal, dmax = _kl(model, req, ids, eng, pos)
    _record(server, "1 patch", "engine", "shipped", kl)
    print(f"\n{server.family} {server.mode}: /generate {took:.2f} s, {len(req.expanded_ids)} prompt ids; vs "
          f"transformers: mean KL {kl.mean():.2e}, max KL {kl.max():.2e}, max |d logprob| {dmax:.2e}")
    assert kl.mean() < FLOOR_MEAN_KL and kl.max() < FLOOR_MAX_KL and argmax_equal


def test_generate_several_temporal_patches(server, checkpoints, clips):
    """Several temporal patches: at the floor against transformers' model as shipped wherever the server computes
    the model's vision tower; SGLang's shipped Qwen2.5-VL only against a transformers made to attend as it does."""
    _, model = checkpoints(server.family)
    req, ids, eng, took, pos, pos_tf = _generate(server, clips[4], 4)
    assert req.train_inputs["video_grid_thw"][0, 0] == 4
    kl, argmax_equal, dmax = _kl(model, req, ids, eng, pos)
    _record(server, "4 patches", "engine", "shipped", kl)
    print(f"\n{server.family} {server.mode} {server.vision or 'default'}: /generate {took:.2f} s, "
          f"{len(req.expanded_ids)} prompt ids; vs transformers as shipped: mean KL {kl.mean():.2e}, "
          f"max KL {kl.max():.2e}, max |d logprob| {dmax:.2e}")
    kl_tf, _, _ = _kl(model, req, ids, eng, pos_tf)           # the trainer at transformers' own positions
    _record(server, "4 patches", "transformers", "shipped", kl_tf)
    if server.vision == ss.SHIPPED:
        assert kl.mean() > FAR                                 # SGLang's tower attends across the video
        kl_pv, argmax_pv, _ = _kl(model, req, ids, eng, pos, vision_per_video=True)
        _record(server, "4 patches", "engine", "across frames", kl_pv)
        print(f"  with transformers attending across the video, as SGLang: mean KL {kl_pv.mean():.2e}")
        assert kl_pv.mean() < FLOOR_MEAN_KL and kl_pv.max() < FLOOR_MAX_KL and argmax_pv
        return
    assert kl.mean() < FLOOR_MEAN_KL and kl.max() < FLOOR_MAX_KL and argmax_equal
    if server.family == "qwen2_5_vl" and server.mode == "plugin":
        # 2/sample_fps seconds per grid: time dominates this grid (3 x 2 x 1 >= max(8, 12) / 2), so transformers'
        # own rule resumes the text elsewhere, and the real engine shows what that costs.
        assert not torch.equal(pos, pos_tf)
        print(f"  with transformers' own M-RoPE rule instead: mean KL {kl_tf.mean():.2e}")
        assert kl_tf.mean() > FAR
    elif server.family == "qwen3_vl":
        assert torch.equal(pos, pos_tf)                        # one item per frame: the rules agree


# --- Miles at startup: the computation check through the CPU dry run (issue 53) --------------------------------------
DRY_RUN = ss.ROOT / "examples" / "miles_cpu_dry_run.py"


def _dry_run(server, *flags, startup_only=False):
    """examples/miles_cpu_dry_run.py in plugin mode with this server for its startup check (train.py's flags from
    ``vidcache sglang-config --format miles``, registered through the rollout function's ``add_arguments`` as Miles'
    parser does, plus ``flags``); the server's node cache is the module's ``$VIDCACHE_DIR``.  Miles' ``parse_args``
    itself does not run here: miles/utils/arguments.py imports miles.dashboard (polars, not installed) and needs
    Megatron's parser."""
    from support.miles_compat import SKIP_REASON, miles_src
    if miles_src(ss.ROOT) is None:
        pytest.skip(SKIP_REASON)
    argv = [sys.executable, str(DRY_RUN), "--mode", "plugin", "--server", server.url, "--server-model", server.ckpt,
            *(["--startup-only"] if startup_only else []), "--", *flags]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=1500,
                       env={**os.environ, "PYTHONPATH": str(ss.ROOT)})
    out = r.stdout + r.stderr
    print(f"\n$ {' '.join(argv[1:])}\n{r.stdout[-6000:]}")
    assert "Traceback" not in out, out[-6000:]
    return r.returncode, out


def _table(out: str) -> dict[str, str]:
    return {ln.split("  mean KL")[0].strip(): ln for ln in out.splitlines() if "  mean KL" in ln}


@pytest.mark.miles
@DEFAULT_QWEN2_5_PLUGIN          # the Miles startup check runs against sglang-config's default server
def test_miles_dry_run_checks_computation_at_startup(server):
    """The dry run with ``--vidcache-check-computation fail`` against a server computing the trainer's model: the
    startup check logs the six canaries' table, passes, and the rollout runs."""
    rc, out = _dry_run(server, "--vidcache-check-computation", "fail")
    assert rc == 0, out[-6000:]
    assert set(_table(out)) == {"text", "image", "video 1 patch", "video 4 patches", "two videos", "second turn"}, out
    assert "OK   computation equal on 6 canaries" in out and "sglang positions" in out, out[-6000:]
    assert "startup check: ok" in out and "dry run: ok: 6 samples" in out, out[-6000:]


@pytest.mark.miles
@DEFAULT_QWEN2_5_PLUGIN          # the Miles startup check runs against sglang-config's default server
def test_miles_startup_fails_when_the_trainer_computes_otherwise(server):
    """``--vidcache-positions transformers`` (the trainer keeps transformers' own M-RoPE rule: check-server only
    warns, the operator chose it): the computation check fails the job at startup, naming the position rule."""
    rc, out = _dry_run(server, "--vidcache-check-computation", "fail", "--vidcache-positions", "transformers",
                       startup_only=True)
    assert rc == 1, out[-6000:]
    assert "startup check FAILED" in out and "transformers positions" in out, out[-6000:]
    fail = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert fail and all(ln.startswith("FAIL [positions] the position rule") for ln in fail), out[-6000:]
    assert "ABOVE" in _table(out)["video 4 patches"], out[-6000:]
    assert "note: in Miles: set --custom-megatron-init-path miles_integration.train_hooks.install_train_hooks" in out


@pytest.mark.miles
@DEFAULT_QWEN2_5_PLUGIN          # the Miles startup check runs against sglang-config's default server
def test_miles_startup_warns_and_goes_on_with_warn(server):
    """The same trainer with ``--vidcache-check-computation warn``: the table and the failure are logged (WARNING),
    and the job goes on: the rollout runs."""
    rc, out = _dry_run(server, "--vidcache-check-computation", "warn", "--vidcache-positions", "transformers")
    assert rc == 0, out[-6000:]
    assert "WARNING" in out and "FAIL [positions] the position rule" in out, out[-6000:]
    assert "startup check: ok" in out and "dry run: ok: 6 samples" in out, out[-6000:]


# --- precomputed vision embeddings (vidcache.rollout.embeddings) --------------------------------------------------
# Which servers a test runs on (``tests/sglang_server/conftest.py`` deselects the others, rather than skipping them
# with the servers running): precomputed embeddings need the plugin (stock /generate takes JSON, no rows).
PLUGIN = pytest.mark.servers(lambda family, mode, vision: mode == "plugin")
PLUGIN_AS_CONFIGURED = pytest.mark.servers(lambda family, mode, vision: mode == "plugin" and vision is None)


def _records(server, model, proc, handles, env):
    """The trainer's records for ``handles`` (its tower on its own train_inputs), written where the server looks."""
    from support.embedding_records import compute_records
    ti = vidcache.train_inputs(proc, handles, mode="plugin")
    recs = compute_records(model, server.family, ti, [h.resolve() for h in handles])
    look = DirectoryLookup(env / "embeddings")
    for r in recs:
        look.put(r)
        assert torch.equal(look(r.key).embeds, r.embeds)       # the server reads these very bytes
    return recs, look


def _generate_embeds(server, proc, handles, recs):
    req = prepare(proc, PROMPT.replace(VIDEO_PLACEHOLDER, VIDEO_PLACEHOLDER * len(handles)), handles,
                  mode="plugin", embeddings=recs)
    vocab = len(proc.tokenizer)
    status, out = server.generate({"input_ids": req.compact_ids, "video_data": req.video_data,
                                   "return_prompt_token_ids": True, "return_logprob": True, "logprob_start_len": 0,
                                   "top_logprobs_num": vocab,
                                   "sampling_params": {"max_new_tokens": 4, "temperature": 0}})
    return req, status, out


def _embeds_kl(server, model, proc, req, out, recs):
    from support.embedding_records import fed
    vocab = len(proc.tokenizer)
    meta = out["meta_info"]
    eng = torch.cat([ss.engine_logprobs(meta, "input_top_logprobs", vocab),
                     ss.engine_logprobs(meta, "output_top_logprobs", vocab)])
    ids = req.expanded_ids + list(out["output_ids"])
    pos = vidcache.rope_positions(proc, ids, request=req, engine="sglang", config=model_config(server.ckpt))
    with fed(model, req.extra["embeddings"]) as calls:        # the trainer's decoder on the same records' rows
        hf = ss.hf_logprobs(model, ids, req.train_inputs, pos[:, None, :])[: len(ids) - 1].double()
    assert calls, "the trainer ran its tower"
    kl = kl_per_token(eng, hf)
    return kl, bool((eng.argmax(-1) == hf.argmax(-1)).all())


@PLUGIN
def test_generate_from_precomputed_embeddings(server, checkpoints, clips, env):
    """Several temporal patches, the rows from a record: at the floor on every plugin server, SGLang's shipped
    Qwen2.5-VL too (its tower, which attends across the video, is not run)."""
    _, model = checkpoints(server.family)
    proc = vidcache_processor(server.ckpt)
    h = vidcache.get(clips[4], options(server.family, server.mode, 4), VideoCache())
    recs, _ = _records(server, model, proc, [h], env)
    req, status, out = _generate_embeds(server, proc, [h], recs)
    assert status == 200, (out, server.log_tail())
    req.check(out)                      # the guard, and the attestation: the server's rows' digest is the trainer's
    kl, argmax_equal = _embeds_kl(server, model, proc, req, out, recs)
    _record(server, "4 patches", "engine", "embeddings", kl)
    print(f"\n{_server_id((server.family, server.mode, server.vision))} from embeddings: mean KL {kl.mean():.2e}, "
          f"max KL {kl.max():.2e}")
    assert kl.mean() < FLOOR_MEAN_KL and kl.max() < FLOOR_MAX_KL and argmax_equal


@PLUGIN_AS_CONFIGURED   # one plugin server per family suffices; the shipped model differs only in its unused tower
def test_generate_two_videos_from_precomputed_embeddings(server, checkpoints, clips, env):
    _, model = checkpoints(server.family)
    proc = vidcache_processor(server.ckpt)
    hs = [vidcache.get(clips[t], options(server.family, server.mode, t), VideoCache()) for t in (4, 1)]
    recs, _ = _records(server, model, proc, hs, env)
    req, status, out = _generate_embeds(server, proc, hs, recs)
    assert status == 200, (out, server.log_tail())
    req.check(out)
    kl, argmax_equal = _embeds_kl(server, model, proc, req, out, recs)
    _record(server, "2 videos", "engine", "embeddings", kl)
    print(f"\n{server.family} two videos from embeddings: mean KL {kl.mean():.2e}, max KL {kl.max():.2e}")
    assert kl.mean() < FLOOR_MEAN_KL and kl.max() < FLOOR_MAX_KL and argmax_equal


@PLUGIN_AS_CONFIGURED   # the refusals are the plugin's, the same on every plugin server
def test_embeddings_of_another_tower_or_other_rows_are_refused(server, checkpoints, clips, env):
    """A request for another tower's embeddings (another weights digest) finds none; a record of another key
    stored under this one is refused by its key; rows of another width, or other rows, under the right key are
    refused (the width check; the attestation)."""
    import dataclasses

    from vidcache.errors import ParityError
    _, model = checkpoints(server.family)
    proc = vidcache_processor(server.ckpt)
    h = vidcache.get(clips[1], options(server.family, server.mode, 1), VideoCache())
    (rec,), look = _records(server, model, proc, [h], env)
    other_key = dataclasses.replace(rec.key, weights="f" * 32)        # a fine-tuned tower's digest
    other = dataclasses.replace(rec, key=other_key)
    # 1. no record for that tower on the server
    req, status, out = _generate_embeds(server, proc, [h], [other])
    assert status == 400 and "not_cached" in str(out), out
    with pytest.raises(ParityError, match="cannot serve precomputed embeddings"):
        req.check(out)
    # 2. the real tower's record stored under the other tower's name: refused by the key it carries
    look.put(rec, key=other_key)
    req, status, out = _generate_embeds(server, proc, [h], [other])
    assert status == 400 and "computed for" in str(out), out
    # 3. the right key, rows of another width (another model's): refused before SGLang's scheduler sees them
    look.put(dataclasses.replace(rec, embeds=torch.cat([rec.embeds, rec.embeds[:, :1]], dim=-1)))
    req, status, out = _generate_embeds(server, proc, [h], [rec])
    assert status == 400 and "wide" in str(out), out
    # 4. the right key, other rows (one value changed): the attested digest differs
    bent = rec.embeds.clone()
    bent[0, 0] += 1.0
    look.put(dataclasses.replace(rec, embeds=bent))
    req, status, out = _generate_embeds(server, proc, [h], [rec])
    assert status == 400 and "embeddings differ" in str(out), out
    look.put(rec)
