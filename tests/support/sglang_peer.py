"""SGLang 0.5.23's own Qwen-VL video preprocessing, run in-process on CPU, as a test peer.

Not a test module. Install the peer into the venv first with ``scripts/setup_peer_env.sh``. Tests that use it
skip only where SGLang is not installed at all (``peer_installed()``); where it is, they call ``require_peer()``,
which raises if the peer cannot work (an import error, another SGLang version), so a broken peer or plugin
fails instead of skipping.

    from tests.support.toy_processors import build_processor
    from tests.support.sglang_peer import build_peer, run_peer

    peer = build_peer("qwen3_vl", build_processor("qwen3_vl"), video_config={"fps": 2.0})
    out = run_peer(peer, "<|vision_start|><|video_pad|><|vision_end|>Describe.", ["file:///tmp/x.mkv"])
    out["pixel_values_videos"], out["video_grid_thw"], out["input_ids"], out["video_metadata"], out["frames"]

How it works: it builds ``QwenVLImageProcessor`` with ``__new__`` and sets the attributes its ``__init__``
would set (``__init__`` needs a published SGLang runtime context: server args, ``get_mm()``, ...), then awaits
SGLang's ``_process_mm_data_uncached`` exactly as the tokenizer manager would for a ``/generate`` request with
``video_data=[...]``. The whole path is SGLang's code: ``load_mm_data`` -> ``load_video`` (torchcodec if
importable, else decord) -> ``preprocess_video`` (sampling + factor-28 resize) -> HF processor call with
SGLang's kwargs -> M-RoPE. The attribute list depends on private SGLang internals, so it is pinned to
``PINNED_SGLANG_VERSION``; re-check it on upgrade.

Differences from a real server (deliberate, CPU-only):
* ``--disable-fast-image-processor`` semantics (``disable_fast_image_processor=True``): SGLang passes no
  ``device=`` to the HF processor, so it runs on the frames' device (CPU). On a GPU server it would run on
  ``cuda:N``; that only matters when a resize is not an identity.
* torchcodec decodes on CPU (SGLang asks for CUDA and falls back, logging "CUDA video decoding failed").
* ``mm_feature_transport="cpu"``, no CUDA IPC, no processor worker pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import importlib.util
import os
import re
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Sequence

# The SGLang releases whose private attributes build_peer() sets (checked against each one's source).
PEER_SGLANG_VERSIONS = ("0.5.16", "0.5.23")
PINNED_SGLANG_VERSION = PEER_SGLANG_VERSIONS[-1]
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
# The peer also runs as any model type of vidcache's table (``hf_config.model_type``: SGLang branches on it).
from vidcache.families import FAMILY_OF_MODEL_TYPE, MODEL_TYPES  # noqa: E402

_ARCH = {name: m.architectures[0] for name, m in MODEL_TYPES.items()}
# vision_config.tokens_per_second of the published checkpoints (only Qwen2.5-VL has it).
_TOKENS_PER_SECOND = {"qwen2_vl": None, "qwen2_5_vl": 2, "qwen3_vl": None}

_imported = False
# preprocess_video results of the current run_peer call (qwen2/2.5 never hand the metadata to HF).
_PREPROCESS_LOG: contextvars.ContextVar = contextvars.ContextVar("sglang_peer_preprocess_log", default=None)


class PeerError(RuntimeError):
    """SGLang is installed but cannot serve as the peer (wrong version, a CPU set-up SGLang rejects)."""


def peer_installed() -> bool:
    """True if an ``sglang`` distribution is importable at all (nothing is imported)."""
    return importlib.util.find_spec("sglang") is not None


def peer_available() -> bool:
    """True if SGLang's qwen_vl processor imports in this interpreter; False only if it is not installed or
    one of its modules is missing (``ImportError``).  A wrong SGLang version raises ``PeerError``."""
    try:
        _import_sglang()
    except ImportError:
        return False
    return True


def require_peer():
    """Import the peer or raise: for tests, where an installed SGLang that does not work is a failure."""
    if not peer_installed():
        raise PeerError("SGLang is not installed: run scripts/setup_peer_env.sh")
    try:
        return _import_sglang()
    except ImportError as e:
        raise PeerError(f"SGLang is installed but its Qwen-VL processor does not import: {e!r}") from e


def _import_sglang():
    """Import SGLang's Qwen-VL processor, then make SGLang treat this process as a CPU engine.

    SGLANG_USE_CPU_ENGINE must NOT be set while importing (then mem_cache/memory_pool imports sgl_kernel).
    Afterwards ``is_cpu()`` (lru-cached) must return True, otherwise ``preprocess_video`` and the decoder call
    ``pin_memory()``, which fails on a host without an accelerator. We set the variable only long enough to
    refill the cache, so the rest of the process does not see it.
    """
    global _imported
    import importlib.metadata as md

    # The server's environment from `vidcache sglang-config` (SGLang 0.5.16 reads its total pixel budget from
    # one variable at import), as an operator starts the server with it.
    from vidcache.sglang.config import server_env
    for k, v in server_env().items():
        os.environ.setdefault(k, v)
    import sglang.srt.multimodal.processors.qwen_vl as qv
    from sglang.srt.utils import common

    if not _imported:
        ver = md.version("sglang")
        if ver not in PEER_SGLANG_VERSIONS:
            raise PeerError(
                f"tests/support/sglang_peer.py is written against sglang {', '.join(PEER_SGLANG_VERSIONS)}, "
                f"found {ver}; "
                "re-check the attribute list in build_peer()"
            )
        old = os.environ.get("SGLANG_USE_CPU_ENGINE")
        os.environ["SGLANG_USE_CPU_ENGINE"] = "1"
        try:
            common.is_cpu.cache_clear()
            if not common.is_cpu():
                raise PeerError("SGLang does not recognise this host as a CPU engine")
        finally:
            if old is None:
                del os.environ["SGLANG_USE_CPU_ENGINE"]
            else:
                os.environ["SGLANG_USE_CPU_ENGINE"] = old
        if ver == "0.5.16":
            _unpin_on_cpu_hosts()
        # Transparent wrapper around qwen_vl.preprocess_video (looked up as a module global by
        # _process_mm_data_uncached) that records the (frames, metadata) it returns.
        orig = qv.preprocess_video
        if not getattr(orig, "_sglang_peer_wrapper", False):

            async def preprocess_video(*args, **kwargs):
                result = await orig(*args, **kwargs)
                log = _PREPROCESS_LOG.get()
                if log is not None:
                    log.append(result)
                return result

            preprocess_video._sglang_peer_wrapper = True
            preprocess_video.__wrapped__ = orig
            qv.preprocess_video = preprocess_video
        _imported = True
    return qv


def _unpin_on_cpu_hosts():
    """SGLang 0.5.16 pins decoded and resized frames unconditionally (``video_decoder.get_frames_as_tensor``,
    ``preprocess_video``: ``.pin_memory()``); 0.5.23 skips that on a CPU engine.  Pinning needs a CUDA driver
    and only moves the same bytes into page-locked memory, so on a host without one the peer makes it the
    identity (a deliberate CPU-only difference, like the ones listed above).  Where CUDA exists, nothing
    changes."""
    import torch
    if torch.cuda.is_available():
        return
    torch.Tensor.pin_memory = lambda self, *a, **k: self


@dataclass
class _Record:
    """What SGLang handed to the HF processor on the last call."""

    calls: list = field(default_factory=list)


def build_hf_config(family: str, tokenizer) -> SimpleNamespace:
    """The few hf_config fields QwenVLImageProcessor reads, with token ids taken from ``tokenizer``."""
    if family not in FAMILY_OF_MODEL_TYPE:
        raise ValueError(f"unknown family or model type {family!r}; expected one of {sorted(FAMILY_OF_MODEL_TYPE)}")
    model_type, family = family, FAMILY_OF_MODEL_TYPE[family]
    tid = tokenizer.convert_tokens_to_ids
    return SimpleNamespace(
        model_type=model_type,
        architectures=[_ARCH[model_type]],
        vision_start_token_id=tid("<|vision_start|>"),
        vision_end_token_id=tid("<|vision_end|>"),
        image_token_id=tid("<|image_pad|>"),
        video_token_id=tid("<|video_pad|>"),
        vision_config=SimpleNamespace(spatial_merge_size=2, tokens_per_second=_TOKENS_PER_SECOND[family]),
    )


def build_peer(
    family: str,
    hf_processor,
    tokenizer=None,
    video_config: dict | None = None,
    *,
    processor_cls=None,
    image_config: dict | None = None,
):
    """A ready-to-run SGLang ``QwenVLImageProcessor`` (or ``processor_cls``, e.g. a plugin subclass).

    family: "qwen2_vl" | "qwen2_5_vl" | "qwen3_vl", or a model type of ``vidcache.families.MODEL_TYPES``
        (e.g. "qwen3_5"; becomes ``hf_config.model_type``, on which SGLang's processor branches).
    hf_processor: the HF processor SGLang would load (see tests/support/toy_processors.build_processor). For qwen2_vl a
        real server also forces size={shortest_edge: 3136, longest_edge: 1003520} on it when loading
        (``build_processor(..., sglang_size_override=True)``).
    tokenizer: defaults to ``hf_processor.tokenizer``.
    video_config: what the server gets from ``--mm-process-config '{"video": {...}}'`` (``self.video_config``).
    """
    qv = _import_sglang()
    from sglang.srt.multimodal.processors.base_processor import MultimodalSpecialTokens

    cls = processor_cls or qv.QwenVLImageProcessor
    if not issubclass(cls, qv.QwenVLImageProcessor):
        raise TypeError(f"{cls} is not a QwenVLImageProcessor subclass")
    tokenizer = tokenizer if tokenizer is not None else hf_processor.tokenizer
    hf_config = build_hf_config(family, tokenizer)

    obj = cls.__new__(cls)
    # --- QwenVLImageProcessor.__init__ (pre-super part)
    obj.model_type = hf_config.model_type
    # As SGLang 0.5.23's __init__ sets it (qwen_vl.py:353): for Qwen3-VL's own model types only.
    obj.uses_media_artifacts_without_cache = hf_config.model_type in ("qwen3_vl", "qwen3_vl_moe")
    # --- BaseMultimodalProcessor.__init__
    obj.hf_config = hf_config
    obj._processor = hf_processor
    obj.server_args = None
    obj.transport_mode = "default"
    obj.mm_feature_transport = "cpu"
    obj.keep_mm_feature_on_device = False      # 0.5.16 reads it in process_mm_data
    obj.use_cuda_ipc = False
    obj.use_ipc_pool_handle_cache = False
    obj.image_processor_backend = "pil"
    obj.disable_fast_image_processor = True
    obj.skip_tokenizer_init = False
    obj.image_config = dict(image_config or {})
    obj.video_config = dict(video_config or {})
    obj.audio_config = {}
    obj.mm_preprocess_cache = SimpleNamespace(enabled=False)
    obj.trust_mm_content_hashes = False
    obj.processor_fingerprint = None
    obj._tokenizer = tokenizer
    # Verbatim from BaseMultimodalProcessor.__init__ (SGLang 0.5.23 catches every exception here); the peer
    # reproduces it rather than narrowing it, or it would diverge from the server for odd tokenizers.
    try:
        obj._tokenizer_auto_adds_specials = len(tokenizer.encode("")) > 0
    except Exception:  # noqa: BLE001 -- SGLang's own guard, kept as SGLang has it
        obj._tokenizer_auto_adds_specials = False
    obj.NUM_TOKEN_PER_FRAME = 330
    obj.mm_io_worker_num = 4
    obj.io_executor = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="peer-mm-io")
    obj.mm_processor_worker_num = 1
    obj.mm_processor_executor = None
    import threading

    obj._cpu_executor_lock = threading.Lock()
    obj.cpu_executor = None
    obj.ATTR_NAME_TO_MODALITY = _attr_name_to_modality()
    obj.FEATURE_NAMES = ["pixel_values", "pixel_values_videos", "audio_features", "input_features"]
    # --- QwenVLImageProcessor.__init__ (post-super part)
    obj.IM_START_TOKEN_ID = hf_config.vision_start_token_id
    obj.IM_END_TOKEN_ID = hf_config.vision_end_token_id
    obj.IM_TOKEN_ID = hf_config.image_token_id
    obj.VIDEO_TOKEN_ID = hf_config.video_token_id
    obj.vision_start_token_id = hf_config.vision_start_token_id
    obj.vision_end_token_id = hf_config.vision_end_token_id
    obj.audio_start_token_id = None
    obj.audio_token_id = None
    obj._spatial_merge_size = hf_config.vision_config.spatial_merge_size
    obj._tokens_per_second = hf_config.vision_config.tokens_per_second
    obj.mm_tokens = MultimodalSpecialTokens(
        image_token="<|vision_start|><|image_pad|><|vision_end|>",
        image_token_id=hf_config.image_token_id,
        image_token_regex=re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>|<image>"),
        video_token_id=obj.VIDEO_TOKEN_ID,
        audio_token_id=obj.audio_token_id,
    ).build(hf_processor)
    # Reads the runtime context (get_mm(), get_parallel()); a no-op for CPU transport anyway.
    obj._mark_cuda_ipc_features_for_deferred_reconstruction = lambda mm_items: None
    # Record what reaches the HF processor (frames after SGLang's sampling/resize, metadata, kwargs).
    obj._peer_record = _Record()
    _orig_process_mm_data = obj.process_mm_data

    def _recording_process_mm_data(*args, **kwargs):
        ret = _orig_process_mm_data(*args, **kwargs)
        obj._peer_record.calls.append({"args": args, "kwargs": kwargs, "ret": ret})
        return ret

    obj.process_mm_data = _recording_process_mm_data
    obj._peer_family = FAMILY_OF_MODEL_TYPE[family]
    obj._peer_model_type = hf_config.model_type
    return obj


def _attr_name_to_modality():
    from sglang.srt.managers.schedule_batch import Modality

    return {
        "pixel_values": Modality.IMAGE,
        "image_grid_thw": Modality.IMAGE,
        "pixel_values_videos": Modality.VIDEO,
        "second_per_grid_ts": Modality.VIDEO,
        "video_grid_thw": Modality.VIDEO,
        "audio_features": Modality.AUDIO,
        "input_features": Modality.AUDIO,
        "feature_attention_mask": Modality.AUDIO,
    }


async def run_peer_async(peer, prompt_or_ids: str | Sequence[int], video_uris: Sequence[Any], *, rid: str = "peer",
                         image_uris: Sequence[Any] | None = None) -> dict:
    """Async form of :func:`run_peer`."""
    images = list(image_uris) if image_uris else None
    request = SimpleNamespace(video_data=list(video_uris), audio_data=None, image_data=images, rid=rid)
    prompt = list(prompt_or_ids) if not isinstance(prompt_or_ids, str) else prompt_or_ids
    peer._peer_record.calls.clear()
    log: list = []
    token = _PREPROCESS_LOG.set(log)
    try:
        if hasattr(peer, "_process_mm_data_uncached"):     # 0.5.2x
            out = await peer._process_mm_data_uncached(images, prompt, request)
        else:                                              # 0.5.16: the whole request path in one method
            out = await peer.process_mm_data_async(images, prompt, request)
    finally:
        _PREPROCESS_LOG.reset(token)
    return _collect(peer, out, log)


def run_peer(peer, prompt_or_ids: str | Sequence[int], video_uris: Sequence[Any], *, rid: str = "peer",
             image_uris: Sequence[Any] | None = None) -> dict:
    """Run SGLang's request preprocessing for one request with ``video_data=video_uris``.

    prompt_or_ids: prompt text with one compact ``<|vision_start|><|video_pad|><|vision_end|>`` per video, or
        the ids of such a prompt (SGLang then decodes them to text and the HF processor re-tokenizes).
    video_uris: what a client puts in ``video_data`` (``file:///abs.mkv``, a path, ``data:...;base64,``, bytes, a
        TCHW uint8 tensor, ...), one per placeholder.

    Returns a dict:
      input_ids            list[int], the expanded ids SGLang uses (what ``return_prompt_token_ids`` returns)
      pixel_values_videos  float32 tensor, the concatenated features of all video items (CPU)
      video_grid_thw       int64 tensor [n_videos, 3]
      second_per_grid_ts   tensor or None (qwen2_5_vl only)
      mrope_positions      tensor [3, len(input_ids)], mrope_position_delta
      frames               list of the uint8 TCHW tensors SGLang passed to the HF processor (after its sampling
                           and factor-28 resize), one per video
      video_metadata       list of the metadata dicts preprocess_video built (fps, duration, total_num_frames,
                           frames_indices, video_backend) or None entries for tensor inputs
      processor_kwargs     the other kwargs SGLang passed to the HF processor (videos_kwargs, video_metadata,
                           do_sample_frames, device, ...), without ``videos``
      hf_output            the raw HF processor output (BatchFeature)
      mm_items             SGLang's MultimodalDataItem list (feature, offsets, model_specific_data, hash)
      text                 the prompt text SGLang passed to the HF processor
      pixel_values         float32 tensor of the image items (``image_uris``: what a client puts in ``image_data``,
                           one per ``<|vision_start|><|image_pad|><|vision_end|>``), None without images
      image_grid_thw       the HF processor's image grids, None without images
    """
    return asyncio.run(run_peer_async(peer, prompt_or_ids, video_uris, rid=rid, image_uris=image_uris))


def _collect(peer, out, preprocess_log) -> dict:
    import torch

    calls = peer._peer_record.calls
    if len(calls) != 1:
        raise RuntimeError(f"expected one HF processor call, saw {len(calls)}")
    call = calls[0]
    kwargs = dict(call["kwargs"])
    frames = kwargs.pop("videos", None)
    text = kwargs.pop("input_text", call["args"][0] if call["args"] else None)
    ret = call["ret"]
    video_items = [it for it in out.mm_items if it.is_video()]
    feats = [it.feature for it in video_items]
    pixel_values_videos = (
        torch.cat([f.cpu() for f in feats], dim=0) if feats else None
    )
    image_feats = [it.feature for it in out.mm_items if it.is_image()]
    pixel_values = torch.cat([f.cpu() for f in image_feats], dim=0) if image_feats else None

    def _get(key):
        v = ret.get(key) if hasattr(ret, "get") else None
        return v

    # preprocess_video builds metadata for every family; only the qwen3 family hands it to HF.
    meta = [m for _, m in preprocess_log] if preprocess_log else kwargs.get("video_metadata")
    return {
        "input_ids": list(out.input_ids),
        "pixel_values_videos": pixel_values_videos,
        "hf_pixel_values_videos": _get("pixel_values_videos"),
        "video_grid_thw": _get("video_grid_thw"),
        "pixel_values": pixel_values,
        "image_grid_thw": _get("image_grid_thw"),
        "second_per_grid_ts": _get("second_per_grid_ts"),
        "mrope_positions": out.mrope_positions,
        "mrope_position_delta": out.mrope_position_delta,
        "frames": list(frames) if frames is not None else [],
        "video_metadata": meta,
        "processor_kwargs": kwargs,
        "hf_output": ret,
        "mm_items": out.mm_items,
        "text": text,
    }


# --------------------------------------------------------------------------------------------------------
# A live server: SGLang's endpoints in front of the peer
# --------------------------------------------------------------------------------------------------------
class PeerServer:
    """A real HTTP server (127.0.0.1) answering SGLang's ``/server_info``, ``/model_info`` and ``/generate``
    with the peer's processor behind ``/generate``, in the shapes SGLang 0.5.23's ``http_server.py`` uses:

    * ``/server_info``: the resolved server args that matter here (``mm_process_config``, ``device``) plus
      ``version`` (the installed SGLang's, unless ``version=`` overrides it);
    * ``/model_info``: ``model_type``, ``architectures``, ``tokenizer_path``, ``is_generation``;
    * ``/generate``: runs ``run_peer`` on ``input_ids`` (or ``text``) + ``video_data`` and answers with
      ``meta_info.prompt_tokens`` and, with ``return_prompt_token_ids``, top-level ``prompt_token_ids``; a
      ``ValueError`` from the processor is a 400 ``{"error": {"message": ...}}`` (``_create_error_response``),
      anything else a 500.  No tokens are generated (``max_new_tokens`` must be 0).

        with PeerServer(peer, tokenizer_path=ckpt_dir, mm_process_config=cfg) as srv:
            check_server(srv.url)
    """

    def __init__(self, peer, *, tokenizer_path: str | None = None, mm_process_config: dict | None = None,
                 version: str | None = None, device: str = "cpu", host: str = "127.0.0.1"):
        import importlib.metadata as md
        import threading
        from http.server import ThreadingHTTPServer

        self.peer = peer
        self.requests: list[dict] = []
        # model_impl: no model runs here; it answers as a server that computes the model's vision tower (see
        # sglang_standin.py), so check-server's [vision] check passes unless a test says "auto".
        self.server_info = {"version": version or md.version("sglang"), "mm_process_config": mm_process_config,
                            "device": device, "disable_fast_image_processor": True, "model_impl": "transformers"}
        model_type = peer._peer_model_type
        self.model_info = {"model_path": tokenizer_path, "tokenizer_path": tokenizer_path, "is_generation": True,
                           "model_type": model_type, "architectures": [_ARCH[model_type]]}
        lock = threading.Lock()            # one request at a time through the peer (asyncio.run per call)
        owner = self

        from support.json_http import JSONHandler

        class Handler(JSONHandler):
            _reply = JSONHandler.reply

            def do_GET(self):
                if self.path == "/server_info":
                    return self._reply(200, owner.server_info)
                if self.path == "/model_info":
                    return self._reply(200, owner.model_info)
                return self._reply(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                import json
                if self.path != "/generate":
                    return self._reply(404, {"error": {"message": f"no route {self.path}"}})
                payload = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                owner.requests.append(payload)
                prompt = payload.get("input_ids", payload.get("text"))
                try:
                    with lock:
                        out = run_peer(owner.peer, prompt, payload.get("video_data") or [])
                except ValueError as e:
                    return self._reply(400, {"error": {"message": str(e)}})
                except Exception as e:  # noqa: BLE001 -- SGLang answers 500 for any other failure
                    return self._reply(500, {"error": {"message": f"{type(e).__name__}: {e}"}})
                ids = list(out["input_ids"])
                resp = {"text": "", "meta_info": {"prompt_tokens": len(ids), "completion_tokens": 0,
                                                  "finish_reason": {"type": "length", "length": 0}}}
                if payload.get("return_prompt_token_ids"):
                    resp["prompt_token_ids"] = ids
                return self._reply(200, resp)

        self._httpd = ThreadingHTTPServer((host, 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self.url = f"http://{host}:{self._httpd.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()
