"""miles_integration against the real Miles source (MILES_SRC) and SGLang 0.5.23's real Qwen-VL processor.

The SGLang stand-in is Miles' MockSGLangServer (HTTP on 127.0.0.1) whose /generate runs SGLang's own
``QwenVLImageProcessor._process_mm_data_uncached`` (tests/support/sglang_peer.py) on each request it receives
(compact ``input_ids`` + ``video_data``) and answers like SGLang: ``meta_info.prompt_tokens`` = SGLang's expanded
length, top-level ``prompt_token_ids`` when requested, ``output_token_logprobs``, ``finish_reason``, and
``input_token_logprobs`` from ``logprob_start_len`` (counted on the expanded sequence) for prefill scoring.
Stock mode throughout; plugin mode (vidcache.sglang.plugin.qwen_vl.VidcacheQwenVLProcessor as the peer class) in one test.
Miles across nodes: a train actor in a separate process, configured only by VIDCACHE_DIR + VIDCACHE_SHARED,
hydrates the rollout node's handle tensor after the sources are deleted.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import quote

import pytest
import torch

from support.miles_compat import miles_or_skip

REPO = Path(__file__).resolve().parents[2]
MILES = miles_or_skip(REPO)       # Miles present: from here on a missing peer is a failure, never a skip

from support import sglang_peer  # noqa: E402

from miles.rollout.base_types import GenerateFnInput, RolloutFnConstructorInput, RolloutFnTrainInput  # noqa: E402
from miles.rollout.inference_rollout.inference_rollout_common import GenerateState  # noqa: E402
from miles.utils import http_utils  # noqa: E402
from miles.utils.async_utils import run  # noqa: E402
from miles.utils.http_utils import find_available_port  # noqa: E402
from miles.utils.misc import function_registry, load_function  # noqa: E402
from miles.utils.types import Sample  # noqa: E402
from support.miles_smoke_example import make_miles_args  # noqa: E402
from support.sglang_standin import SGLangStandIn, gen_logprob, prefill_logprob  # noqa: E402
from support.toy_processors import build_processor, save_checkpoint  # noqa: E402

import vidcache  # noqa: E402
from miles_integration.args import VidcacheConfig  # noqa: E402
from miles_integration.data_source import VidcacheDataSource, VidcacheDataset  # noqa: E402
from miles_integration.generate import generate, generate_multi_turn  # noqa: E402
from miles_integration.server_check import ensure_servers_checked  # noqa: E402
from miles_integration.meta import KEY, handles_from_metadata, request_state  # noqa: E402
from miles_integration.rollout import VidcacheRolloutFn  # noqa: E402
from miles_integration.train_hooks import HANDLE_KEY, HydratingIterator, decode_handles  # noqa: E402
from vidcache import ParityError, VideoOptions  # noqa: E402
from vidcache import keys as K  # noqa: E402
from vidcache.rollout.ref import parse_ref  # noqa: E402
from vidcache.processing import VIDEO_PLACEHOLDER  # noqa: E402
from vidcache.sglang.config import mm_process_config  # noqa: E402
from vidcache.testing.videos import make_video  # noqa: E402

FAMILY = "qwen2_5_vl"
OPTS = dict(vidcache_family=FAMILY, vidcache_fps=1.0, vidcache_min_pixels=3136, vidcache_max_pixels=50176)
TRAIN_KEYS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
# Qwen2.5-VL's template, reduced to what these prompts use: default system turn, video items, tool turns.
CHAT_TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] == 'video' or 'video' in c %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if m.get('tool_calls') %}{% for tc in m['tool_calls'] %}<tool_call>\n"
    "{\"name\": \"{{ tc['function']['name'] }}\", \"arguments\": {{ tc['function']['arguments'] | tojson }}}\n"
    "</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_SPECS = [{"type": "function", "function": {"name": "count_frames", "description": "count the frames",
                                                  "parameters": {"type": "object", "properties": {}}}}]
TOOL_CALL = '<tool_call>\n{"name": "count_frames", "arguments": {}}\n</tool_call>'


# --------------------------------------------------------------------------------------------------
# fixtures (module scope: one Miles/SGLang import, one server)
# --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("miles_int")
    ckpt = root / "ckpt"
    proc = save_checkpoint(FAMILY, ckpt, CHAT_TEMPLATE)
    (root / "videos").mkdir()
    for name, seed in (("a", 0), ("b", 1), ("c", 2)):
        make_video(str(root / "videos" / f"{name}.mp4"), codec="h264", width=160, height=120, fps=10, n_frames=30,
                   seed=seed)
    q = "<video>\nWhat colour is the square?"
    rows = [
        {"prompt": q, "videos": ["videos/a.mp4"], "label": "red", "metadata": {"row": 0}},
        {"prompt": [{"role": "user", "content": [{"type": "video", "video": "videos/b.mp4", "fps": 2.0},
                                                 {"type": "text", "text": "What moves?"}]}],
         "label": "red", "metadata": {"row": 1}},
        {"prompt": "What is 1+7?", "label": "8", "metadata": {"row": 2}},
        {"prompt": "<video> then <video>: same clip?", "videos": ["videos/a.mp4", "videos/c.mp4"], "label": "no",
         "metadata": {"row": 3}},
        {"prompt": q + " Answer with one word, please.", "videos": ["videos/a.mp4"], "label": "red",
         "metadata": {"row": 4}},
    ]
    data = root / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache_dir = root / "cache"
    # Video a is prewarmed; b and c are built on first use.
    vidcache.VideoCache(cache_dir).ensure(str(root / "videos" / "a.mp4"),
                                          VideoOptions(family=FAMILY, fps=1.0, min_pixels=3136, max_pixels=50176))
    peer = sglang_peer.build_peer(FAMILY, build_processor(FAMILY), video_config=mm_process_config()["video"])
    server = SGLangStandIn(family=FAMILY, model_name=str(ckpt), host="127.0.0.1", port=find_available_port(32000), peer=peer)
    server.start()

    async def reward(args, sample, **kw):
        return 1.0

    async def execute_tool(name, params):
        return "4 frames"

    def args(**over):
        a = make_miles_args(hf_checkpoint=str(ckpt), router_port=server.port, prompt_data=str(data),
                            input_key="prompt", multimodal_keys={"video": "videos"},
                            custom_generate_function_path="miles_integration.generate.generate",
                            custom_rm_path="vidcache_test.reward", rollout_max_response_len=96,
                            vidcache_cache=str(cache_dir), **OPTS)
        for k, v in over.items():
            setattr(a, k, v)
        return a

    base = args()
    http_utils.init_http_client(base)
    # What a run does before its first rollout (check-server against every worker); done here, once, so the
    # canary's one decode does not count in the tests below.
    run(ensure_servers_checked(base, GenerateState(base).processor))
    with function_registry.temporary("vidcache_test.reward", reward), \
            function_registry.temporary("vidcache_test.tool_specs", TOOL_SPECS), \
            function_registry.temporary("vidcache_test.execute_tool", execute_tool):
        yield argparse.Namespace(root=root, ckpt=ckpt, data=data, rows=rows, cache=cache_dir, server=server,
                                 args=args, state=GenerateState(base))
    server.stop()


def fresh_sample(env, row: int, args=None) -> Sample:
    ds = VidcacheDataSource(args or env.args())
    s = copy.deepcopy(ds.dataset.build_sample(row))
    s.index, s.group_index = 100 + row, 100 + row
    return s


def call_generate(env, sample, fn=generate, args=None, state=None):
    state = state or env.state
    return run(fn(GenerateFnInput(state=state, sample=sample, sampling_params=dict(state.sampling_params),
                                  evaluation=False))).samples


def assert_matches_sglang(sample: Sample, rec: dict):
    """The sample holds exactly what SGLang's processor computed for the request."""
    st = request_state(sample.metadata)
    assert sample.tokens[: st["prompt_len"]] == rec["expanded"]
    peer = rec["peer"]
    mm = sample.multimodal_train_inputs
    assert set(mm) == set(TRAIN_KEYS) and all(isinstance(v, torch.Tensor) for v in mm.values())
    assert torch.equal(mm["pixel_values_videos"], peer["pixel_values_videos"])
    assert torch.equal(mm["video_grid_thw"], peer["video_grid_thw"])
    assert torch.equal(mm["second_per_grid_ts"], torch.as_tensor(peer["second_per_grid_ts"], dtype=torch.float32))


