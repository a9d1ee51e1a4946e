"""vLLM 0.34.0's own multimodal processor, on CPU without weights, in a process of its own (the vLLM overlay of
``scripts/setup_vllm_overlay.sh``: vLLM's transformers 5.22.2 instead of the venv's).

Not a test module.  Two uses, both run as ``PYTHONPATH=.overlays/vllm-0.34.0:<repo> python tests/support/vllm_peer.py``:

``process JOB.json OUT``  each case of the job: a ``TokensPrompt`` as ``vidcache.vllm.prepare_vllm`` builds it (the
    frames read from this process's ``VIDCACHE_DIR`` by key) through ``MULTIMODAL_REGISTRY.create_processor(
    ModelConfig(ckpt, mm_device_do_normalize=...))(...)``, which is the call vLLM's renderer makes
    (renderers/base.py, ``_process_multimodal``).  Writes ``OUT/<case>.safetensors`` (the model kwargs and the
    prompt ids) and ``OUT/<case>.json`` (the output's dtypes): tensors, never a pickle.

``serve --model CKPT --url-file F [vllm serve's multimodal flags]``  a vLLM-shaped OpenAI server (stdlib
    ``http.server``): ``GET /v1/models``, ``GET /version``, ``POST /v1/chat/completions`` and, with
    ``VLLM_SERVER_DEV_MODE=1`` as on a real server, ``GET /server_info``.  Chat requests go through vLLM's own code:
    ``parse_chat_messages`` (its MediaConnector, the data-URL decoding, the video loader named by
    ``--media-io-kwargs``: vidcache's, registered by importing ``vidcache.vllm.loader`` as vLLM's plugin loader
    would), ``safe_apply_chat_template`` with the checkpoint's template, then the processor.  It generates nothing
    (``max_tokens`` is ignored): it answers with vLLM's ``prompt_token_ids`` and an empty choice.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if ROOT not in sys.path:
    sys.path.insert(1, ROOT)
if os.path.join(ROOT, "tests") not in sys.path:      # run as a script too: support.* beside it
    sys.path.insert(1, os.path.join(ROOT, "tests"))

MAX_MODEL_LEN = 32768


def model_config(ckpt: str, device_norm: bool | None, media_io_kwargs: dict | None = None,
                 mm_processor_kwargs: dict | None = None, limit: int = 4):
    from vllm.config import ModelConfig
    kw = {} if device_norm is None else {"mm_device_do_normalize": device_norm}   # None: vLLM's own default
    return ModelConfig(model=ckpt, tokenizer=ckpt, dtype="float32", max_model_len=MAX_MODEL_LEN,
                       mm_processor_cache_gb=0, limit_mm_per_prompt={"video": limit, "image": 0},
                       media_io_kwargs=media_io_kwargs or {}, mm_processor_kwargs=mm_processor_kwargs, **kw)


def run_processor(proc, prompt: dict) -> dict:
    """vLLM's processor on a TokensPrompt-shaped dict: ``{"prompt_token_ids", "multi_modal_data",
    "multi_modal_uuids", "mm_processor_kwargs"}``; returns the prompt ids and the model kwargs."""
    from vllm.multimodal.parse import parse_mm_uuids
    items = proc.info.parse_mm_data(prompt["multi_modal_data"])
    out = proc(prompt["prompt_token_ids"], items, parse_mm_uuids(prompt.get("multi_modal_uuids")),
               hf_processor_mm_kwargs=prompt.get("mm_processor_kwargs") or {})
    return {"prompt_token_ids": list(out["prompt_token_ids"]), **out["mm_kwargs"].get_data()}


def _process(job_path: str, out_dir: str) -> int:
    import torch
    from safetensors.torch import save_file
    from vllm.multimodal import MULTIMODAL_REGISTRY

    import vidcache
    from vidcache.vllm.request import vllm_metadata
    job = json.load(open(job_path))
    procs = {}
    os.makedirs(out_dir, exist_ok=True)
    for case in job["cases"]:
        sig = (case["ckpt"], case.get("device_norm"))
        if sig not in procs:
            procs[sig] = MULTIMODAL_REGISTRY.create_processor(model_config(case["ckpt"], case.get("device_norm")))
        handles = [vidcache.from_key(k) for k in case["keys"]]
        frames = [h.frames() for h in handles]
        if case.get("frames_layout") == "thwc":          # vLLM's own loaders' layout (numpy T x H x W x C)
            frames = [f.permute(0, 2, 3, 1).numpy() for f in frames]
        prompt = {"prompt_token_ids": case["prompt_token_ids"],
                  "multi_modal_data": {"video": [(f, vllm_metadata(h.manifest)) for f, h in zip(frames, handles)]},
                  "multi_modal_uuids": {"video": case["keys"]}, "mm_processor_kwargs": case["mm_processor_kwargs"]}
        got = run_processor(procs[sig], prompt)
        tensors = {k: v.contiguous() for k, v in got.items() if isinstance(v, torch.Tensor)}
        tensors["prompt_token_ids"] = torch.tensor(got["prompt_token_ids"], dtype=torch.int64)
        save_file(tensors, os.path.join(out_dir, case["name"] + ".safetensors"))
        with open(os.path.join(out_dir, case["name"] + ".json"), "w") as f:
            json.dump({k: str(v.dtype) for k, v in tensors.items()}, f)
    return 0


def _loader(job_path: str, out_path: str) -> int:
    """Each URL of the job through vLLM's own media path (``MediaConnector.fetch_video`` -> ``VideoMediaIO`` -> the
    loader ``media_io_kwargs`` names), recording what came back or the exception's type and message."""
    import numpy as np
    import xxhash
    from vllm.multimodal.media import MediaConnector

    import vidcache.vllm.loader  # noqa: F401  (vLLM's plugin loader imports it through the entry point)
    job = json.load(open(job_path))
    conn = MediaConnector(media_io_kwargs=job["media_io_kwargs"])
    res = {}
    for name, url in job["urls"].items():
        try:
            frames, meta = conn.fetch_video(url).media
            frames = np.asarray(frames)          # vLLM's torchcodec decoder returns a tensor, its loaders numpy
            res[name] = {"shape": list(frames.shape), "dtype": str(frames.dtype),
                         "digest": xxhash.xxh3_128_hexdigest(frames.tobytes()),
                         "metadata": {k: v for k, v in meta.items() if isinstance(v, (int, float, str, list, bool))}}
        except Exception as e:  # noqa: BLE001  the test asserts the exact type, by name and by vidcache's hierarchy
            from vidcache.errors import VidcacheError
            res[name] = {"error": type(e).__name__, "message": str(e)[:400],
                         "mro": [c.__name__ for c in type(e).__mro__], "vidcache": isinstance(e, VidcacheError)}
    json.dump(res, open(out_path, "w"))
    return 0


