"""What one video request costs vLLM 0.34.0's own media path and Qwen-VL processor: a cached vidcache reference vs
the original file.

    PYTHONPATH=.overlays/vllm-0.34.0:. .venv/bin/python benchmarks/vllm_reference.py \
        [--size 1280x720 --seconds 10 --fps 30] [--repeat 5] [--families qwen2_5_vl qwen3_vl]

Both columns run vLLM's code in this process, on CPU, with a weightless checkpoint (tests/support/vllm_peer.py):

  original   the source file as a base64 ``data:video/mp4`` URL through ``MediaConnector.fetch_video`` with vLLM's
             default loader for the processor (``qwen2_vl`` / ``qwen3_vl`` backends: they sample at 2 fps) and its
             default decoder, then the processor with its default kwargs (it resizes).  vLLM's default decoder is
             opencv; where ``cv2`` is not installed (this venv) the script says so and uses vLLM's ``torchcodec``
             decoder instead, which vLLM ships for the same loaders.
  reference  the entry's vidcache reference through the same ``fetch_video``, vidcache's loader selected by
             ``media_io_kwargs`` (``ENGINE_KWARGS``), then the processor with ``MM_PROCESSOR_KWARGS``.

Prints best-of-N wall times (fetch + processor) and reference/original.  The two do not give the same tensors (the
original path samples and resizes with vLLM's own rules); a cost comparison only.  Never asserts.
"""
from __future__ import annotations

import argparse
import base64
import importlib.util
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
from _common import best_of  # noqa: E402  (benchmarks/ is the script's own directory)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--families", nargs="+", default=["qwen2_5_vl", "qwen3_vl"])
    ap.add_argument("--default-size", action="store_true", help="cache at vidcache's default per-frame bound, not at "
                    "the size vLLM's own path feeds the ViT")
    a = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="vidcache-vllm-bench-")
    os.environ["VIDCACHE_DIR"] = os.path.join(tmp, "node")
    os.environ.pop("VIDCACHE_SHARED", None)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import transformers
    import vllm
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.media import MediaConnector

    import vidcache
    import vidcache.vllm.loader  # noqa: F401  (vLLM's plugin loader imports it through the entry point)
    from support import vllm_peer as vp
    from vidcache.rollout.ref import ref_uri
    from vidcache.testing.videos import make_video
    from vidcache.vllm.config import ENGINE_KWARGS, MM_PROCESSOR_KWARGS

    decoder = "opencv" if importlib.util.find_spec("cv2") else "torchcodec"
    if decoder != "opencv":
        print("note: cv2 (opencv) is not installed here: the original column uses vLLM's torchcodec decoder, "
              "not its default opencv one")
    w, h = map(int, a.size.split("x"))
    src = make_video(os.path.join(tmp, "src.mp4"), codec="h264", width=w, height=h, fps=a.fps,
                     n_frames=int(a.fps * a.seconds))
    data_url = "data:video/mp4;base64," + base64.b64encode(open(src, "rb").read()).decode()
    print(f"vLLM {vllm.__version__}, transformers {transformers.__version__}; {a.size}, {a.seconds:g} s at "
          f"{a.fps:g} fps h264; best of {a.repeat}")
    print(f"{'family':<12} {'frames (orig / ref)':<26} {'original s':>10} {'reference s':>11} {'ratio':>6}"
          "   ViT grid (orig / ref)")
    for fam in a.families:
        ckpt = vp.write_checkpoint(fam, os.path.join(tmp, f"ckpt-{fam}"))
        proc = MULTIMODAL_REGISTRY.create_processor(vp.model_config(ckpt, False, {"video": {"backend": decoder}}))
        vproc = proc.info.get_hf_processor().video_processor
        stock = MediaConnector(media_io_kwargs={"video": {"backend": decoder}})
        prompt = proc.info.get_tokenizer().encode("<|vision_start|><|video_pad|><|vision_end|>")
        orig_grid = tuple(proc(prompt, proc.info.parse_mm_data({"video": [stock.fetch_video(
            data_url, video_processor=type(vproc).__name__).media]}), hf_processor_mm_kwargs={})["mm_kwargs"]
            .get_data()["video_grid_thw"][0].tolist())
        # Like for like: the entry is cached at the size vLLM's own path gives the ViT from the original (its grid
        # times the patch size); --default-size uses vidcache's default per-frame bound instead (smaller here).
        side = vproc.patch_size
        opts = (vidcache.VideoOptions(family=fam, fps=2.0) if a.default_size else
                vidcache.VideoOptions(family=fam, fps=2.0, resized_height=orig_grid[1] * side,
                                      resized_width=orig_grid[2] * side))
        handle = vidcache.get(src, opts)
        ref = ref_uri(handle.identity, handle.resolve())
        ours = MediaConnector(media_io_kwargs={"video": {**ENGINE_KWARGS["media_io_kwargs"]["video"],
                                                         "backend": decoder}})
        shapes = {}

        def run(conn, url, kwargs, tag):
            frames, meta = conn.fetch_video(url, video_processor=type(vproc).__name__).media
            shapes[tag] = tuple(frames.shape)
            items = proc.info.parse_mm_data({"video": [(frames, meta)]})
            proc(prompt, items, hf_processor_mm_kwargs=kwargs)

        t_orig = best_of(lambda: run(stock, data_url, {}, "orig"), a.repeat)
        t_ref = best_of(lambda: run(ours, ref, MM_PROCESSOR_KWARGS, "ref"), a.repeat)
        grid = tuple(handle.manifest.tokens.video_grid_thw)
        sh = " / ".join("x".join(map(str, shapes[k][:3])) for k in ("orig", "ref"))
        print(f"{fam:<12} {sh:<26} {t_orig:>10.3f} {t_ref:>11.3f} {t_ref / t_orig:>5.2f}x   grid {orig_grid} / {grid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
