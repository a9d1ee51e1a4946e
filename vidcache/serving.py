"""What vidcache serves, whatever the engine: the frozen files' rate and format, and a presigned URL's lifetime.

Imports nothing of vidcache (the facts floor): the frozen-file writer, the compact shared tier, the trainer side
(``processing``: ``FROZEN_FPS``) and both engines' adapters read these.  SGLang's own facts (its releases, modes,
resize grid, pixel bounds, ``vidcache serve``'s limits) are ``vidcache.sglang_facts``'.
"""
from __future__ import annotations

from fractions import Fraction

# Frozen files are stamped at this rate, and SGLang's fps sampler is configured with it (stock mode):
# then SGLang's sampler selects every stored frame once, and in stock mode Qwen3-VL's timestamps come
# from this timeline, so the trainer reproduces it.
FROZEN_FPS = Fraction(2)
# The frozen format stock SGLang is sent: MagicYUV decodes 10-40x faster than FFV1 (benchmarks/formats.py,
# benchmarks/shared_formats.py), and SGLang decodes the file on every request; both are bit-exact.  It replaced
# UT Video (0.324x raw, 360 MB/s to expand on 2 cores): MagicYUV with gradient prediction is 0.291x and
# 530 MB/s on the same clips, and torchcodec decodes it 1.6x faster.  UT Video .nut files stay readable.
SERVING_FORMAT = "magicyuv"
# The shared tier's one object per entry (``VideoCache``, shared_layout "compact"): the same file, so a
# stock-mode cluster stores each entry once.  FFV1 is smaller on some footage but decodes at 12-25 MB/s,
# slower than the sources: a node's first read would cost more than a decode from the source.
COMPACT_FORMAT = SERVING_FORMAT

# How long a presigned shared-tier URL handed to an engine (stock SGLang's frozen files) stays valid, by default.
URL_EXPIRY_S = 7 * 24 * 3600
