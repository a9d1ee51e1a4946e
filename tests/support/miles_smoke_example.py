"""Minimal CPU smoke of Miles' rollout code against Miles' own MockSGLangServer (loopback only).

NOT a pytest module (no ``test_`` prefix). Run it directly:

    bash scripts/setup_miles.sh                     # once: checkout + extra pip packages
    MILES_SRC=third_party/miles .venv/bin/python tests/support/miles_smoke_example.py

It exits 0 with "SKIP" when no Miles checkout is found, so it can be wired into CI safely.

What it shows (for reuse in miles_integration tests):
  * ``make_miles_args()``      - the minimal ``argparse.Namespace`` Miles' rollout path reads,
                                 built by hand (Miles' own ``parse_args`` needs Megatron + a full SGLang).
  * ``make_tiny_tokenizer()``  - an offline, local HF tokenizer dir with a Qwen-style chat template
                                 (``--hf-checkpoint`` / MockSGLangServer both need a loadable tokenizer;
                                 the hub is unreachable here).
  * ``install_miles_test_shims()`` - TEST-ONLY stubs for the sglang submodules Miles imports at module
                                 level but that the venv's sglang (the 0.5.23 peer) lacks.
  * part 1: ``single_turn.generate`` on a text-only Sample through GenerateState + MockSGLangServer.
  * part 2: the full default rollout function ``InferenceRolloutFn`` (train call) with
            ``RolloutDataSourceWithBuffer`` over a 3-row jsonl, against a mock subclass that adds the
            ``/workers`` and ``/flush_cache`` routes Miles calls (the stock mock lacks both).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))          # the support package, when run as a script

from support.miles_compat import ENV, install_test_shims, miles_src  # noqa: E402
from support.toy_processors import SPECIAL_TOKENS as TOY_SPECIAL_TOKENS  # noqa: E402


# --------------------------------------------------------------------------------------------------
# Locating Miles
# --------------------------------------------------------------------------------------------------
def find_miles_src() -> Path | None:
    """``$MILES_SRC``, defaulting to scripts/setup_miles.sh's checkout (same locator as the Miles tests:
    tests/support/miles_compat.py)."""
    os.environ.setdefault(ENV, str(REPO / "third_party" / "miles"))
    return miles_src(REPO)


# TEST-ONLY stub for the sglang module Miles imports but PyPI sglang 0.5.23 lacks (see tests/support/miles_compat.py).
install_miles_test_shims = install_test_shims


# --------------------------------------------------------------------------------------------------
# Offline tokenizer
# --------------------------------------------------------------------------------------------------
QWEN_STYLE_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'text' %}{{ item['text'] }}"
    "{% elif item['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif item['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = list(TOY_SPECIAL_TOKENS)


def make_tiny_tokenizer(out_dir: str | Path) -> str:
    """Write a small byte-level BPE tokenizer (Qwen-style specials + chat template) to ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "What is 1+7? The answer is \\boxed{8}.",
        "Describe the video. A cat jumps over a fence.",
        "system user assistant You are a helpful assistant.",
    ] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[3:],
    )
    fast.chat_template = QWEN_STYLE_CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return str(out_dir)


