"""Frame shapes shared by the parity tests."""

# (width, height): 4:3, 16:9, 21:9, 9:16, 1:1, then issue 10's QCIF, 2.35:1 and 720p.  The small ones are
# upscaled to qwen-vl-utils' min_pixels; 1280x720 is scaled down to its per-frame cap: both branches.
ASPECT_SHAPES = [(160, 120), (320, 180), (336, 144), (180, 320), (200, 200), (176, 144), (640, 272), (1280, 720)]