# --------------------------------------------------------------------------------------------------
# data source
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def decode_counter(monkeypatch):
    import vidcache.loader.build

    calls = []     # cache.py imports decode_sample_resize at call time, from loader.build: patched there
    for mod, name in ((vidcache.loader.build, "decode_sample_resize"), (vidcache.loader.build, "open_reader")):
        orig = getattr(mod, name)

        def counted(*a, _orig=orig, _name=name, **kw):
            calls.append(_name)
            return _orig(*a, **kw)

        monkeypatch.setattr(mod, name, counted)
    return calls


def test_data_source_init_decodes_nothing_and_filters_from_cached_counts(env, decode_counter):
    probe = VidcacheDataSource(env.args())
    assert len(probe.dataset) == 5 and decode_counter == []
    tok = probe.dataset.tokenizer
    long_prompt = probe.dataset.render(probe.dataset.rows[4])
    n_compact = len(tok(long_prompt, add_special_tokens=False)["input_ids"])
    a_tokens = probe.dataset.rows[0].handles[0].num_video_tokens     # manifest only (a is prewarmed)
    assert decode_counter == []
    # Row 4 fits as text and is too long only once its video is expanded; row 0 (shorter text, same video) fits.
    max_len = n_compact + a_tokens - 2
    ds = VidcacheDataSource(env.args(rollout_max_prompt_len=max_len, rollout_shuffle=True))
    assert decode_counter == [], "init must not decode"
    assert len(ds.dataset) == 4 and ds.dataset.num_filtered == 1 and ds.dataset.num_unmeasured == 2  # b, c uncached
    groups = ds.get_samples(4)
    assert decode_counter == [], "get_samples must not decode"
    rows = sorted(g[0].metadata["row"] for g in groups)
    assert rows == [0, 1, 2, 3]
    for g in groups:
        assert len(g) == 2 and g[0].metadata == g[1].metadata and g[0] is not g[1]
        s = g[0]
        assert s.multimodal_inputs is None and s.multimodal_train_inputs is None and not s.tokens
        n_videos = {0: 1, 1: 1, 2: 0, 3: 2}[s.metadata["row"]]
        assert s.prompt.count(VIDEO_PLACEHOLDER) == n_videos and len(handles_from_metadata(s.metadata)) == n_videos
        assert s.prompt.startswith("<|im_start|>system\n") and s.prompt.endswith("<|im_start|>assistant\n")
    row1 = next(g[0] for g in groups if g[0].metadata["row"] == 1)
    assert handles_from_metadata(row1.metadata)[0].options.fps == 2.0       # per-item option kept
    with pytest.raises(vidcache.NotCachedError, match="prewarm"):
        VidcacheDataSource(env.args(vidcache_require_cached=True))


def test_data_source_state_round_trip_matches_miles(env, tmp_path):
    """Same offsets / epoch wrap / shuffle / save / load / buffer as Miles' RolloutDataSourceWithBuffer."""
    from miles.rollout.data_source import RolloutDataSourceWithBuffer

    text = tmp_path / "text.jsonl"
    text.write_text("".join(json.dumps({"prompt": f"row {r['metadata']['row']}", "label": "x", "metadata": r["metadata"]}) + "\n"
                            for r in env.rows))
    kw = dict(rollout_shuffle=True, n_samples_per_prompt=2, save=str(tmp_path / "ck"), load=str(tmp_path / "ck"))
    ours, theirs = VidcacheDataSource(env.args(**kw)), RolloutDataSourceWithBuffer(
        env.args(prompt_data=str(text), multimodal_keys=None, **kw))

    def rows(groups):
        return [(g[0].metadata["row"], g[0].group_index, [s.index for s in g]) for g in groups]

    for n in (2, 2, 3, 4):                                      # wraps epochs: reshuffles
        assert rows(ours.get_samples(n)) == rows(theirs.get_samples(n))
    assert ours.epoch_id == theirs.epoch_id >= 2
    pending = ours.get_samples(1)
    ours.add_samples(pending)
    assert ours.get_buffer_length() == 1
    assert ours.get_samples(1)[0][0].metadata == pending[0][0].metadata      # buffer first (pop_first)
    ours.save(7)
    after = rows(ours.get_samples(3))
    restored = VidcacheDataSource(env.args(**kw))
    restored.load(7)
    assert rows(restored.get_samples(3)) == after
    with pytest.raises(AssertionError):
        ours.add_samples([[pending[0][0]]])                     # group size must be n_samples_per_prompt
    # Miles' constructor built ours: every attribute Miles sets up, ours has (plus its config)
    assert set(vars(theirs)) <= set(vars(ours)) and set(vars(ours)) - set(vars(theirs)) == {"config", "_ahead",
                                                                                          "_ahead_at"}