# --- the vLLM-shaped server -----------------------------------------------------------------------------
def _serve(argv) -> int:
    import http.server
    import threading

    import vllm
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.renderers.chat_utils.chat_message import parse_chat_messages
    from vllm.renderers.hf import safe_apply_chat_template
    from vllm.tokenizers import cached_tokenizer_from_config

    import vidcache.vllm.loader  # noqa: F401  what vLLM's load_general_plugins does through the entry point

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--served-model-name", default=None)
    ap.add_argument("--url-file", required=True)
    # vllm serve's own spellings (vllm/engine/arg_utils.py): a BooleanOptionalAction and two JSON options.
    ap.add_argument("--mm-device-do-normalize", action=argparse.BooleanOptionalAction, default=None)
    ap.add_argument("--media-io-kwargs", type=json.loads, default=None)
    ap.add_argument("--mm-processor-kwargs", type=json.loads, default=None)
    ap.add_argument("--trust-request-mm-kwargs", action="store_true")   # accepted; the real server's gate is
    a = ap.parse_args(argv)                                             # tested in test_real_server.py
    name = a.served_model_name or a.model
    mc = model_config(a.model, a.mm_device_do_normalize, a.media_io_kwargs, a.mm_processor_kwargs)
    proc = MULTIMODAL_REGISTRY.create_processor(mc)
    tok = cached_tokenizer_from_config(mc)
    lock = threading.Lock()

    def chat(body: dict) -> dict:
        conv, mm_data, mm_uuids = parse_chat_messages(body["messages"], mc, "openai",
                                                      media_io_kwargs=body.get("media_io_kwargs"))
        ids = safe_apply_chat_template(mc, tok, conv, tokenize=True, add_generation_prompt=True)
        if mm_data:
            got = run_processor(proc, {"prompt_token_ids": list(ids), "multi_modal_data": mm_data,
                                       "multi_modal_uuids": mm_uuids,
                                       "mm_processor_kwargs": body.get("mm_processor_kwargs")})
            ids = got["prompt_token_ids"]
        out = {"id": "chatcmpl-vidcache-standin", "object": "chat.completion", "model": name,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": "length"}],
               "usage": {"prompt_tokens": len(ids), "completion_tokens": 0, "total_tokens": len(ids)}}
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = list(ids)
        return out

    def server_info() -> dict:
        mm = mc.multimodal_config
        return {"vllm_config": {"model_config": {"model": a.model, "multimodal_config": {
            "mm_device_do_normalize": mm.mm_device_do_normalize, "media_io_kwargs": mm.media_io_kwargs,
            "mm_processor_kwargs": mm.mm_processor_kwargs}}}}

    from support.json_http import JSONHandler

    class H(JSONHandler):
        _send = JSONHandler.reply

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "vllm",
                                                             "root": a.model, "max_model_len": MAX_MODEL_LEN}]})
            elif path == "/version":
                self._send(200, {"version": vllm.__version__})
            elif path == "/server_info" and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
                self._send(200, server_info())
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                return self._send(404, {"detail": "Not Found"})
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            try:
                with lock:
                    self._send(200, chat(body))
            except Exception as e:      # noqa: BLE001  vLLM answers a failed request 400 with its message, so do we
                self._send(400, {"error": {"message": f"{type(e).__name__}: {e}", "type": "BadRequestError",
                                           "code": 400}})

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    tmp = a.url_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"http://127.0.0.1:{srv.server_address[1]}")
    os.replace(tmp, a.url_file)          # the URL appears whole, once the processor is built
    srv.serve_forever()
    return 0


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    run = {"process": lambda: _process(*rest), "loader": lambda: _loader(*rest), "serve": lambda: _serve(rest)}
    sys.exit(run[cmd]())


