"""TEST-ONLY (and the CPU dry run, examples/miles_cpu_dry_run.py): a stand-in SGLang server for Miles' rollout code.

Miles' own ``MockSGLangServer`` (HTTP on 127.0.0.1), whose ``/generate`` runs SGLang's own Qwen-VL processor
(``tests/support/sglang_peer.py``: ``QwenVLImageProcessor._process_mm_data_uncached``, from the SGLang installed by
scripts/setup_peer_env.sh) on each request it receives (compact ``input_ids`` + ``video_data``) and answers like
SGLang: ``meta_info.prompt_tokens`` = SGLang's expanded length, top-level ``prompt_token_ids`` when requested,
``output_token_logprobs``, ``finish_reason``, and ``input_token_logprobs`` from ``logprob_start_len`` (counted on
the expanded sequence) for prefill scoring.  It also serves the ``/server_info`` and ``/model_info`` that
``vidcache check-server`` reads (a CPU device).  Needs Miles on ``sys.path`` (``MILES_SRC``).
"""
from __future__ import annotations

import concurrent.futures

from starlette.requests import Request  # module level: FastAPI resolves route annotations here

from support import sglang_peer
from support.miles_smoke_example import make_mock_server_cls
from vidcache.sglang.config import mm_process_config

ARCHITECTURES = {"qwen2_vl": "Qwen2VLForConditionalGeneration", "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
                 "qwen3_vl": "Qwen3VLForConditionalGeneration"}


def gen_logprob(pos: int, tid: int) -> float:
    return -((pos * 31 + tid) % 97) / 97.0 - 0.01


def prefill_logprob(pos: int, tid: int) -> float:
    return gen_logprob(pos, tid) - 0.5          # differs from generation: proves the prefill values were used


# --------------------------------------------------------------------------------------------------
# SGLang stand-in
# --------------------------------------------------------------------------------------------------
class SGLangStandIn(make_mock_server_cls()):
    """/generate runs SGLang's real processor on the request and answers with SGLang's response shape."""

    def __init__(self, *a, peer, family: str, **kw):
        self.peer = peer
        self.family = family
        self.log: list[dict] = []           # {"payload", "expanded", "peer"} per /generate
        self.flushes = 0
        self.abort_after: int | None = None   # answer the next request with an abort after this many tokens
        self.tamper: str | None = None        # "ids" | "length": corrupt the prompt report (divergence guard)
        self.reply = lambda text: "The square is \\boxed{red}."
        self._pool = concurrent.futures.ThreadPoolExecutor(1)   # run_peer uses asyncio.run: not on uvicorn's loop
        self.ckpt = kw.get("model_name")                          # /model_info's tokenizer_path
        super().__init__(*a, process_fn=lambda s: None, **kw)

    def _setup_routes(self):
        import importlib.metadata as md

        from fastapi.responses import JSONResponse

        @self.app.post("/flush_cache")
        async def flush_cache():
            self.flushes += 1
            return JSONResponse(content={"status": "ok"})

        # SGLang's own endpoints that `vidcache check-server` reads (registered first: they win over the mock's).
        # model_impl: the stand-in runs no model; it answers as a server that computes the model's vision tower
        # (sglang-config's stock flags), so check-server's [vision] check passes; a test sets "auto" to see it fail.
        self.server_info = {"version": md.version("sglang"), "mm_process_config": mm_process_config(),
                            "device": "cpu", "model_impl": "transformers"}

        @self.app.get("/server_info")
        async def server_info():
            return JSONResponse(content=self.server_info)

        @self.app.get("/model_info")
        async def model_info():
            return JSONResponse(content={"model_type": self.family, "architectures": [ARCHITECTURES[self.family]],
                                         "tokenizer_path": self.ckpt, "is_generation": True})

        @self.app.get("/list_workers")
        async def list_workers():
            return JSONResponse(content={"urls": [self.url]})

        @self.app.post("/generate")
        async def generate(request: Request):
            payload = await request.json()
            try:
                return JSONResponse(content=self._compute_generate_response(payload))
            except ValueError as e:             # SGLang: a processor ValueError is the client's error (400)
                return JSONResponse(status_code=400, content={"error": {"message": str(e)}})

        super()._setup_routes()

    def _compute_generate_response(self, payload: dict) -> dict:
        ids = list(payload["input_ids"])
        if payload.get("video_data"):
            out = self._pool.submit(sglang_peer.run_peer, self.peer, ids, payload["video_data"]).result()
            expanded = list(out["input_ids"])
        else:
            out, expanded = None, ids
        self.log.append({"payload": payload, "expanded": expanded, "peer": out})
        sp = payload["sampling_params"]
        meta = {"prompt_tokens": len(expanded), "cached_tokens": 0, "weight_version": "w0"}
        resp = {"meta_info": meta}
        if payload.get("return_prompt_token_ids"):
            resp["prompt_token_ids"] = list(expanded)          # top level, as SGLang's tokenizer manager does
        if self.tamper == "ids":
            resp["prompt_token_ids"] = expanded[:-1]
        elif self.tamper == "length":
            resp.pop("prompt_token_ids", None)
            meta["prompt_tokens"] = len(expanded) + 1
        if sp.get("max_new_tokens") == 0 and "logprob_start_len" in payload:      # prefill scoring
            start = payload["logprob_start_len"]
            meta["input_token_logprobs"] = [(None if p == start else prefill_logprob(p, expanded[p]), expanded[p], None)
                                            for p in range(start, len(expanded))]
            meta.update(finish_reason={"type": "length", "length": 0}, completion_tokens=0, output_token_logprobs=[])
            resp["text"] = ""
            return resp
        text = self.reply(self.tokenizer.decode(expanded))
        out_ids = self.tokenizer.encode(text, add_special_tokens=False)
        finish = {"type": "stop"}
        if self.abort_after is not None:
            out_ids, finish, self.abort_after = out_ids[: self.abort_after], {"type": "abort"}, None
        elif len(out_ids) > sp["max_new_tokens"]:
            out_ids = out_ids[: sp["max_new_tokens"]]
            finish = {"type": "length", "length": len(out_ids)}
        meta.update(finish_reason=finish, completion_tokens=len(out_ids),
                    output_token_logprobs=[(gen_logprob(len(expanded) + i, t), t) for i, t in enumerate(out_ids)])
        resp["text"] = self.tokenizer.decode(out_ids)
        return resp