def test_data_source_reads_ahead_in_the_samplers_order_across_epochs_and_resumes(env, tmp_path):
    """Read-ahead follows Miles' own sampler: the rows it pulls for are the rows get_samples then hands out, across
    reshuffled epochs and from a restored position; on a fresh node the videos land locally before they are sampled."""
    shared, node_a = tmp_path / "nfs", tmp_path / "node_a"
    a = vidcache.VideoCache(node_a, shared=str(shared))
    opts = VideoOptions(family=FAMILY, fps=1.0, min_pixels=3136, max_pixels=50176)
    for name in ("a", "b"):            # row 1's item asks for 2 fps: built on first use, like row 3's c
        a.ensure(str(env.root / "videos" / f"{name}.mp4"), opts)
    kw = dict(rollout_shuffle=True, n_samples_per_prompt=1, save=str(tmp_path / "ck"), load=str(tmp_path / "ck"),
              vidcache_cache=str(tmp_path / "node_b"), vidcache_shared=str(shared), vidcache_read_ahead=3)
    ds = VidcacheDataSource(env.args(**kw))
    assert ds.config.read_ahead == 3 and ds._ahead is not None
    ahead = ds.dataset.upcoming_rows(0, 0, shuffle=True)
    planned = [next(ahead) for _ in range(13)]
    taken = []
    for n in (2, 4, 3, 4):                                       # 13 rows over three epochs of 5, reshuffled
        taken += [g[0].metadata["row"] for g in ds.get_samples(n)]
        assert ds._ahead_at == (ds.epoch_id, ds.sample_offset)
    assert taken == planned and ds.epoch_id == 2
    # the fresh node holds the pulled videos (a, the one every row with a cached video names)
    key_a = a.find(str(env.root / "videos" / "a.mp4"), opts)
    node_b = ds.config.open_cache()
    until = time.monotonic() + 60
    while not node_b.local.exists_many([K.cas(a.manifest(key_a).frames.blob)])[0]:
        assert time.monotonic() < until, ds._ahead.counts
        time.sleep(0.05)
    ds.save(3)
    saved_at = (ds.epoch_id, ds.sample_offset)
    after = [g[0].metadata["row"] for g in ds.get_samples(3)]
    restored = VidcacheDataSource(env.args(**kw))
    first = restored._ahead
    restored.load(3)
    assert restored._ahead is not first and restored._ahead_at == saved_at != (0, 0)   # started again there
    resumed = restored.dataset.upcoming_rows(*saved_at, shuffle=True)
    assert [next(resumed) for _ in range(3)] == after == [g[0].metadata["row"] for g in restored.get_samples(3)]
    for d in (ds, restored):
        d.close()
    assert ds._ahead is None


def test_data_source_is_built_by_miles_constructor(env, monkeypatch, tmp_path):
    """State a future Miles adds in its constructors reaches VidcacheDataSource, and Miles' module-global
    ``Dataset`` is swapped only while Miles' constructor runs (restored afterwards, also on failure)."""
    import miles.rollout.data_source as mds
    from miles.utils.data import Dataset

    seen = []
    base_init, buffer_init = mds.RolloutDataSource.__init__, mds.RolloutDataSourceWithBuffer.__init__

    def future_base_init(self, args):
        seen.append(mds.Dataset)                      # what Miles' constructor will call to build its dataset
        base_init(self, args)
        self.future_state = {"tokens_seen": 0}

    def future_buffer_init(self, args):
        buffer_init(self, args)
        self.future_buffer_state = ["x"]

    monkeypatch.setattr(mds.RolloutDataSource, "__init__", future_base_init)
    monkeypatch.setattr(mds.RolloutDataSourceWithBuffer, "__init__", future_buffer_init)
    ds = VidcacheDataSource(env.args())
    assert ds.future_state == {"tokens_seen": 0} and ds.future_buffer_state == ["x"]
    assert isinstance(seen[0], functools.partial) and seen[0].func is VidcacheDataset
    assert seen[0].keywords == {"config": ds.config}
    assert isinstance(ds.dataset, VidcacheDataset) and ds.dataset.config is ds.config
    assert ds.buffer == [] and ds.sample_offset == 0 and ds.epoch_id == 0
    assert mds.Dataset is Dataset                                     # restored after init
    fresh = tmp_path / "fresh.mp4"                                   # never cached anywhere
    make_video(str(fresh), codec="h264", width=64, height=48, fps=10, n_frames=10, seed=9)
    (tmp_path / "fresh.jsonl").write_text(json.dumps({"prompt": "<video>", "videos": [str(fresh)]}) + "\n")
    with pytest.raises(vidcache.NotCachedError, match="require-cached"):
        VidcacheDataSource(env.args(prompt_data=str(tmp_path / "fresh.jsonl"), vidcache_require_cached=True))
    assert mds.Dataset is Dataset                                     # restored when init fails, too


def test_dataset_accepts_and_ignores_newer_miles_kwargs(env, caplog):
    """A newer Miles may pass dataset arguments vidcache does not take (e.g. video_process_config): they are
    accepted, ignored (video options come from --vidcache-*) and named in a warning."""
    from miles.utils.processing_utils import load_tokenizer

    cfg = VidcacheConfig.from_args(env.args())
    tok = load_tokenizer(str(env.ckpt), chat_template_path=None, trust_remote_code=True)
    kw = dict(tokenizer=tok, prompt_key="prompt", multimodal_keys={"video": "videos"}, label_key="label",
              apply_chat_template=True, config=cfg)
    plain = VidcacheDataset(str(env.data), **kw)
    with caplog.at_level(logging.WARNING, logger="miles_integration.data_source"):
        newer = VidcacheDataset(str(env.data), video_process_config={"fps": 4.0, "max_pixels": 1 << 20},
                                image_max_pixels=None, **kw)
    warned = [r.getMessage() for r in caplog.records if r.name == "miles_integration.data_source"]
    assert len(warned) == 1 and "video_process_config" in warned[0] and "image_max_pixels" not in warned[0]
    assert len(newer) == len(plain) == len(env.rows)
    for i in range(len(plain)):
        a, b = plain.samples[i], newer.samples[i]
        assert (a.prompt, a.label, a.metadata) == (b.prompt, b.label, b.metadata)   # same options, same handles
    assert handles_from_metadata(newer.samples[0].metadata)[0].options == cfg.options


# --------------------------------------------------------------------------------------------------
# generate: the full Miles rollout path against the stand-in
# --------------------------------------------------------------------------------------------------
def test_rollout_through_miles_matches_sglang_processor(env, decode_counter):
    srv = env.server
    srv.log.clear()
    args = env.args(rollout_batch_size=4, over_sampling_batch_size=4, n_samples_per_prompt=2)
    ds = VidcacheDataSource(args)
    fn = VidcacheRolloutFn(RolloutFnConstructorInput(args=args, data_source=ds))
    calls = []
    orig = vidcache.prepare
    vidcache.prepare = lambda *a, **k: calls.append(1) or orig(*a, **k)
    try:
        groups = run(fn(RolloutFnTrainInput(rollout_id=0))).samples
    finally:
        vidcache.prepare = orig
    assert len(groups) == 4 and all(len(g) == 2 for g in groups)
    assert len(calls) == 3, "one processor run per video prompt group, shared by its n samples"
    assert decode_counter.count("decode_sample_resize") == 2     # b and c, built on first use; a was prewarmed
    by_ids = {}
    for rec in srv.log:
        by_ids.setdefault(json.dumps(rec["payload"]["input_ids"]), rec)
    pad = env.state.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    for g in groups:
        for s in g:
            assert s.status == Sample.Status.COMPLETED and s.reward == 1.0 and s.response
            assert len(s.tokens) == len(s.tokens) - s.response_length + len(s.rollout_log_probs)
            row = s.metadata["row"]
            if row == 2:                                         # text row: Miles' own single_turn path
                assert s.multimodal_train_inputs is None and KEY not in s.metadata
                rec = by_ids[json.dumps(s.tokens[: len(s.tokens) - s.response_length])]
                assert "video_data" not in rec["payload"]
                continue
            st = request_state(s.metadata)
            rec = by_ids[json.dumps(st["compact_ids"])]
            p = rec["payload"]
            n_videos = 2 if row == 3 else 1
            assert p["input_ids"].count(pad) == n_videos                     # compact ids to SGLang
            assert p["video_data"] == st["video_data"] and len(p["video_data"]) == n_videos
            assert all(u.startswith("file:///") and u.endswith(".nut") for u in p["video_data"])
            assert p["return_prompt_token_ids"] is True and "image_data" not in p
            assert s.tokens.count(pad) == rec["expanded"].count(pad) > n_videos  # expanded ids in sample.tokens
            assert_matches_sglang(s, rec)
            assert s.rollout_log_probs == [gen_logprob(st["prompt_len"] + i, t)
                                           for i, t in enumerate(s.tokens[st["prompt_len"]:])]
    assert srv.flushes == 0


