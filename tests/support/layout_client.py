"""A rollout client in a process of its own, on whatever transformers this interpreter imports: prewarm the
given clips through this node's configuration, send each one as ``vidcache.prepare`` builds it to a live
server's ``/generate``, and print one JSON line per request: the trainer's expanded ids, the server's, the
layout, and whether ``PreparedRequest.check`` passed.

    PYTHONPATH=.overlays/transformers-5.25.0 python tests/support/layout_client.py URL CKPT MODE FAMILY CLIP...
"""
from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request


def main(argv) -> int:
    url, ckpt, mode, family, *clips = argv
    import transformers
    from transformers import AutoProcessor

    import vidcache
    from vidcache import ParityError, VideoOptions
    from vidcache.processing import VIDEO_PLACEHOLDER

    proc = AutoProcessor.from_pretrained(ckpt)
    prompt = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}Describe the video.<|im_end|>\n<|im_start|>assistant\n"
    opts = (VideoOptions(family=family, fps=2.0, min_pixels=3136, max_pixels=50176) if mode == "plugin"
            else VideoOptions.for_stock_sglang(family=family, fps=2.0, min_pixels=3136, max_pixels=100352))
    for clip in clips:
        prep = vidcache.prepare(proc, prompt, [vidcache.get(clip, opts)], mode=mode)
        body = json.dumps({"input_ids": prep.compact_ids, "video_data": prep.video_data, "return_prompt_token_ids": True,
                           "sampling_params": {"max_new_tokens": 0}}).encode()
        req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                status, resp = r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            status, resp = e.code, json.loads(e.read())
        try:
            prep.check(resp)
            guard = "pass"
        except ParityError as e:
            guard = str(e)
        print(json.dumps({"clip": clip, "status": status, "transformers": transformers.__version__,
                          "layout": prep.token_layout, "trainer_ids": prep.expanded_ids,
                          "server_ids": resp.get("prompt_token_ids"), "guard": guard}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
