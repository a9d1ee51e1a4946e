"""Synthetic test videos written with PyAV: deterministic content, any codec/size/rate/length."""
from __future__ import annotations

from fractions import Fraction

import numpy as np

# codec -> (container suffix, pix_fmt)
CODECS = {
    "h264": (".mp4", "yuv420p"),
    "mpeg4": (".mp4", "yuv420p"),
    "mjpeg": (".avi", "yuvj420p"),
    "hevc": (".mkv", "yuv420p"),
    "av1": (".mkv", "yuv420p"),      # libsvtav1: decord's FFmpeg 4.1 cannot; the PyAV fallback does
    "ffv1": (".mkv", "bgr0"),
}
_ENCODER = {"h264": "libx264", "hevc": "libx265", "av1": "libsvtav1"}


def frames(n: int, width: int, height: int, seed: int = 0) -> np.ndarray:
    """n x H x W x 3 uint8: a moving gradient, a moving square and mild noise (not too compressible)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    out = np.empty((n, height, width, 3), np.uint8)
    for t in range(n):
        r = (x / max(width, 1) * 255 + 3 * t) % 256
        g = (y / max(height, 1) * 255 + 5 * t) % 256
        b = (np.sin((x + y + 4 * t) / 9.0) * 100 + 128)
        img = np.stack([r, g, b], -1)
        s = max(4, min(width, height) // 5)
        cx, cy = (7 * t) % max(width - s, 1), (3 * t) % max(height - s, 1)
        img[cy:cy + s, cx:cx + s] = (250, 30, 30)
        img += rng.normal(0, 6, img.shape)
        out[t] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def make_video(path: str, *, codec: str = "h264", width: int = 320, height: int = 240,
               fps: Fraction | float = 30, n_frames: int = 60, seed: int = 0) -> str:
    import os

    from ..encode import write_video

    os.environ.setdefault("SVT_LOG", "1")   # SVT-AV1 prints its banner to stdout otherwise
    _, pix_fmt = CODECS[codec]
    rate = Fraction(fps).limit_denominator(1001) if not isinstance(fps, Fraction) else fps
    options = {"h264": {"preset": "veryfast", "crf": "23"},
               "hevc": {"preset": "ultrafast", "x265-params": "log-level=error"},
               "av1": {"preset": "12"}}.get(codec)
    write_video(path, frames(n_frames, width, height, seed), codec=_ENCODER.get(codec, codec), rate=rate,
                pix_fmt=pix_fmt, options=options)
    return path


def suffix_for(codec: str) -> str:
    return CODECS[codec][0]


# --- clips made by the ffmpeg CLI (codecs and container features PyAV's encoders do not cover) ------------

def ffmpeg_encoders() -> frozenset[str]:
    """Encoder names of the ``ffmpeg`` on PATH (empty when there is none)."""
    import shutil
    import subprocess

    if not shutil.which("ffmpeg"):
        return frozenset()
    out = subprocess.run(["ffmpeg", "-hide_banner", "-encoders"], capture_output=True, text=True, check=True).stdout
    # Lines look like " V....D libx264   libx264 H.264 ...": flags, then the name.
    return frozenset(p[1] for p in (ln.split() for ln in out.splitlines()) if len(p) > 1 and p[0][:1] in "VAS")


def ffmpeg_clip(path: str, args: list[str], *, width: int = 160, height: int = 120, fps: int = 25,
                n_frames: int = 16, vf: str | None = None, two_pass: bool = False) -> str:
    """``ffmpeg -f lavfi testsrc2 ... ARGS path``: a moving test pattern, deterministic for a given ffmpeg."""
    import os
    import subprocess

    src = f"testsrc2=size={width}x{height}:rate={fps}" + (f",{vf}" if vf else "")
    head = ["ffmpeg", "-y", "-v", "error", "-f", "lavfi", "-i", src, "-frames:v", str(n_frames)]
    env = {**os.environ, "SVT_LOG": "1"}          # keep SVT-AV1's banner out of the test output
    if two_pass:
        log = path + ".pass"
        subprocess.run(head + args + ["-pass", "1", "-passlogfile", log, "-f", "null", os.devnull],
                       check=True, env=env)
        args = args + ["-pass", "2", "-passlogfile", log]
    subprocess.run(head + args + [path], check=True, env=env)
    return path


def ffmpeg_remux(src: str, path: str, args: list[str], inputs: tuple[str, ...] = ()) -> str:
    """Stream-copy ``src`` (plus ``inputs``) into ``path`` with extra ARGS: metadata, extra streams."""
    import subprocess

    cmd = ["ffmpeg", "-y", "-v", "error", "-i", src]
    for extra in inputs:
        cmd += ["-i", extra]
    subprocess.run(cmd + args + [path], check=True)
    return path
