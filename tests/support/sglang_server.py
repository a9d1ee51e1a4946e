"""SGLang 0.5.23's own server (``python -m sglang.launch_server``: tokenizer manager, scheduler, ``/generate``) on
the CPU, for tests.  EXPERIMENTAL: it runs SGLang's CPU engine on a CPU without AMX, with only the
``sgl_kernel`` symbols SGLang reads at import supplied by ``support/sgl_kernel_shim`` (plain torch).

Not a test module.  The server runs in the environment ``scripts/setup_sglang_server.sh`` builds (default
``.peer/sglang-cpu``, or ``$VIDCACHE_SGLANG_SERVER_VENV``): a venv that sees the test venv's packages through a
``.pth`` file and adds SGLang's server-only dependencies (uvicorn, uvloop, soundfile, ...); SGLang itself is the
test venv's (``scripts/setup_peer_env.sh``).

    ckpt = write_checkpoint(tmp / "ckpt")                     # tiny random Qwen2.5-VL, transformers' own class
    with Server(ckpt, "plugin", node_dir=tmp / "node", log=tmp / "server.log") as srv:
        srv.generate({...})                                   # POST /generate, JSON in and out

The server is started with exactly what ``vidcache sglang-config --mode M`` gives (its ``server_args`` and
``env``) plus the flags a CPU run needs (``CPU_FLAGS``: device, torch-native attention, fp32, a small KV pool).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

try:
    from support.net import free_port
    from support.server_process import ServerProcess
except ImportError:       # run as a script (write-checkpoint): this folder is on sys.path, tests/ is not
    from net import free_port
    from server_process import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
SHIM = Path(__file__).resolve().parent / "sgl_kernel_shim"
DEFAULT_VENV = ROOT / ".peer" / "sglang-cpu"
FAMILY = "qwen2_5_vl"

# What a CPU run needs on top of vidcache's flags.  torch_native attention: the CPU attention backend SGLang has
# without AMX kernels; fp32 so the logprobs can be compared with transformers' forward at the noise floor.
CPU_FLAGS = ["--device", "cpu", "--attention-backend", "torch_native", "--disable-cuda-graph", "--dtype", "float32",
             "--mem-fraction-static", "0.05", "--max-total-tokens", "16384", "--context-length", "8192",
             "--grammar-backend", "none", "--skip-server-warmup"]

# Sizes the engines' CPU kernels accept (head_dim 64), otherwise as vidcache.testing.kl: init range 0.2 so the
# random model's next-token distributions are not flat.
TEXT = {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "initializer_range": 0.2, "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [8, 12, 12]}}
VISION = {"depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2, "in_channels": 3,
          "out_hidden_size": 256, "initializer_range": 0.2, "window_size": 112, "fullatt_block_indexes": [1],
          "tokens_per_second": 2}


def server_venv() -> Path:
    return Path(os.environ.get("VIDCACHE_SGLANG_SERVER_VENV") or DEFAULT_VENV)


def server_python() -> Path:
    return server_venv() / "bin" / "python"


def write_checkpoint(path, seed: int = 0) -> str:
    """A tiny random-weight Qwen2.5-VL at ``path``: transformers' own ``Qwen2_5_VLForConditionalGeneration`` (real
    ``architectures``), fp32 safetensors, the toy processor (``vidcache.testing.processors``) with a Qwen chat
    template."""
    import torch
    import transformers

    from support.vllm_peer import QWEN_CHAT_TEMPLATE
    from vidcache.testing.processors import build_processor

    proc = build_processor(FAMILY)
    proc.chat_template = QWEN_CHAT_TEMPLATE
    proc.save_pretrained(path)
    tok = proc.tokenizer
    tid = tok.convert_tokens_to_ids
    ids = {"image_token_id": tid("<|image_pad|>"), "video_token_id": tid("<|video_pad|>"),
           "vision_start_token_id": tid("<|vision_start|>"), "vision_end_token_id": tid("<|vision_end|>")}
    vp = proc.video_processor
    vision = {**VISION, "patch_size": vp.patch_size, "temporal_patch_size": vp.temporal_patch_size,
              "spatial_merge_size": vp.merge_size}
    text = {**TEXT, "vocab_size": len(tok), "bos_token_id": None, "eos_token_id": tok.eos_token_id,
            "pad_token_id": None}
    cfg = transformers.Qwen2_5_VLConfig(vision_config=vision, text_config=text,
                                        architectures=["Qwen2_5_VLForConditionalGeneration"], **ids)
    torch.manual_seed(seed)
    model = transformers.Qwen2_5_VLForConditionalGeneration(cfg).to(torch.float32).eval()
    model.save_pretrained(path)
    return str(path)


# ``vision``: "package" / "transformers" (sglang-config's --vision), None (its default for the mode), or SHIPPED:
# SGLang's own model code as shipped, sglang-config's vision fix taken out (to show what it fixes).
SHIPPED = "shipped"


def _config(family: str, mode: str, vision: str | None) -> dict:
    from vidcache.sglang.config import sglang_config
    from vidcache.sglang_facts import MODEL_PACKAGE_ENV, TRANSFORMERS_IMPL_ARGS
    cfg = sglang_config(family, mode, vision=None if vision == SHIPPED else vision)
    if vision == SHIPPED:
        cfg["env"].pop(MODEL_PACKAGE_ENV, None)
        args = cfg["server_args"]
        for i in range(len(args) - 1):
            if tuple(args[i:i + 2]) == TRANSFORMERS_IMPL_ARGS:
                del args[i:i + 2]
                break
    return cfg


def server_env(mode: str, node_dir, shared_dir=None, family: str = FAMILY, vision: str | None = None,
               extra_env: dict | None = None) -> dict:
    """The server process's environment: ``vidcache sglang-config``'s ``env`` for ``mode``, the CPU engine, the
    shim on ``PYTHONPATH`` (first) and this checkout's vidcache (the plugin's and the model package's); ``extra_env``
    last (e.g. the node's embeddings lookup, ``$VIDCACHE_EMBEDDINGS_DIR``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "VIDCACHE_"))}
    # sglang-config's env, less the node's two directories it can only describe (set just below)
    env.update({k: v for k, v in _config(family, mode, vision)["env"].items() if not v.startswith("<")})
    env.update({"SGLANG_USE_CPU_ENGINE": "1", "VIDCACHE_DIR": str(node_dir),
                "PYTHONPATH": os.pathsep.join([str(SHIM), str(ROOT)])})
    if shared_dir is not None:
        env["VIDCACHE_SHARED"] = str(shared_dir)
    env.update(extra_env or {})
    return env


def server_args(mode: str, family: str = FAMILY, vision: str | None = None) -> list[str]:
    return list(_config(family, mode, vision)["server_args"])


class Server(ServerProcess):
    """``python -m sglang.launch_server`` on ``ckpt`` in the server venv, in its own process group (SGLang forks a
    scheduler and a detokenizer), stopped on exit.  ``start_s``: launch to the first answered ``/health``."""

    def __init__(self, ckpt, mode: str, node_dir, log, shared_dir=None, timeout: float = 600,
                 family: str = FAMILY, vision: str | None = None, extra_env: dict | None = None):
        self.mode, self.family, self.vision = mode, family, vision
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log)
        cmd = [str(server_python()), "-m", "sglang.launch_server", "--model-path", str(ckpt),
               "--host", "127.0.0.1", "--port", str(self.port), *CPU_FLAGS, *server_args(mode, family, vision)]
        self.log = open(self.log_path, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, env=server_env(mode, node_dir, shared_dir, family, vision, extra_env),
                                     stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True, cwd=str(ROOT))
        try:
            self._wait(t0 + timeout)
        except BaseException:
            self.close()
            raise
        self.start_s = time.monotonic() - t0

    def _wait(self, deadline: float) -> None:
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"SGLang's server exited ({self.proc.returncode}):\n" + self.log_tail())
            if time.monotonic() > deadline:
                raise AssertionError("SGLang's server did not come up in time:\n" + self.log_tail())
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200 and "fired up" in self.log_path.read_text(errors="replace"):
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1)

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:]

    def generate(self, payload: dict, timeout: float = 600) -> tuple[int, dict]:
        """POST ``/generate``: (status, JSON body), errors included (SGLang answers a refused request with 400)."""
        return self.post_json("/generate", payload, timeout)