# --- a checkpoint directory vLLM's ModelConfig accepts (written by the main venv; read by vLLM's transformers) ---
# Qwen2-VL's chat template as published (the image branch and tool calls left out): vLLM detects it as an
# "openai"-format template (it iterates over content parts) and renders a video part as the placeholder.
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
    "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'video' or 'video' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_CONFIG = {"qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
           "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
           "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
           # Qwen3.5 / 3.6 / 3.8: vLLM 0.34 registers their architectures with Qwen3-VL's multimodal processor
           "qwen3_5": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
           "qwen3_5_moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration")}


def write_checkpoint(family: str, path, processor=None, **video_processor_changes) -> str:
    """A weightless checkpoint of ``family`` at ``path``: the toy processor (with ``QWEN_CHAT_TEMPLATE``) and a tiny
    model config whose special-token ids are the toy tokenizer's; ``video_processor_changes`` set attributes of
    its video processor first (a checkpoint with other processor settings)."""
    import transformers

    from vidcache.testing.processors import build_processor
    proc = processor if processor is not None else build_processor(family)
    proc.chat_template = QWEN_CHAT_TEMPLATE
    for k, v in video_processor_changes.items():
        setattr(proc.video_processor, k, v)
    proc.save_pretrained(path)
    tid = proc.tokenizer.convert_tokens_to_ids
    ids = {k: tid(t) for k, t in (("vision_start_token_id", "<|vision_start|>"),
                                  ("vision_end_token_id", "<|vision_end|>"),
                                  ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"))}
    cls_name, arch = _CONFIG[family]
    from vidcache.families import FAMILY_OF_MODEL_TYPE, MODEL_TYPES
    model_type, family = family, FAMILY_OF_MODEL_TYPE[family]
    text = {"vocab_size": 512 if model_type == family else MODEL_TYPES[model_type].vocab_size, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": MAX_MODEL_LEN,
            "bos_token_id": tid("<|endoftext|>"), "eos_token_id": tid("<|im_end|>")}
    vp = proc.video_processor
    vision = {"depth": 1, "hidden_size": 64, "num_heads": 2, "patch_size": vp.patch_size,
              "temporal_patch_size": vp.temporal_patch_size, "spatial_merge_size": vp.merge_size}
    if family == "qwen2_vl":
        vision.update(embed_dim=64, mlp_ratio=2)
    if family == "qwen2_5_vl":
        vision.update(intermediate_size=128, out_hidden_size=64, tokens_per_second=2, fullatt_block_indexes=[0])
    if family == "qwen3_vl":
        vision.update(intermediate_size=128, out_hidden_size=64, deepstack_visual_indexes=[],
                      num_position_embeddings=64)
        text.update(head_dim=32,
                    rope_scaling={"rope_type": "default", "mrope_section": [8, 4, 4], "mrope_interleaved": True})
    else:
        text["rope_scaling"] = {"type": "mrope", "mrope_section": [8, 4, 4]}
    cfg = getattr(transformers, cls_name)(text_config=text, vision_config=vision, architectures=[arch], **ids)
    cfg.save_pretrained(path)
    return str(path)


# --- the main venv's side: the overlay, its environment, the subprocess ---------------------------------
OVERLAY = os.path.join(ROOT, ".overlays", "vllm-0.34.0")


def overlay_or_skip() -> str:
    """The vLLM overlay's path.  Absent: a skip naming the script (this checkout never ran ``install.sh --test``).
    Present: returned as it is, so a broken overlay fails in the subprocess, never skips (the SGLang peer's rule)."""
    import pytest
    if not os.path.isdir(OVERLAY):
        pytest.skip("vLLM overlay not installed (.overlays/vllm-0.34.0): run scripts/setup_vllm_overlay.sh")
    return OVERLAY


def peer_env(node_dir, shared_dir=None, **extra) -> dict:
    """The environment of a vLLM process on this node: the overlay first (vLLM 0.34.0, transformers 5.22.2), this
    checkout's vidcache, the node's cache settings; offline (the checkpoints are local directories)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env["PYTHONPATH"] = os.pathsep.join([overlay_or_skip(), ROOT])
    env.update(VIDCACHE_DIR=str(node_dir), HF_HUB_OFFLINE="1", PYTHONDONTWRITEBYTECODE="1",
               VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1")
    if shared_dir is not None:
        env["VIDCACHE_SHARED"] = str(shared_dir)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_process(job: dict, work_dir, node_dir, timeout: float = 900) -> dict:
    """Run ``job`` through vLLM's processor in the overlay; ``{case name: {tensor name: tensor}}``."""
    import subprocess

    from safetensors.torch import load_file
    work = os.fspath(work_dir)
    os.makedirs(work, exist_ok=True)
    job_path, out = os.path.join(work, "job.json"), os.path.join(work, "out")
    with open(job_path, "w") as f:
        json.dump(job, f)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "process", job_path, out], env=peer_env(node_dir),
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"vLLM's processor failed (rc {r.returncode}):\n{r.stderr[-4000:]}")
    return {c["name"]: load_file(os.path.join(out, c["name"] + ".safetensors")) for c in job["cases"]}


def run_loader(urls: dict, work_dir, node_dir, media_io_kwargs: dict | None = None, **env) -> dict:
    """Fetch each of ``urls`` through vLLM's media path with vidcache's loader; ``{name: result or error}``."""
    import subprocess

    from vidcache.vllm.config import ENGINE_KWARGS
    work = os.fspath(work_dir)
    os.makedirs(work, exist_ok=True)
    job_path, out = os.path.join(work, "loader.json"), os.path.join(work, "loader-out.json")
    with open(job_path, "w") as f:
        json.dump({"urls": urls, "media_io_kwargs": media_io_kwargs or ENGINE_KWARGS["media_io_kwargs"]}, f)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "loader", job_path, out],
                       env=peer_env(node_dir, **env), capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise AssertionError(f"vLLM's media path failed (rc {r.returncode}):\n{r.stderr[-4000:]}")
    with open(out) as f:
        return json.load(f)
