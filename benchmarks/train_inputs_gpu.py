"""Trainer inputs on the GPU (issue 16), from one run on a CUDA machine:

(g1) first-touch ``train_inputs(device="cuda")`` (memo off: cache read + pinned copy + HF's processor on the
     GPU) vs decode-and-process from the source: qwen-vl-utils ``fetch_video`` (decord) + HF's processor on
     the CPU.  Target >= 100x.  The tensors of both are compared with ``torch.equal``.
(g2) a micro-batch of 32 handles (32 distinct entries) hydrated on the GPU with ``train_inputs_batch`` vs
     HF's processor on the CPU over the same cached frames; one batched processor call vs one per video.

    python benchmarks/train_inputs_gpu.py [CLIP_DIR]     # CLIP_DIR: camera-like clips (made if absent)
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))
from _common import report  # noqa: E402
from support.toy_processors import build_processor  # noqa: E402

import vidcache  # noqa: E402
from vidcache import VideoCache, VideoOptions  # noqa: E402
from vidcache.handle import _read_into  # noqa: E402
from vidcache.processing import MEMO, VIDEO_PLACEHOLDER, model_tensors, processor_kwargs  # noqa: E402


def timed(fn, repeat: int = 5, sync: bool = True) -> float:
    """Best wall time of ``repeat`` calls, the GPU's queue drained inside each."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        if sync:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def first_touch(clips: list[str], family: str, cache: VideoCache) -> list[tuple[str, str]]:
    import qwen_vl_utils.vision_process as qvu
    qvu.get_video_reader_backend = lambda: "decord"
    proc = build_processor(family)
    patch = proc.video_processor.patch_size
    cap = {k: v for k, v in processor_kwargs(proc, [], "stock").items() if k == "cap_pixels_per_frame"}
    rows = []
    ratios = []
    for path in clips:
        h = vidcache.get(path, VideoOptions(family=family), cache)

        def from_source():
            (video, meta), _ = qvu.fetch_video({"type": "video", "video": path}, image_patch_size=patch,
                                               return_video_sample_fps=True, return_video_metadata=True)
            meta = {k: meta[k] for k in ("fps", "frames_indices", "total_num_frames")}
            return model_tensors(proc(videos=[video], video_metadata=[meta], do_sample_frames=False,
                                      return_tensors="pt", **cap))     # the video tensors only, as on the GPU

        ref = from_source()
        t0 = time.perf_counter()
        got = h.train_inputs(proc, memo=False, device="cuda", mode="plugin")
        torch.cuda.synchronize()
        t_first_call = time.perf_counter() - t0          # includes this process's first CUDA work for this shape
        assert all(torch.equal(got[k].cpu(), ref[k]) for k in ref), "GPU tensors differ from the source path"
        t_src = timed(from_source, 3, sync=False)
        t_gpu = timed(lambda: h.train_inputs(proc, memo=False, device="cuda", mode="plugin"), 10)
        t_cpu = timed(lambda: h.train_inputs(proc, memo=False, device="cpu", mode="plugin"), 3, sync=False)
        t_memo = timed(lambda: [h.train_inputs(proc, device="cuda", mode="plugin") for _ in range(100)], 3) / 100
        m = h.manifest
        host = torch.empty(m.frames.shape, dtype=torch.uint8, pin_memory=True)
        t_read = timed(lambda: _read_into(h, host), 10, sync=False)
        t_h2d = timed(lambda: host.to("cuda", non_blocking=True), 10)
        on_gpu, kw = host.to("cuda"), processor_kwargs(proc, [m], "plugin")
        t_proc = timed(lambda: proc(videos=[on_gpu], **kw), 10)
        ratios.append(t_src / t_gpu)
        rows += [
            (f"{os.path.basename(path)} ({os.path.getsize(path) * 8 / 10e6:.1f} Mbit/s) -> "
             f"{m.num_frames}x{m.height}x{m.width}", ""),
            ("  qwen-vl-utils decode + HF processor, CPU", f"{t_src * 1e3:.1f} ms"),
            ("  train_inputs(device='cpu'), memo off", f"{t_cpu * 1e3:.1f} ms  ({t_src / t_cpu:.1f}x)"),
            ("  train_inputs(device='cuda'), first touch", f"{t_gpu * 1e3:.2f} ms  ({t_src / t_gpu:.0f}x)"),
            ("  ... of which: cache read into pinned memory", f"{t_read * 1e3:.2f} ms ({m.frames.nbytes / 1e6:.1f} MB)"),
            ("  ...           host-to-device copy", f"{t_h2d * 1e3:.2f} ms"),
            ("  ...           HF processor on the GPU", f"{t_proc * 1e3:.2f} ms"),
            ("  ... its first call in this process", f"{t_first_call * 1e3:.1f} ms"),
            ("  train_inputs(device='cuda'), memo hit", f"{t_memo * 1e6:.1f} us"),
        ]
    rows.append(("(g1) first touch on the GPU vs from source [>= 100x]",
                 f"{min(ratios):.0f}x .. {max(ratios):.0f}x (all {len(ratios)} clips bitwise equal)"))
    return rows


