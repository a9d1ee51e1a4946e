"""What each way of making SGLang compute Qwen2.5-VL's own vision tower costs a GRPO group (issue 47).

    .venv/bin/python benchmarks/sglang_vision_impl.py [--group 8] [--seconds 8]

Starts SGLang 0.5.23's real server on this CPU (tests/support/sglang_server.py: fp32, torch-native attention, the
``sgl_kernel`` CPU shim) three times on the same tiny random-weight Qwen2.5-VL, in plugin mode:
  shipped        SGLang's own model code (its tower attends across frames: not the model's computation);
  package        ``SGLANG_EXTERNAL_MODEL_PACKAGE=vidcache.sglang.models`` (sglang-config's plugin default);
  transformers   ``--model-impl transformers`` (sglang-config's stock default).
Each server gets the same GRPO group of one video prompt (a 32-token response each): its first sample, then the
other ``--group - 1`` at once (so the first one's prefill can be shared), after one warm-up request of another
video and a ``/flush_cache``.  Printed per server: the group's wall time, the prompt
tokens SGLang served from its radix cache (``meta_info.cached_tokens``, summed over the group), and the ratio of
the group's time to the shipped model's.  Figures are this CPU's and this tiny model's: the radix-cache line is the
structural result (a group's samples share their prompt's prefill, or not); the timing ratio is indicative only.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

PROMPT = "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Describe.<|im_end|>\n<|im_start|>assistant\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", type=int, default=8, help="samples per prompt (GRPO's n)")
    ap.add_argument("--seconds", type=int, default=8, help="clip length (2 fps: 2 frames per second)")
    ap.add_argument("--repeats", type=int, default=3, help="groups per server (the best is kept)")
    a = ap.parse_args()

    import transformers

    import vidcache
    from support import sglang_server as ss
    from support.tiny_checkpoint import write_tiny_checkpoint
    from vidcache import VideoCache, VideoOptions, prepare
    from vidcache.testing.videos import make_video

    root = tempfile.mkdtemp(prefix="vidcache-vision-impl-")
    os.environ["VIDCACHE_DIR"] = os.path.join(root, "node")
    os.environ.pop("VIDCACHE_SHARED", None)
    ckpt = write_tiny_checkpoint("qwen2_5_vl", os.path.join(root, "ckpt"))
    proc = transformers.AutoProcessor.from_pretrained(ckpt)
    opts = VideoOptions(family="qwen2_5_vl", fps=2.0, min_pixels=3136, max_pixels=50176)
    clips = [make_video(os.path.join(root, f"c{i}.mp4"), codec="h264", width=224, height=160, fps=10,
                        n_frames=10 * a.seconds, seed=i) for i in range(2)]
    handles = [vidcache.get(c, opts, VideoCache()) for c in clips]
    rows = []
    for vision in (ss.SHIPPED, "package", "transformers"):
        with ss.Server(ckpt, "plugin", node_dir=os.path.join(root, "node"),
                       log=os.path.join(root, f"server-{vision}.log"), vision=vision) as srv:
            def send(h):
                req = prepare(proc, PROMPT, [h], mode="plugin")
                status, out = srv.generate({"input_ids": req.compact_ids, "video_data": req.video_data,
                                            "sampling_params": {"max_new_tokens": 32, "temperature": 1.0}})
                assert status == 200, (out, srv.log_tail())
                return out["meta_info"]
            send(handles[1])                                    # warm-up: another video
            best, cached = float("inf"), 0
            for _ in range(a.repeats):                          # fresh cache each time: the group's own reuse
                flush = urllib.request.Request(srv.url + "/flush_cache", data=b"", method="POST")
                urllib.request.urlopen(flush, timeout=60).read()       # plain text, not JSON
                t0 = time.perf_counter()
                first = send(handles[0])                        # the group's first sample, then the rest at once
                with cf.ThreadPoolExecutor(a.group - 1) as ex:
                    metas = [first] + list(ex.map(send, [handles[0]] * (a.group - 1)))
                took = time.perf_counter() - t0
                if took < best:
                    best, cached = took, sum(int(m.get("cached_tokens", 0)) for m in metas)
            prompt = metas[0]["prompt_tokens"]
            log = open(srv.log_path, errors="replace").read()
            rows.append((vision, best, cached, prompt, "Radix cache is disabled" in log))
    base = rows[0][1]
    print(f"SGLang 0.5.23 on this CPU, tiny Qwen2.5-VL fp32, plugin mode; a group of {a.group} samples of one "
          f"{a.seconds} s video prompt ({rows[0][3]} prompt tokens), 32 new tokens each, the first sample then "
          f"the other {a.group - 1} at once, best of {a.repeats} with the cache flushed before each:")
    for vision, took, cached, prompt, disabled in rows:
        print(f"  {vision:13s} group {took:6.2f} s ({took / base:4.2f}x shipped)  prompt tokens from the radix cache "
              f"{cached:5d} of {prompt * a.group}{'  [SGLang: radix cache disabled]' if disabled else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