def test_divergence_guard(env):
    srv = env.server
    try:
        for how in ("ids", "length"):
            srv.tamper = how
            with pytest.raises(ParityError):
                call_generate(env, fresh_sample(env, 0))
    finally:
        srv.tamper = None
    s = call_generate(env, fresh_sample(env, 0))
    assert s.status == Sample.Status.COMPLETED


def test_a_server_with_another_config_stops_the_first_rollout(env, monkeypatch):
    """check-server runs against every worker the router lists before the first rollout: a server started
    with another mm_process_config, or an unverified SGLang, stops the run with the CLI's lines, and no
    rollout request reaches it."""
    import miles_integration.server_check as sc
    monkeypatch.setattr(sc, "_DONE", {})
    monkeypatch.setitem(env.server.server_info, "mm_process_config", {"video": {"fps": 2.0}})
    monkeypatch.setitem(env.server.server_info, "version", "0.5.1")
    env.server.log.clear()
    args = env.args(rollout_batch_size=2, over_sampling_batch_size=2, n_samples_per_prompt=1)
    fn = VidcacheRolloutFn(RolloutFnConstructorInput(args=args, data_source=VidcacheDataSource(args)))
    with pytest.raises(ParityError) as ei:
        run(fn(RolloutFnTrainInput(rollout_id=0)))
    lines = str(ei.value).splitlines()
    assert env.server.url in lines[0] and "parity NOT established" in lines[0]
    assert any(ln.startswith("FAIL [config]") and '"fps": 2.0' in ln for ln in lines), lines
    assert any(ln.startswith("FAIL [version]") and "0.5.1" in ln for ln in lines), lines
    canary_only = [r["payload"]["sampling_params"]["max_new_tokens"] for r in env.server.log]
    assert canary_only == [0]                       # the check's canary; no rollout request reached the server
    with pytest.raises(ParityError):                # the verdict holds for the process: no rollout slips through
        call_generate(env, fresh_sample(env, 0, args), state=GenerateState(args))
    assert len(env.server.log) == 1
    args.vidcache_check_servers = False             # --no-vidcache-check-servers: the operator's explicit choice
    s = call_generate(env, fresh_sample(env, 0, args), state=GenerateState(args))
    assert s.status == Sample.Status.COMPLETED


def test_the_startup_check_names_miles_flags_and_the_generated_flags_pass_it(env, monkeypatch):
    """Issue 40: on a GPU server in stock mode the startup check stops the run naming the flag a Miles user types
    (--vidcache-server-torchcodec, --vidcache-allow-unverified-sglang, --vidcache-mode), never the CLI's; with the
    flags `vidcache sglang-config --format miles` prints, the same servers pass."""
    import re
    import shlex

    import miles_integration.server_check as sc
    from miles_integration.args import add_vidcache_arguments
    from vidcache.sglang.config import format_miles, sglang_config
    monkeypatch.setattr(sc, "_DONE", {})
    monkeypatch.setitem(env.server.server_info, "device", "cuda")
    monkeypatch.setitem(env.server.server_info, "version", "0.5.1")
    monkeypatch.setitem(env.server.server_info, "mm_process_config", mm_process_config("0.5.1", FAMILY))
    args = env.args(vidcache_mode="stock")
    with pytest.raises(ParityError) as ei:
        run(ensure_servers_checked(args, env.state.processor))
    text = str(ei.value)
    assert "--vidcache-server-torchcodec 0.16.0" in text and "--vidcache-mode plugin" in text, text
    assert "--vidcache-allow-unverified-sglang 0.5.1" in text, text
    assert not re.search(r"(?<!vidcache)-(server-torchcodec|allow-unverified-sglang)", text), text
    # The flags the command prints for that release (bash: the fragment a launch script sources) pass the check.
    fragment = format_miles(sglang_config(FAMILY, "stock", sglang_version="0.5.1"))
    argv = shlex.split(re.search(r"VIDCACHE_MILES_ARGS=\((.*?)\n\)", fragment, re.S).group(1), comments=True)
    parser = add_vidcache_arguments(argparse.ArgumentParser())
    parser.add_argument("--sglang-mm-process-config", type=json.loads)
    parser.add_argument("--sglang-model-impl")
    parser.add_argument("--custom-megatron-init-path")
    flags, rest = parser.parse_known_args(argv)
    assert rest == [] and flags.sglang_mm_process_config == mm_process_config("0.5.1", FAMILY)
    assert flags.sglang_model_impl == "transformers"        # the model's vision tower (issue 47)
    args.custom_megatron_init_path = flags.custom_megatron_init_path
    for k, v in vars(flags).items():
        if k.startswith("vidcache_") and k != "vidcache_family" and v is not None:
            setattr(args, k, v)
    monkeypatch.setattr(sc, "_DONE", {})
    run(ensure_servers_checked(args, env.state.processor))


def test_the_startup_check_fails_without_the_train_hook_and_names_it(env, monkeypatch):
    """Issue 47: without --custom-megatron-init-path (and without an explicit --vidcache-positions transformers) a
    Qwen2.5-VL run would train at transformers' positions: the startup check fails, naming the flag; stating
    --vidcache-positions transformers turns it into a warning (the operator's choice)."""
    import miles_integration.server_check as sc
    from vidcache.sglang.config import MILES_TRAIN_HOOK
    monkeypatch.setattr(sc, "_DONE", {})
    args = env.args(custom_megatron_init_path=None)
    with pytest.raises(ParityError) as ei:
        run(ensure_servers_checked(args, env.state.processor))
    fail = [ln for ln in str(ei.value).splitlines() if ln.startswith("FAIL [positions]")]
    assert fail and f"--custom-megatron-init-path {MILES_TRAIN_HOOK}" in fail[0], str(ei.value)
    assert "Qwen2_5_VLModel.get_rope_index" in fail[0]
    monkeypatch.setattr(sc, "_DONE", {})
    run(ensure_servers_checked(env.args(custom_megatron_init_path=None, vidcache_positions="transformers"),
                               env.state.processor))
    ok, line = sc.positions_verdict(env.args(), FAMILY)
    assert ok and line.startswith("OK   [positions] the train hook")


