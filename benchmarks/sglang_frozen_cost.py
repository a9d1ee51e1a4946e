"""What one video request costs SGLang 0.5.23's Qwen-VL preprocessing, per input form.

    .venv/bin/python benchmarks/sglang_frozen_cost.py [--source VIDEO | --size 1280x720 --seconds 30]
                                                      [--repeat 5] [--families ...]

Runs SGLang's own ``_process_mm_data_uncached`` in this process (tests/support/sglang_peer.py, CPU) for:

  original  the source file, SGLang's default config (it decodes, samples and resizes itself)
  frozen    vidcache's stock-mode URI (the FFV1 frozen file) with ``vidcache sglang-config``
  plugin    vidcache's plugin-mode reference, through the plugin class SGLang registers

Qwen3-VL's default (32-grid) frames cannot be served in stock mode, so its frozen columns use
``VideoOptions.for_stock_sglang`` (224 grid; the frames column shows both shapes).  The plugin resolves
references through this process's node cache (``$VIDCACHE_DIR``, set to a temp dir here), as on a server.

and prints best-of-N wall times and their ratio to ``original``.  The three do not produce the same
tensors (``original`` uses SGLang's own sampling); this is a cost comparison only.  Never asserts.
Needs the peer environment: scripts/setup_peer_env.sh.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

PROMPT = "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>Describe the video.<|im_end|>\n"


def best_of(fn, n):
    fn()                                          # warm-up: imports, first-touch allocations
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", help="video file (default: generate a --size h264 clip at 30 fps)")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of the generated clip")
    ap.add_argument("--size", default="640x360", help="WxH of the generated clip")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--families", nargs="+", default=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
    args = ap.parse_args()
    logging.disable(logging.WARNING)              # SGLang's CPU-fallback notices on every decode

    from support import sglang_peer as sp
    from _common import get_handle
    from support.toy_processors import build_processor

    from vidcache import VideoOptions, prepare
    from vidcache.node import open_cache
    from vidcache.sglang.config import PLUGIN_PACKAGE, sglang_config
    from vidcache.testing.videos import make_video

    tmp = tempfile.mkdtemp(prefix="vidcache-bench-")
    src = args.source
    if src is None:
        w, h = map(int, args.size.split("x"))
        src = make_video(os.path.join(tmp, "source.mp4"), codec="h264", width=w, height=h, fps=30,
                         n_frames=int(args.seconds * 30))
    sp._import_sglang()
    from sglang.srt.managers.multimodal_processor import PROCESSOR_MAPPING, import_processors
    import_processors(PLUGIN_PACKAGE, overwrite=True)
    plugin_cls = {m.__name__: p for m, p in PROCESSOR_MAPPING.items()}
    # The plugin resolves references through the node's cache ($VIDCACHE_DIR), as on a server: make this
    # process's node cache that directory, so the requests below and the plugin name the same cache.
    os.environ["VIDCACHE_DIR"] = os.path.join(tmp, "cache")
    os.environ.pop("VIDCACHE_SHARED", None)
    cache = open_cache()

    print(f"source: {src} ({os.path.getsize(src) / 1e6:.1f} MB); best of {args.repeat} (median), seconds")
    print(f"{'family':11s} {'frames':>16s} {'original':>15s} {'frozen ffv1':>15s} {'frozen magicyuv':>15s} "
          f"{'plugin':>15s} {'ffv1/orig':>10s} {'myuv/orig':>9s} {'plugin/orig':>11s}")
    for fam in args.families:
        h = get_handle(cache, src, VideoOptions(family=fam))          # defaults: what plugin mode serves
        # Stock mode needs frames stock SGLang leaves alone: for Qwen3-VL the 224 grid (other frames than
        # the plugin's 32-grid ones, so its columns compare costs of different tensors); Qwen2/2.5-VL: the same.
        hs = get_handle(cache, src, VideoOptions.for_stock_sglang(fam))
        proc = build_processor(fam)
        uris = {"stock": prepare(proc, PROMPT, [hs], mode="stock").video_data,
                "plugin": prepare(proc, PROMPT, [h], mode="plugin").video_data,
                "magicyuv": prepare(proc, PROMPT, [hs], mode="stock", frozen_format="magicyuv").video_data}

        def peer(cfg, cls=None):
            return sp.build_peer(fam, build_processor(fam, sglang_size_override=True), video_config=cfg,
                                 processor_cls=cls)
        runs = {
            "original": (peer({}), ["file://" + os.path.abspath(src)]),
            "frozen": (peer(sglang_config(fam, "stock")["mm_process_config"]["video"]), uris["stock"]),
            "magicyuv": (peer(sglang_config(fam, "stock")["mm_process_config"]["video"]), uris["magicyuv"]),
            "plugin": (peer(sglang_config(fam, "plugin")["mm_process_config"]["video"],
                            plugin_cls[sp._ARCH[fam]]), uris["plugin"]),
        }
        res = {k: best_of(lambda p=p, u=u: sp.run_peer(p, PROMPT, u), args.repeat) for k, (p, u) in runs.items()}
        cell = {k: f"{b:.3f} ({m:.3f})" for k, (b, m) in res.items()}
        o = res["original"][0]
        shapes = 'x'.join(map(str, h.frames().shape))
        if hs.resolve() != h.resolve():
            shapes += f" (stock {'x'.join(map(str, hs.frames().shape[2:]))})"
        print(f"{fam:11s} {shapes:>16s} {cell['original']:>15s} "
              f"{cell['frozen']:>15s} {cell['magicyuv']:>15s} {cell['plugin']:>15s} {res['frozen'][0] / o:10.2f} "
              f"{res['magicyuv'][0] / o:9.2f} {res['plugin'][0] / o:11.2f}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