def micro_batch(clips: list[str], family: str, cache: VideoCache, n: int = 32) -> list[tuple[str, str]]:
    proc = build_processor(family)
    fps = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5]
    handles = [vidcache.get(clips[i % len(clips)], VideoOptions(family=family, fps=fps[(i // len(clips)) % len(fps)]),
                            cache) for i in range(n)]
    assert len({h.key for h in handles}) == n
    groups = [[h] for h in handles]
    frames_mb = sum(h.manifest.frames.nbytes for h in handles) / 1e6

    def cpu_processor():                        # HF's processor on the CPU, frames already read
        return [model_tensors(proc(text=[VIDEO_PLACEHOLDER], videos=[f], **processor_kwargs(proc, [h.manifest], "plugin")))
                for h, f in zip(handles, frames)]

    frames = [h.frames() for h in handles]
    want = cpu_processor()
    t_cpu_proc = timed(cpu_processor, 3, sync=False)
    t_cpu_all = timed(lambda: vidcache.train_inputs_batch(proc, groups, memo=False, device="cpu", mode="plugin"), 3, sync=False)
    outs = {}
    for batched in (True, False):
        got = vidcache.train_inputs_batch(proc, groups, memo=False, device="cuda", batched=batched, mode="plugin")
        assert all(torch.equal(g[k].cpu(), w[k]) for g, w in zip(got, want) for k in w)
        outs[batched] = timed(lambda b=batched: vidcache.train_inputs_batch(proc, groups, memo=False, device="cuda",
                                                                           batched=b, mode="plugin"), 5)
    t_seq = timed(lambda: [h.train_inputs(proc, memo=False, device="cuda", mode="plugin") for h in handles], 5)
    from vidcache.device import PINNED
    return [
        (f"{n} handles, {frames_mb:.0f} MB of uint8 frames, {family}", ""),
        ("HF processor on the CPU (frames already read)", f"{t_cpu_proc * 1e3:.1f} ms"),
        ("train_inputs_batch(device='cpu'), memo off", f"{t_cpu_all * 1e3:.1f} ms"),
        ("train_inputs_batch(device='cuda'), one processor call", f"{outs[True] * 1e3:.1f} ms  "
                                                                  f"({t_cpu_proc / outs[True]:.1f}x the CPU processor)"),
        ("train_inputs_batch(device='cuda'), one call per video", f"{outs[False] * 1e3:.1f} ms  "
                                                                  f"({t_cpu_proc / outs[False]:.1f}x)"),
        ("32 x train_inputs(device='cuda'), one by one", f"{t_seq * 1e3:.1f} ms"),
        ("(g2) batched / per-video processor calls on the GPU", f"{outs[False] / outs[True]:.2f}x faster batched"),
        ("pinned host memory held / GPU memo held", f"{PINNED.pinned_bytes / 1e6:.0f} MB / "
                                                    f"{MEMO.nbytes(f'cuda:{torch.cuda.current_device()}') / 1e6:.0f} MB"),
        ("all 32 outputs bitwise equal to the CPU's", "yes"),
    ]


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("train_inputs_gpu.py needs a CUDA device")
    import transformers
    from camera_clips import make
    work = tempfile.mkdtemp(prefix="vc-gpu-")
    clip_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(work, "clips")
    clips = make(clip_dir)
    print(f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{os.cpu_count()} CPUs, torch CPU threads {torch.get_num_threads()}")
    cache = VideoCache(os.path.join(work, "cache"))
    for family in ("qwen2_5_vl", "qwen3_vl", "qwen2_vl"):
        report(f"(g1) first touch, {family}", first_touch(clips, family, cache))
    report("(g2) micro-batch of 32", micro_batch(clips, "qwen2_5_vl", cache))
    cache.close()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