def test_the_startup_check_fails_on_sglangs_own_qwen2_5_vl_vision_tower(env, monkeypatch):
    """Issue 47: a server on SGLang's own Qwen2.5-VL code (model_impl auto, no model package reported) fails the
    startup check with the vision cause, in Miles' spelling of the stock-mode statement."""
    import miles_integration.server_check as sc
    monkeypatch.setattr(sc, "_DONE", {})
    monkeypatch.setitem(env.server.server_info, "model_impl", "auto")
    args = env.args(vidcache_mode="stock")
    with pytest.raises(ParityError) as ei:
        run(ensure_servers_checked(args, env.state.processor))
    fail = [ln for ln in str(ei.value).splitlines() if ln.startswith("FAIL [vision]")]
    assert fail and "--model-impl transformers" in fail[0] and "--vidcache-server-vision package" in fail[0], fail
    monkeypatch.setattr(sc, "_DONE", {})
    run(ensure_servers_checked(env.args(vidcache_mode="stock", vidcache_server_vision="package"),
                               env.state.processor))


def test_partial_rollout_resume_does_not_rerun_the_processor(env, monkeypatch):
    srv = env.server
    srv.log.clear()
    s = fresh_sample(env, 1)
    srv.abort_after = 3
    s = call_generate(env, s)
    assert s.status == Sample.Status.ABORTED and s.response_length == 3
    st = request_state(s.metadata)
    first = list(s.tokens)
    buffered = pickle.loads(pickle.dumps(s))                     # through the partial-rollout buffer
    monkeypatch.setattr(vidcache, "prepare", lambda *a, **k: pytest.fail("processor re-run on resume"))
    out = call_generate(env, buffered)
    assert out.status == Sample.Status.COMPLETED
    rec = srv.log[-1]
    assert rec["payload"]["input_ids"] == st["compact_ids"] + first[st["prompt_len"]:]
    assert rec["payload"]["video_data"] == st["video_data"]
    assert rec["payload"]["sampling_params"]["max_new_tokens"] == env.state.sampling_params["max_new_tokens"] - 3
    assert rec["expanded"] == first                               # SGLang rebuilt exactly the expanded prefix
    assert out.tokens[: len(first)] == first and out.response_length == 3 + len(out.tokens) - len(first)
    assert_matches_sglang(out, srv.log[0])


def test_multi_turn_keeps_the_video_on_every_turn(env):
    srv = env.server
    srv.log.clear()
    srv.reply = lambda text: "The square is \\boxed{red}." if "<tool_response>" in text else TOOL_CALL
    args = env.args(custom_generate_function_path="miles_integration.generate.generate_multi_turn",
                    generate_max_turns=4, generate_tool_specs_path="vidcache_test.tool_specs",
                    generate_tool_call_parser="qwen25", generate_execute_tool_function_path="vidcache_test.execute_tool",
                    save_debug_trajectory_data=None)
    try:
        s = call_generate(env, fresh_sample(env, 3, args), fn=generate_multi_turn, state=GenerateState(args))
    finally:
        srv.reply = lambda text: "The square is \\boxed{red}."
    assert s.status == Sample.Status.COMPLETED and len(srv.log) == 2
    st = request_state(s.metadata)
    r1, r2 = srv.log
    assert r1["payload"]["video_data"] == r2["payload"]["video_data"] == st["video_data"]
    assert len(st["video_data"]) == 2
    turn1 = len(r2["expanded"])
    assert r2["payload"]["input_ids"] == st["compact_ids"] + s.tokens[st["prompt_len"]:turn1]
    assert r2["expanded"] == s.tokens[:turn1]                    # SGLang's view of turn 2 = trainer's tokens
    assert "<tool_response>\n4 frames" in s.response
    assert 0 in s.loss_mask and s.loss_mask[-1] == 1 and len(s.loss_mask) == s.response_length
    assert_matches_sglang(s, r1)


def test_text_only_multi_turn_falls_back_to_miles(env):
    args = env.args(generate_max_turns=2, generate_tool_specs_path="vidcache_test.tool_specs",
                    generate_tool_call_parser="qwen25", generate_execute_tool_function_path="vidcache_test.execute_tool",
                    save_debug_trajectory_data=None)
    env.server.log.clear()
    s = call_generate(env, fresh_sample(env, 2, args), fn=generate_multi_turn, state=GenerateState(args))
    assert s.status == Sample.Status.COMPLETED and "video_data" not in env.server.log[-1]["payload"]


def test_prefill_recompute_with_video(env):
    srv = env.server
    srv.log.clear()
    srv.flushes = 0
    args = env.args(rollout_batch_size=2, over_sampling_batch_size=2, n_samples_per_prompt=1,
                    recompute_logprobs_via_prefill=True)
    fn = VidcacheRolloutFn(RolloutFnConstructorInput(args=args, data_source=VidcacheDataSource(args)))
    assert fn.state.args.recompute_logprobs_via_prefill is False      # Miles' own (video-blind) prefill is off
    samples = [s for g in run(fn(RolloutFnTrainInput(rollout_id=0))).samples for s in g]
    prefills = [r for r in srv.log if r["payload"]["sampling_params"]["max_new_tokens"] == 0]
    assert len(samples) == 2 and len(prefills) == 2 and srv.flushes == 2
    for s in samples:
        st = request_state(s.metadata)
        rec = next(r for r in prefills if r["payload"]["input_ids"] == st["compact_ids"] + s.tokens[st["prompt_len"]:])
        p = rec["payload"]
        assert p["logprob_start_len"] == st["prompt_len"] - 1 and p["video_data"] == st["video_data"]
        assert rec["expanded"] == s.tokens
        assert s.rollout_log_probs == [prefill_logprob(st["prompt_len"] + i, t)
                                       for i, t in enumerate(s.tokens[st["prompt_len"]:])]
        assert s.metadata["rollout_log_probs_source"] == "sglang_prefill_recompute"


def test_eval_dataset_is_lazy(env, decode_counter):
    from miles.rollout.base_types import RolloutFnEvalInput
    from miles.utils.eval_config import EvalDatasetConfig

    cfg = EvalDatasetConfig(name="vid", path=str(env.data) + "@[0:2]", input_key="prompt", label_key="label",
                            metadata_key="metadata", n_samples_per_eval_prompt=1, temperature=1.0, top_p=1.0,
                            top_k=-1, max_response_len=96)
    args = env.args(eval_datasets=[cfg], eval_max_prompt_len=None, group_rm=False)
    fn = VidcacheRolloutFn(RolloutFnConstructorInput(args=args, data_source=VidcacheDataSource(args)))
    env.server.log.clear()
    out = run(fn(RolloutFnEvalInput(rollout_id=0))).data["vid"]
    assert len(out["samples"]) == 2 and all(s.status == Sample.Status.COMPLETED for s in out["samples"])
    assert all(r["payload"].get("video_data") for r in env.server.log)
    from miles_integration.data_source import VidcacheDataset
    assert [type(d) for d in fn.eval_prompt_dataset_cache.values()] == [VidcacheDataset]
    from miles.rollout.inference_rollout import inference_rollout_eval as ev
    from miles.utils.data import Dataset
    assert ev.Dataset is Dataset                                      # the patch is scoped to the call


