"""The manifest: what a cache key resolves to (Bazel's ActionResult).  Plain JSON, never pickle."""
from __future__ import annotations

import functools
import json
import platform
from importlib import metadata as md

import torch

from .options import MERGE_SIZE, TEMPORAL_PATCH_SIZE, VideoOptions

SCHEMA = 1


@functools.lru_cache(maxsize=1)
def _versions() -> dict:
    out = {"python": platform.python_version()}
    for name in ("torch", "torchvision", "qwen-vl-utils", "decord", "av", "vidcache"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = None
    out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    return out


def versions() -> dict:
    """Library versions and CPU capability: provenance, recorded but never part of a key."""
    return dict(_versions())


def grid_thw(options: VideoOptions, num_frames: int, height: int, width: int) -> list[int]:
    p = options.patch_size
    return [-(-num_frames // TEMPORAL_PATCH_SIZE), height // p, width // p]


def build_manifest(key: str, source_digest: str, options: VideoOptions, blob: str, shape: list[int],
                   encoding: str, built: dict) -> dict:
    video = built["video"]
    t, h, w = grid_thw(options, video["num_frames"], video["height"], video["width"])
    return {
        "schema": SCHEMA,
        "key": key,
        "source_digest": source_digest,
        "options": options.resolved().to_dict(),
        "options_digest": options.digest,
        "frames": {"blob": blob, "shape": shape, "dtype": "uint8", "layout": "TCHW", "encoding": encoding},
        "video": video,
        "tokens": {"video_grid_thw": [t, h, w], "video_pad_tokens": t * h * w // (MERGE_SIZE * MERGE_SIZE)},
        # Recorded, not keyed: the cached bytes are the truth, recomputation elsewhere may differ.
        "provenance": {**built["provenance"], **versions()},
    }


def dumps(manifest: dict) -> bytes:
    return json.dumps(manifest, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def loads(raw: bytes) -> dict:
    m = json.loads(raw)
    if not isinstance(m, dict) or m.get("schema") != SCHEMA:
        raise ValueError(f"unsupported manifest schema {m.get('schema') if isinstance(m, dict) else m!r}")
    return m