# --------------------------------------------------------------------------------------------------
# Args: the attributes Miles' rollout path actually reads (grouped by reader).
# --------------------------------------------------------------------------------------------------
def make_miles_args(*, hf_checkpoint: str, router_port: int, router_ip: str = "127.0.0.1", **overrides) -> Namespace:
    args = dict(
        # GenerateState.__init__ / load_tokenizer / load_processor
        hf_checkpoint=hf_checkpoint,
        chat_template_path=None,
        custom_generate_function_path=None,  # None -> single_turn.generate
        sglang_server_concurrency=8,  # semaphore = concurrency * rollout_num_gpus // rollout_num_gpus_per_engine
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        # compute_sampling_params
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_max_response_len=16,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        # single_turn.generate / compute_request_payload / routing headers / update_sample_from_response
        sglang_router_ip=router_ip,
        sglang_router_port=router_port,
        rollout_max_context_len=None,
        use_rollout_routing_replay=False,
        use_rollout_indexer_replay=False,
        sglang_router_policy=None,  # "consistent_hashing"/"manual" would require sample.routing_key
        sglang_speculative_algorithm=None,
        lora_rank=0,
        lora_adapter_path=None,
        lora_train_only=False,
        # http_utils.init_http_client (post() uses a module-global httpx client created here)
        eval_num_gpus=0,
        eval_num_gpus_per_engine=1,
        use_distributed_post=False,
        # generate_and_rm / rewards (async_rm)
        partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False,
        group_rm=False,
        rm_type="math",
        custom_rm_path=None,
        reward_key=None,
        eval_reward_key=None,
        sglang_enable_deterministic_inference=False,
        rollout_seed=42,
        # RolloutDataSource(.WithBuffer)
        rollout_global_dataset=True,
        prompt_data=None,
        input_key="input",
        label_key="label",
        metadata_key="metadata",
        tool_key=None,
        multimodal_keys=None,
        apply_chat_template=True,
        apply_chat_template_kwargs=None,
        rollout_max_prompt_len=None,
        rollout_shuffle=False,
        dump_details=None,
        n_samples_per_prompt=2,
        buffer_filter_path=None,
        save=None,
        load=None,
        # inference_rollout_train.generate_rollout_async
        rollout_batch_size=2,
        over_sampling_batch_size=2,
        rollout_submission_granularity=None,
        dynamic_sampling_filter_path=None,
        rollout_sample_filter_path=None,
        rollout_all_samples_process_path=None,
        recompute_logprobs_via_prefill=False,
        use_miles_router=False,
        custom_agent_function_path=None,
        dumper_enable=False,  # dumper_utils.configure_sglang reads dumper_enable + dumper_inference
        dumper_inference=None,
        # train.py's init hook, as `vidcache sglang-config --format miles` sets it for Qwen2/2.5-VL (the startup
        # check fails without it: the trainer would compute transformers' positions); a test sets None to see that.
        custom_megatron_init_path="miles_integration.train_hooks.install_train_hooks",
    )
    args.update(overrides)
    return Namespace(**args)


# --------------------------------------------------------------------------------------------------
# Mock server with the extra routes the train rollout calls
# --------------------------------------------------------------------------------------------------
def make_mock_server_cls():
    from fastapi.responses import JSONResponse
    from miles.utils.test_utils.mock_sglang_server import MockSGLangServer

    class RouterLikeMockServer(MockSGLangServer):
        """MockSGLangServer + ``GET /workers`` (abort() lists workers through the router) +
        ``POST /flush_cache`` (prefill recompute).  Custom /generate behaviour: override
        ``_compute_generate_response(payload) -> {"text", "meta_info"}`` (payloads are in ``request_log``)."""

        def _setup_routes(self):
            super()._setup_routes()

            @self.app.get("/workers")
            async def workers():
                return JSONResponse(content={"workers": [{"url": self.url}]})

            @self.app.post("/flush_cache")
            async def flush_cache():
                return JSONResponse(content={"status": "ok"})

    return RouterLikeMockServer