def test_the_eval_swap_waits_for_another_swap_without_stopping_the_event_loop():
    """Both Dataset swaps (the data source's, eval's) go through one lock: the eval's waits while the data
    source's is held, keeps the event loop running meanwhile, then swaps and restores its own name."""
    import asyncio
    import threading

    import miles.rollout.data_source as mds
    from miles.rollout.inference_rollout import inference_rollout_eval as ev
    from miles.utils.data import Dataset

    from miles_integration.data_source import miles_builds, miles_builds_async

    held, release, seen = threading.Event(), threading.Event(), []

    def data_source_builds():
        with miles_builds(mds, "train factory"):
            held.set()
            assert release.wait(30)

    t = threading.Thread(target=data_source_builds)
    t.start()
    assert held.wait(30)

    async def main():
        async def eval_builds():
            async with miles_builds_async(ev, "eval factory"):
                seen.append(ev.Dataset)
        task = asyncio.create_task(eval_builds())
        for _ in range(20):
            await asyncio.sleep(0)                      # the loop runs on while the eval waits for the lock
        assert seen == [] and ev.Dataset is Dataset and mds.Dataset == "train factory"
        release.set()
        await asyncio.wait_for(task, 30)

    asyncio.run(main())
    t.join(30)
    assert seen == ["eval factory"] and ev.Dataset is Dataset and mds.Dataset is Dataset


# --------------------------------------------------------------------------------------------------
# handles mode, merge_samples, Ray
# --------------------------------------------------------------------------------------------------
def test_handles_mode_rebuilds_the_same_tensors_train_side(env):
    from miles.backends.training_utils.data import DataIterator
    from miles.utils.processing_utils import load_processor

    env.server.log.clear()
    args = env.args(vidcache_train_inputs="handles")
    s = call_generate(env, fresh_sample(env, 3, args), args=args, state=GenerateState(args))
    mm = s.multimodal_train_inputs
    assert set(mm) == {HANDLE_KEY} and mm[HANDLE_KEY].dtype == torch.uint8 and mm[HANDLE_KEY].numel() < 4096
    shipped = pickle.loads(pickle.dumps([mm, None]))             # what crosses the object store
    it = HydratingIterator(DataIterator({"tokens": [s.tokens, [1, 2]], "multimodal_train_inputs": shipped},
                                        micro_batch_size=2), load_processor(str(env.ckpt), trust_remote_code=True))
    batch = it.get_next(["tokens", "multimodal_train_inputs"])
    ref = copy.deepcopy(s)
    ref.multimodal_train_inputs = batch["multimodal_train_inputs"][0]
    assert batch["multimodal_train_inputs"][1] is None
    assert_matches_sglang(ref, env.server.log[-1])


def test_plugin_requests_name_the_samplers_next_entries_for_the_server(env):
    """--vidcache-server-read-ahead: each plugin request's first reference names the next entries of the data
    source's order (its read-ahead window), which the server node pulls (tests/sglang/test_plugin_refs.py)."""
    from miles_integration.generate import _pin_and_prepare

    args = env.args(vidcache_mode="plugin", vidcache_server_read_ahead=8, vidcache_read_ahead=5)
    ds = VidcacheDataSource(args)
    rows = ds.dataset.upcoming_rows(ds.epoch_id, ds.sample_offset, shuffle=bool(args.rollout_shuffle))
    want = []
    for r in [next(rows) for _ in range(5)]:
        for h in ds.dataset.rows[r].handles:
            with contextlib.suppress(vidcache.NotCachedError):
                want.append(h.resolve(build=False))
    want = list(dict.fromkeys(want))[:8]
    assert want, "the window holds cached entries"
    until = time.monotonic() + 60
    while ds._ahead.upcoming_keys(8) != want:
        assert time.monotonic() < until, (ds._ahead.upcoming_keys(8), want)
        time.sleep(0.05)
    sample = ds.dataset.build_sample(0)
    handles = handles_from_metadata(sample.metadata)
    prep = _pin_and_prepare(env.state.processor, sample.prompt, handles, ds.config)
    recs = [parse_ref(u) for u in prep.video_data]
    assert recs[0]["ahead"] == want and all("ahead" not in r for r in recs[1:])
    stock = _pin_and_prepare(env.state.processor, sample.prompt, handles, VidcacheConfig.from_args(env.args()))
    assert all(parse_ref(u) is None for u in stock.video_data)            # stock mode: frozen files, no hint
    off = VidcacheConfig.from_args(env.args(vidcache_mode="plugin"))
    assert "ahead" not in parse_ref(_pin_and_prepare(env.state.processor, sample.prompt, handles, off).video_data[0])
    ds.close()


def test_train_side_reads_a_steps_later_micro_batches_ahead(env, tmp_path):
    """On a fresh train node, the step's later micro-batches' entries are pulled while the first one is hydrated,
    through Miles' own DataIterator; every micro-batch's tensors equal the rollout node's."""
    from miles.backends.training_utils.data import DataIterator
    from miles.utils.processing_utils import load_processor

    from miles_integration.train_hooks import _STEP, encode_handles

    shared = str(tmp_path / "nfs")
    a = vidcache.VideoCache(tmp_path / "node_a", shared=shared)
    opts = VideoOptions(family=FAMILY, fps=1.0, min_pixels=3136, max_pixels=50176)
    hs = [vidcache.get(str(env.root / "videos" / f"{n}.mp4"), opts, a) for n in ("a", "b", "c")]
    proc = load_processor(str(env.ckpt), trust_remote_code=True)
    want = [vidcache.train_inputs(proc, [h], mode="stock") for h in hs]
    b = vidcache.VideoCache(tmp_path / "node_b", shared=shared)
    assert b.identity == a.identity            # registered last: the handles resolve to node B in this process
    mms = [{HANDLE_KEY: encode_handles([h], "stock")} for h in hs]
    it = HydratingIterator(DataIterator({"tokens": [[1], [2], [3]], "multimodal_train_inputs": mms},
                                        micro_batch_size=1), proc)
    blobs = [K.cas(h.manifest.frames.blob) for h in hs]
    got = [it.get_next(["tokens", "multimodal_train_inputs"])["multimodal_train_inputs"][0]]
    until = time.monotonic() + 60
    while not all(b.local.exists_many(blobs[1:])):     # the later two, before they are asked for
        assert time.monotonic() < until, _STEP["ahead"].counts
        time.sleep(0.05)
    got += [it.get_next(["tokens", "multimodal_train_inputs"])["multimodal_train_inputs"][0] for _ in range(2)]
    for g, w in zip(got, want):
        assert set(g) == set(TRAIN_KEYS) and all(torch.equal(g[k], w[k]) for k in TRAIN_KEYS)
    assert _STEP["ahead"].counts["failed"] == 0 and _STEP["ahead"].counts["pulled"] >= 2
    _STEP.pop("ahead").close()