def sglang_positions(ckpt, expanded_ids, video_grid_thw, second_per_grid_ts):
    """The M-RoPE positions SGLang 0.5.23 gives a prompt, from its own ``mrope_rope_index.get_rope_index`` (the
    function its Qwen-VL processor calls): ``3 x 1 x L``."""
    import torch
    import transformers
    from sglang.srt.layers.rotary_embedding.mrope_rope_index import get_rope_index

    cfg = transformers.AutoConfig.from_pretrained(ckpt)
    pos, _ = get_rope_index(
        spatial_merge_size=cfg.vision_config.spatial_merge_size, image_token_id=cfg.image_token_id,
        video_token_id=cfg.video_token_id, vision_start_token_id=cfg.vision_start_token_id,
        model_type=cfg.model_type, tokens_per_second=getattr(cfg.vision_config, "tokens_per_second", None),
        input_ids=torch.tensor([list(expanded_ids)]), video_grid_thw=torch.as_tensor(video_grid_thw).reshape(-1, 3),
        second_per_grid_ts=None if second_per_grid_ts is None
        else torch.as_tensor(second_per_grid_ts, dtype=torch.float32).reshape(-1))
    return pos


def hf_logprobs(model, ids, tensors, position_ids=None):
    """transformers' forward on ``ids`` with the trainer's tensors: ``len(ids) x vocab`` fp32 log-softmax
    (``vidcache.rollout.computation.trainer_logprobs``, what ``check-computation`` scores with)."""
    from vidcache.rollout.computation import trainer_logprobs
    return trainer_logprobs(model, ids, tensors, position_ids)


def engine_logprobs(meta: dict, key: str, vocab: int):
    """``meta_info[key]`` as a dense ``N x vocab`` tensor (``vidcache.sglang.computation.engine_rows``)."""
    from vidcache.sglang.computation import engine_rows
    return engine_rows(meta, key, vocab)


if __name__ == "__main__":   # python tests/support/sglang_server.py write-checkpoint DIR
    sys.path.insert(0, str(ROOT / "tests"))
    if sys.argv[1:2] == ["write-checkpoint"]:
        print(write_checkpoint(sys.argv[2]))