# --------------------------------------------------------------------------------------------------
def main() -> int:
    miles_src = find_miles_src()
    if miles_src is None:
        print("SKIP: no Miles checkout (run scripts/setup_miles.sh or set MILES_SRC)")
        return 0
    sys.path.insert(0, str(miles_src))
    stubs = install_miles_test_shims()
    print(f"miles: {miles_src}  stubs: {stubs or 'none'}")

    from miles.rollout.base_types import GenerateFnInput, RolloutFnConstructorInput, RolloutFnTrainInput
    from miles.rollout.data_source import RolloutDataSourceWithBuffer
    from miles.rollout.generate_hub import single_turn
    from miles.rollout.inference_rollout.inference_rollout_common import GenerateState, InferenceRolloutFn
    from miles.utils import http_utils
    from miles.utils.async_utils import run  # Miles' persistent background loop (as RolloutManager uses)
    from miles.utils.http_utils import find_available_port
    from miles.utils.test_utils.mock_sglang_server import ProcessResult
    from miles.utils.types import Sample

    tmp = tempfile.mkdtemp(prefix="miles_smoke_")
    tok_dir = make_tiny_tokenizer(Path(tmp) / "tok")

    def process_fn(prompt: str) -> ProcessResult:
        # MockSGLangServer decodes payload["input_ids"] with the tokenizer and passes the text here.
        m = re.search(r"What is 1\+(\d+)\?", prompt)
        ans = 1 + int(m.group(1)) if m else -1
        return ProcessResult(text=f"The answer is \\boxed{{{ans}}}.", finish_reason="stop")

    server = make_mock_server_cls()(
        model_name=tok_dir, process_fn=process_fn, host="127.0.0.1", port=find_available_port(31000)
    )
    server.start()
    try:
        args = make_miles_args(hf_checkpoint=tok_dir, router_port=server.port)
        # post() uses http_utils._http_client; without this every post fails and is retried 60x1s.
        # The httpx client binds to the first event loop that uses it: drive every coroutine through
        # miles.utils.async_utils.run (one background loop), NOT repeated asyncio.run() calls.
        http_utils.init_http_client(args)

        # ---- part 1: single_turn.generate, text only ------------------------------------------
        state = GenerateState(args)
        assert state.processor is None, "tokenizer-only checkpoint dir should give processor=None"
        prompt = state.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 1+7?"}], tokenize=False, add_generation_prompt=True
        )
        sample = Sample(prompt=prompt, label="8", index=0, group_index=0)
        out = run(
            single_turn.generate(
                GenerateFnInput(state=state, sample=sample, sampling_params=dict(state.sampling_params), evaluation=False)
            )
        )
        s = out.samples
        req = server.request_log[-1]
        prompt_ids = state.tokenizer.encode(prompt, add_special_tokens=False)
        assert req["input_ids"] == prompt_ids, "payload carries the tokenizer-encoded prompt (token-in)"
        assert set(req) >= {"input_ids", "sampling_params", "return_logprob"}, sorted(req)
        assert "image_data" not in req and "video_data" not in req
        assert req["sampling_params"]["max_new_tokens"] == args.rollout_max_response_len
        assert s.status == Sample.Status.COMPLETED, s.status
        assert s.tokens[: len(prompt_ids)] == prompt_ids and len(s.tokens) == len(prompt_ids) + s.response_length
        assert s.response == "The answer is \\boxed{8}." and len(s.rollout_log_probs) == s.response_length
        print(f"part1 OK: payload keys={sorted(req)}; tokens={len(s.tokens)} response_length={s.response_length}")

        # ---- part 2: default InferenceRolloutFn train call over RolloutDataSourceWithBuffer ------
        data = Path(tmp) / "prompts.jsonl"
        with open(data, "w") as f:
            for i in range(3):
                f.write(json.dumps({"input": f"What is 1+{i}?", "label": str(1 + i), "metadata": {"row": i}}) + "\n")
        args2 = make_miles_args(hf_checkpoint=tok_dir, router_port=server.port, prompt_data=str(data))
        data_source = RolloutDataSourceWithBuffer(args2)
        rollout_fn = InferenceRolloutFn(RolloutFnConstructorInput(args=args2, data_source=data_source))
        server.reset_stats()
        result = run(rollout_fn(RolloutFnTrainInput(rollout_id=0)))
        groups = result.samples
        assert len(groups) == args2.rollout_batch_size and all(len(g) == args2.n_samples_per_prompt for g in groups)
        assert all(smp.reward == 1 for g in groups for smp in g), [smp.reward for g in groups for smp in g]
        print(
            f"part2 OK: {len(groups)} groups x {len(groups[0])}; rewards={[smp.reward for g in groups for smp in g]}; "
            f"metadata={groups[0][0].metadata}; generate requests={len(server.request_log)} "
            f"{[tuple(r['input_ids'][-6:]) for r in server.request_log]}; "
            f"data_source offset={data_source.sample_offset} buffer={data_source.get_buffer_length()}"
        )
    finally:
        server.stop()
    print("SMOKE OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