def test_train_side_read_ahead_starts_when_the_steps_iterators_are_built(env, tmp_path, monkeypatch):
    """Miles' actor builds the step's iterators (``get_data_iterator``), then swaps the reference weights in before
    the first ``get_batch``: the wrapped ``get_data_iterator`` (Miles' own, one VPP stage) starts pulling every
    entry of the step then, before any micro-batch is asked for, and the first ``get_next`` continues that same
    read-ahead rather than starting another."""
    import miles.backends.training_utils.data as miles_data
    from miles.utils.processing_utils import load_processor

    from miles_integration.train_hooks import _STEP, encode_handles, wrap_get_data_iterator

    monkeypatch.setattr(miles_data, "get_parallel_state", lambda: argparse.Namespace(vpp_size=1))
    shared = str(tmp_path / "nfs")
    a = vidcache.VideoCache(tmp_path / "node_a", shared=shared)
    opts = VideoOptions(family=FAMILY, fps=1.0, min_pixels=3136, max_pixels=50176)
    hs = [vidcache.get(str(env.root / "videos" / f"{n}.mp4"), opts, a) for n in ("a", "b", "c")]
    b = vidcache.VideoCache(tmp_path / "node_b", shared=shared)
    assert b.identity == a.identity            # registered last: the handles resolve to node B in this process
    rollout_data = {"tokens": [[1], [2], [3]], "multimodal_train_inputs": [{HANDLE_KEY: encode_handles([h], "stock")}
                                                                          for h in hs],
                    "micro_batch_indices": [[0], [1], [2]], "num_microbatches": [3]}
    _STEP.clear()
    args = argparse.Namespace(qkv_format="thd", use_dynamic_global_batch_size=False)
    iterators, num = wrap_get_data_iterator(miles_data.get_data_iterator)(args, None, rollout_data)
    assert num == [3] and len(iterators) == 1
    ahead = _STEP["ahead"]
    blobs = [K.cas(h.manifest.frames.blob) for h in hs]
    until = time.monotonic() + 60
    while not all(b.local.exists_many(blobs)):          # all three, before any micro-batch was asked for
        assert time.monotonic() < until, ahead.counts
        time.sleep(0.05)
    proc = load_processor(str(env.ckpt), trust_remote_code=True)
    it = HydratingIterator(iterators[0], proc)
    got = it.get_next(["tokens", "multimodal_train_inputs"])["multimodal_train_inputs"][0]
    want = vidcache.train_inputs(proc, [hs[0]], mode="stock")
    assert all(torch.equal(got[k], want[k]) for k in TRAIN_KEYS)
    assert _STEP["ahead"] is ahead and ahead.counts["failed"] == 0 and ahead.counts["pulled"] == 3
    _STEP.pop("ahead").close()


# The train actor of "Miles across nodes": its own process, configured by its environment only.
TRAIN_NODE = textwrap.dedent("""
    import json, os, sys
    import torch
    import vidcache
    import vidcache.loader.build as build

    def no_decoding(*a, **k):
        raise AssertionError("the train node decoded a video: the shared tier should have served it")

    build.open_reader = no_decoding                   # every decode opens a reader here
    build.decode_sample_resize = no_decoding           # cache.py imports it from here at call time
    from transformers import AutoProcessor
    from miles_integration.train_hooks import HANDLE_KEY, decode_handles, hydrate

    workdir, ckpt = sys.argv[1], sys.argv[2]
    enc = torch.load(os.path.join(workdir, "handles.pt"), weights_only=True)
    _, handles = decode_handles(enc)
    assert not any(os.path.exists(h.source) for h in handles), "the sources must be gone"
    out = hydrate({HANDLE_KEY: enc, "extra": torch.tensor([7])}, AutoProcessor.from_pretrained(ckpt))
    torch.save(out, os.path.join(workdir, "hydrated.pt"))
    node = vidcache.node_cache()
    json.dump({"identity": node.identity, "path": node.path}, open(os.path.join(workdir, "node.json"), "w"))
""")


def _train_node(workdir, ckpt, env_vars: dict) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDCACHE_")}
    env.update(env_vars)
    return subprocess.run([sys.executable, "-c", TRAIN_NODE, str(workdir), str(ckpt)], check=False, cwd=str(REPO),
                          env=env, capture_output=True, text=True, timeout=300)


def test_miles_across_nodes_handles_hydrate_on_a_train_node(env, tmp_path, decode_counter):
    """Rollout node A (its own cache dir + a shared tier) runs the data source and the generate function with
    --vidcache-train-inputs handles; a train actor on node B -- a separate process whose only vidcache
    configuration is VIDCACHE_DIR (its own, empty) + VIDCACHE_SHARED -- rebuilds the tensors from the handle
    tensor after the sources are deleted: bit-identical, zero decodes."""
    node_a, tier, src, work = tmp_path / "node_a", tmp_path / "tier", tmp_path / "src", tmp_path / "work"
    src.mkdir()
    work.mkdir()
    for name, seed in (("x", 11), ("y", 12)):
        make_video(str(src / f"{name}.mp4"), codec="h264", width=160, height=120, fps=10, n_frames=30, seed=seed)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "<video> then <video>: same clip?", "videos": ["src/x.mp4", "src/y.mp4"],
                                "label": "no", "metadata": {"row": 0}}) + "\n")
    args = env.args(prompt_data=str(data), n_samples_per_prompt=1, vidcache_cache=str(node_a),
                    vidcache_shared=str(tier), vidcache_train_inputs="handles")
    [[s]] = VidcacheDataSource(args).get_samples(1)
    assert decode_counter == []
    env.server.log.clear()
    s = call_generate(env, s, args=args, state=GenerateState(args))
    assert s.status == Sample.Status.COMPLETED
    assert decode_counter.count("decode_sample_resize") == 2            # built on node A, on first use
    st = request_state(s.metadata)
    # stock mode, transport unset: the shared tier's URLs, readable from every SGLang node
    assert len(st["video_data"]) == 2
    assert all(u.startswith("file://" + quote(str(tier))) for u in st["video_data"])
    enc = s.multimodal_train_inputs[HANDLE_KEY]
    mode, handles = decode_handles(enc)
    cache_a = VidcacheConfig.from_args(args).open_cache()
    assert mode == "stock" and cache_a.identity.startswith("tier-")
    assert all(h.key is not None and h.identity == cache_a.identity for h in handles)   # pinned; named by the tier
    from transformers import AutoProcessor
    want = vidcache.train_inputs(AutoProcessor.from_pretrained(str(env.ckpt)), handles, mode=mode, memo=False)
    torch.save(enc, work / "handles.pt")
    shutil.rmtree(src)

    # Without the shared tier the train node cannot resolve A's handles: refused, not rebuilt elsewhere.
    r = _train_node(work, env.ckpt, {"VIDCACHE_DIR": str(tmp_path / "node_alone")})
    assert r.returncode != 0 and "TierMismatchError" in r.stderr, r.stderr[-3000:]
    assert not (work / "hydrated.pt").exists()

    r = _train_node(work, env.ckpt, {"VIDCACHE_DIR": str(tmp_path / "node_b"), "VIDCACHE_SHARED": str(tier)})
    assert r.returncode == 0, r.stderr[-3000:]
    node_b = json.loads((work / "node.json").read_text())
    assert node_b == {"identity": cache_a.identity, "path": str(tmp_path / "node_b")}
    got = torch.load(work / "hydrated.pt", weights_only=True)
    assert set(got) == set(want) | {"extra"} and torch.equal(got["extra"], torch.tensor([7]))
    for k in want:
        assert torch.equal(got[k], want[k]), k
    ref = copy.deepcopy(s)
    ref.multimodal_train_inputs = {k: got[k] for k in want}
    assert_matches_sglang(ref, env.server.log[-1])                      # = what SGLang's processor computed


