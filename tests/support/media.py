"""The test clips and frame shapes the suite and the benchmarks share (a module, not conftest: two conftest.py
files share the name ``conftest``, so ``from conftest import ...`` gets whichever pytest loaded last)."""
from fractions import Fraction

# name -> (codec, width, height, fps, n_frames)
VIDEOS = {
    "h264_30": ("h264", 320, 240, 30, 120),
    "h264_ntsc": ("h264", 320, 240, Fraction(30000, 1001), 150),
    "mpeg4_25_odd": ("mpeg4", 426, 238, 25, 75),
    "mjpeg_24": ("mjpeg", 250, 170, 24, 48),
    "hevc_25": ("hevc", 352, 288, 25, 50),
    "ffv1_10_small": ("ffv1", 96, 64, 10, 30),
    "h264_long": ("h264", 64, 48, 10, 1600),     # 160 s: hits the 768... cap only with fps; see tests
}


# (width, height): 4:3, 16:9, 21:9, 9:16, 1:1, then issue 10's QCIF, 2.35:1 and 720p.  The small ones are
# upscaled to qwen-vl-utils' min_pixels; 1280x720 is scaled down to its per-frame cap: both branches.
ASPECT_SHAPES = [(160, 120), (320, 180), (336, 144), (180, 320), (200, 200), (176, 144), (640, 272), (1280, 720)]
