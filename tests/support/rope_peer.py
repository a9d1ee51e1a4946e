"""The components' own M-RoPE position functions, run on cases given as JSON (a test peer, not a test module).

    [PYTHONPATH=<overlay>] python tests/support/rope_peer.py ENGINE < cases.json  ->  JSON on stdout

ENGINE: ``sglang`` (``srt/layers/rotary_embedding/mrope_rope_index.get_rope_index``), ``vllm``
(``get_mrope_input_positions`` of vLLM's own model classes) or ``transformers`` (the model's own
``get_rope_index``).  Which release runs is whatever the interpreter imports (the venv, or an overlay on
``PYTHONPATH``); the reply names it.  Each case: ``family``, ``ids``, ``merge``, ``tokens_per_second``, the token
ids, and ``image_grid_thw`` / ``video_grid_thw`` / ``second_per_grid_ts`` (float32 values, as processors give them).
No weights are loaded: the functions only read the config.
"""
from __future__ import annotations

import functools
import json
import sys
import types

import torch

MODEL_TYPE = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_5_vl", "qwen3_vl": "qwen3_vl"}


def _grids(case, name):
    g = case.get(name)
    return None if not g else torch.tensor(g, dtype=torch.long).reshape(-1, 3)


def _spg(case):
    s = case.get("second_per_grid_ts")
    return None if s is None else torch.tensor(s, dtype=torch.float32)


def sglang(case):
    from sglang.srt.layers.rotary_embedding.mrope_rope_index import get_rope_index
    pos, _ = get_rope_index(case["merge"], case["image_token_id"], case["video_token_id"],
                            case["vision_start_token_id"], MODEL_TYPE[case["family"]],
                            tokens_per_second=case["tokens_per_second"],
                            input_ids=torch.tensor([case["ids"]], dtype=torch.long),
                            image_grid_thw=_grids(case, "image_grid_thw"),
                            video_grid_thw=_grids(case, "video_grid_thw"),
                            second_per_grid_ts=_spg(case))
    return pos[:, 0, :].tolist()


def _hf_config(case):
    import transformers
    ids = {k: case[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")}
    vision = {"spatial_merge_size": case["merge"]}
    if case["family"] == "qwen2_5_vl":
        vision["tokens_per_second"] = case["tokens_per_second"]
    cls = {"qwen2_vl": transformers.Qwen2VLConfig, "qwen2_5_vl": transformers.Qwen2_5_VLConfig,
           "qwen3_vl": transformers.Qwen3VLConfig}[case["family"]]
    return cls(vision_config=vision, **ids)


def hf(case):
    import transformers
    cls = {"qwen2_vl": transformers.Qwen2VLModel, "qwen2_5_vl": transformers.Qwen2_5_VLModel,
           "qwen3_vl": transformers.Qwen3VLModel}[case["family"]]
    me = types.SimpleNamespace(config=_hf_config(case))
    me.get_vision_position_ids = functools.partial(cls.get_vision_position_ids, me)
    ids = torch.tensor([case["ids"]], dtype=torch.long)
    mm = torch.zeros_like(ids, dtype=torch.int32)
    mm[ids == case["image_token_id"]] = 1
    mm[ids == case["video_token_id"]] = 2
    kw = {"image_grid_thw": _grids(case, "image_grid_thw"), "video_grid_thw": _grids(case, "video_grid_thw")}
    if case["family"] == "qwen2_5_vl":
        kw["second_per_grid_ts"] = _spg(case)
    pos, _ = cls.get_rope_index(me, ids, mm_token_type_ids=mm, **kw)
    return pos[:, 0, :].tolist()


def vllm(case):
    from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
    from vllm.model_executor.models.qwen2_vl import Qwen2VLForConditionalGeneration
    from vllm.model_executor.models.qwen3_vl import Qwen3VLForConditionalGeneration
    cls = {"qwen2_vl": Qwen2VLForConditionalGeneration, "qwen2_5_vl": Qwen2_5_VLForConditionalGeneration,
           "qwen3_vl": Qwen3VLForConditionalGeneration}[case["family"]]
    cfg = _hf_config(case)
    features = []          # what vLLM's processor records per item: its modality, offset and tensors
    ids = case["ids"]
    vi = ii = 0
    i = 0
    spg = case.get("second_per_grid_ts")
    while i < len(ids):
        tok = ids[i]
        if tok == case["video_token_id"] or tok == case["image_token_id"]:
            video = tok == case["video_token_id"]
            if video:
                g = case["video_grid_thw"][vi]
                data = {"video_grid_thw": types.SimpleNamespace(data=torch.tensor(g))}
                if spg is not None:
                    data["second_per_grid_ts"] = types.SimpleNamespace(data=torch.tensor(spg[vi], dtype=torch.float32))
                vi += 1
                # Qwen3-VL: one placeholder for the whole video (its frames' timestamps and pads); vLLM finds
                # each frame from the offset by its <|vision_start|>: the one before the first pad will do.
                start = i if case["family"] != "qwen3_vl" else i - 1
                n = g[0] * g[1] * g[2] // (case["merge"] ** 2)
                if case["family"] == "qwen3_vl":     # skip the rest of this video's frames
                    seen = 0
                    while seen < n:
                        seen += 1 if ids[i] == tok else 0
                        i += 1
                else:
                    i += n
            else:
                g = case["image_grid_thw"][ii]
                ii += 1
                data = {"image_grid_thw": types.SimpleNamespace(data=torch.tensor(g))}
                start, n = i, g[0] * g[1] * g[2] // (case["merge"] ** 2)
                i += n
            features.append(types.SimpleNamespace(modality="video" if video else "image", data=data,
                                                  mm_position=types.SimpleNamespace(offset=start)))
        else:
            i += 1
    if case["family"] == "qwen3_vl":
        pos, _ = cls._get_mrope_input_positions(input_tokens=ids, mm_features=features, config=cfg)
    else:
        me = types.SimpleNamespace(config=cfg)
        me.iter_mm_grid_thw = functools.partial(cls.iter_mm_grid_thw, me)
        pos, _ = cls.get_mrope_input_positions(me, ids, features)
    return torch.as_tensor(pos).tolist()


def versions(engine: str) -> dict:
    import importlib.metadata as md
    out = {"transformers": md.version("transformers"), "torch": torch.__version__}
    if engine == "sglang":
        import sglang
        out["sglang"] = sglang.__version__
    if engine == "vllm":
        import vllm
        out["vllm"] = vllm.__version__
    return out


if __name__ == "__main__":
    engine = sys.argv[1]
    fn = {"sglang": sglang, "vllm": vllm, "transformers": hf}[engine]
    cases = json.load(sys.stdin)
    json.dump({"versions": versions(engine), "positions": [fn(c) for c in cases]}, sys.stdout)