def test_merge_samples_and_ray_transport_keep_handles(env):
    from miles.rollout.generate_utils.sample_utils import merge_samples

    s = call_generate(env, fresh_sample(env, 0))
    tok = env.state.tokenizer
    # Two turns of one trajectory, as the session server builds them (train tensors attached after the merge).
    a = copy.deepcopy(s)
    a.multimodal_train_inputs = None
    b = copy.deepcopy(a)
    obs = tok.encode("<|im_start|>user\nAgain?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    more = tok.encode("Red.", add_special_tokens=False)
    b.tokens = a.tokens + obs + more
    b.prompt = a.prompt + "x"
    b.response, b.response_length = "Red.", len(more)
    b.rollout_log_probs, b.loss_mask = [-0.1] * len(more), [1] * len(more)
    merged = merge_samples([a, b], tok)
    assert merged.metadata[KEY] == s.metadata[KEY]
    assert handles_from_metadata(merged.metadata) == handles_from_metadata(s.metadata)
    assert merged.tokens == b.tokens and merged.response_length == a.response_length + len(obs) + len(more)

    import ray
    from ray import cloudpickle

    back = cloudpickle.loads(cloudpickle.dumps(s))
    assert back.metadata == s.metadata and back.tokens == s.tokens
    assert all(torch.equal(back.multimodal_train_inputs[k], s.multimodal_train_inputs[k]) for k in TRAIN_KEYS)
    t0 = time.time()
    # address="local": a Ray instance of this test's own.  Without it ray.init joins any Ray cluster it finds
    # running on the machine (it scans for GCS processes), and then refuses num_cpus: a CI run failed so.
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        got = ray.get(ray.put([s, merged]))
    finally:
        ray.shutdown()
    assert got[0].metadata == s.metadata and got[1].metadata[KEY] == s.metadata[KEY]
    h = handles_from_metadata(got[0].metadata)[0]
    assert torch.equal(h.frames(), handles_from_metadata(s.metadata)[0].frames())
    assert all(torch.equal(got[0].multimodal_train_inputs[k], s.multimodal_train_inputs[k]) for k in TRAIN_KEYS)
    assert time.time() - t0 < 120


def test_add_arguments_through_miles_loader():
    p = argparse.ArgumentParser()
    for path in ("miles_integration.rollout.VidcacheRolloutFn", "miles_integration.generate.generate",
                 "miles_integration.generate.generate_multi_turn"):
        fn = load_function(path)
        assert callable(getattr(fn, "add_arguments", None))
        fn.add_arguments(p)                                      # all three on one parser: no conflict
    a = p.parse_args(["--vidcache-mode", "plugin", "--vidcache-fps", "2", "--generate-max-turns", "3"])
    assert a.vidcache_mode == "plugin" and a.vidcache_fps == 2.0 and a.generate_max_turns == 3
    # --vidcache-mode unset: plugin for qwen3_vl (its 32-grid frames only survive SGLang through the plugin)
    q3 = p.parse_args(["--vidcache-family", "qwen3_vl"])
    assert q3.vidcache_mode is None and VidcacheConfig.from_args(q3).mode == "plugin"
    assert VidcacheConfig.from_args(p.parse_args([])).mode == "stock"
    with pytest.raises(ValueError, match="--vidcache-mode plugin"):
        VidcacheConfig.from_args(p.parse_args(["--vidcache-family", "qwen3_vl", "--vidcache-mode", "stock"]))


def test_plugin_mode_matches_the_sglang_plugin(env, monkeypatch):
    """--vidcache-mode plugin against SGLang's processor replaced by vidcache's plugin class."""
    import vidcache.sglang.plugin.qwen_vl as plugin
    # The SGLang node's only vidcache configuration is its environment; here it shares the rollout's node.
    monkeypatch.setenv("VIDCACHE_DIR", str(env.cache))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    srv = env.server
    stock_peer = srv.peer
    srv.peer = sglang_peer.build_peer(FAMILY, build_processor(FAMILY), video_config=mm_process_config()["video"],
                                      processor_cls=plugin.VidcacheQwenVLProcessor)
    srv.log.clear()
    try:
        args = env.args(vidcache_mode="plugin")
        s = call_generate(env, fresh_sample(env, 0, args), args=args, state=GenerateState(args))
    finally:
        srv.peer = stock_peer
    st = request_state(s.metadata)
    assert st["mode"] == "plugin" and srv.log[-1]["payload"]["video_data"] == st["video_data"]
    # a reference (a data: URI naming the cache by identity and the entry by key), not a frozen file
    h = handles_from_metadata(s.metadata)[0]
    refs = [parse_ref(u) for u in st["video_data"]]
    # ... carrying the attestation of exactly the tensors the trainer gets (vidcache.attest, checked by the plugin)
    from vidcache.attest import attest
    from vidcache.rollout.ref import REF_VERSION
    from vidcache.families import FAMILIES
    assert refs == [{"vidcache_ref": REF_VERSION, "tier": vidcache.node_cache().identity, "key": h.resolve(build=False),
                     "attest": {**attest(s.multimodal_train_inputs)[0], "position": [0, 1]},
                     "layout": FAMILIES[h.options.family].model_layout}]
    assert refs[0]["tier"] == h.identity
    assert_matches_sglang(s, srv.log[-1])
    sfps = h.metadata["sample_fps"]
    assert s.multimodal_train_inputs["second_per_grid_ts"].item() == torch.tensor(2 / sfps).item()


def test_long_prompt_filter_is_exact_with_the_checkpoints_processor(env, decode_counter):
    """With --rollout-max-prompt-len the data source loads the checkpoint's processor and measures a cached
    row exactly (the processor's own expansion, from manifests only), at the boundary."""
    from vidcache.processing import expanded_ids

    probe = VidcacheDataSource(env.args())
    row = probe.dataset.rows[4]
    prompt = probe.dataset.render(row)
    exact = len(expanded_ids(build_processor(FAMILY), prompt, [h.manifest for h in row.handles], "stock"))
    keep = VidcacheDataSource(env.args(rollout_max_prompt_len=exact))
    drop = VidcacheDataSource(env.args(rollout_max_prompt_len=exact - 1))
    assert keep.dataset.processor is not None
    assert 4 in [keep.dataset.rows[int(i)].index for i in keep.dataset.origin_rows]
    assert 4 not in [drop.dataset.rows[int(i)].index for i in drop.dataset.origin_rows]
    assert decode_counter == []
