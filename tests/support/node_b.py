"""Node B of tests/scenarios/test_cross_node.py, run as its own process: a fresh node of the cluster.

Its only configuration is the environment: ``VIDCACHE_DIR`` (its own empty local dir) and
``VIDCACHE_SHARED`` (the tier node A used).  It receives what node A produced (video URIs,
expected tensors, pickled handles) in a directory, runs SGLang 0.5.23's own processor on every
URI and hydrates every handle, with decoding disabled, and writes a JSON report.

    python tests/support/node_b.py WORKDIR
"""
import json
import os
import pickle
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/: the support package


def main(workdir: str) -> None:
    from support import sglang_peer as sp
    from support.toy_processors import build_processor

    import vidcache.loader.build as build
    from vidcache import mm_token_type_ids, train_inputs
    from vidcache.sglang.config import PLUGIN_PACKAGE, sglang_config

    def no_decoding(*a, **k):
        raise AssertionError("node B decoded a video: the shared tier should have served it")
    build.open_reader = no_decoding

    sp._import_sglang()
    from sglang.srt.managers.multimodal_processor import PROCESSOR_MAPPING, import_processors
    import_processors(PLUGIN_PACKAGE, overwrite=True)
    plugin = {m.__name__: p for m, p in PROCESSOR_MAPPING.items()}

    expected = torch.load(os.path.join(workdir, "expected.pt"), weights_only=True)
    cases = json.load(open(os.path.join(workdir, "cases.json")))
    report = {}
    for name, case in cases.items():
        family, mode = case["family"], case["mode"]
        peer = sp.build_peer(family, build_processor(family, sglang_size_override=True),
                             video_config=sglang_config(family, mode)["mm_process_config"]["video"],
                             processor_cls=plugin[sp._ARCH[family]] if mode == "plugin" else None)
        out = sp.run_peer(peer, case["prompt"], case["video_data"])
        want = expected[name]
        got = {"pixel_values_videos": out["pixel_values_videos"],
               "video_grid_thw": out["video_grid_thw"].to(torch.int64)}
        if out["second_per_grid_ts"] is not None:
            got["second_per_grid_ts"] = torch.as_tensor(out["second_per_grid_ts"], dtype=torch.float32)
        # the prompt's token types, from the ids SGLang's processor expanded here (node A's came from its own)
        got["mm_token_type_ids"] = mm_token_type_ids(build_processor(family), out["input_ids"])
        checks = {k: (k in got and torch.equal(got[k], want[k])) for k in want if k != "expanded_ids"}
        checks["same_keys"] = sorted(got) == sorted(k for k in want if k != "expanded_ids")
        checks["expanded_ids"] = out["input_ids"] == want["expanded_ids"].tolist()
        # The trainer side on node B: A's handles, hydrated with zero decodes.
        handles = pickle.load(open(os.path.join(workdir, f"{name}.handles.pkl"), "rb"))
        ti = train_inputs(build_processor(family), handles, mode=mode, memo=False)
        checks["handles_hydrate"] = all(torch.equal(ti[k], want[k]) for k in got if k != "mm_token_type_ids")
        report[name] = checks
    json.dump(report, open(os.path.join(workdir, "report.json"), "w"))


if __name__ == "__main__":
    main(sys.argv[1])
