"""Attestation: a per-video digest of the tensors the trainer uses, checked by the plugin inside SGLang.

Both sides call :func:`attest` on the same kind of dict (``processing.model_tensors`` of an HF
processor output): ``prepare(..., mode="plugin")`` on the trainer's tensors, and the plugin on its own
processor output after the HF call.  A video's record holds its ``video_grid_thw`` row, its
``second_per_grid_ts`` (where the family has one) as the float32 value the trainer uses, and an xxh3-128
digest of its ``pixel_values_videos`` rows (split by the grid: ``t * h * w`` rows per video), over dtype,
shape and bytes.  Equal records mean bit-identical tensors, which is what "the pixels the policy saw are
the pixels the trainer uses" needs; :func:`compare` names the field that differs.

A video served from precomputed embeddings (``vidcache.rollout.embeddings``) adds ``embeddings``: the digest of the
rows the decoder gets in place of the tower's output, so the server proves it scatters the trainer's rows.

A record may also carry the rows themselves (``values``: base64 float32, small videos only): the
handshake's canary does, so that a mismatch reports the largest difference, not only a digest.

Imports only torch and xxhash: the trainer side and the plugin both sit above it.
"""
from __future__ import annotations

import base64

import torch
import xxhash

FIELDS = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")
VALUES_MAX_BYTES = 1 << 17     # the canary's rows travel in full only below this (the reference stays small)


def tensor_digest(t: torch.Tensor) -> str:
    """xxh3-128 over dtype, shape and the raw bytes (CPU, contiguous)."""
    t = t.detach().to("cpu").contiguous()
    h = xxhash.xxh3_128()
    h.update(f"{t.dtype}:{tuple(t.shape)}:".encode())
    h.update(t.view(torch.uint8).numpy() if t.numel() else b"")
    return h.hexdigest()


def attest(tensors: dict, values: bool = False) -> list[dict]:
    """One record per video of ``tensors`` (``pixel_values_videos``, ``video_grid_thw`` and, where present,
    ``second_per_grid_ts``), in order.  ``values``: also carry the rows, for videos under
    ``VALUES_MAX_BYTES``."""
    grid = torch.as_tensor(tensors["video_grid_thw"]).to(torch.int64).reshape(-1, 3)
    pv = tensors["pixel_values_videos"]
    rows = [int(r) for r in grid.prod(-1)]
    if sum(rows) != pv.shape[0]:
        raise ValueError(f"pixel_values_videos has {pv.shape[0]} rows, the grid {grid.tolist()} says {sum(rows)}")
    spg = tensors.get("second_per_grid_ts")
    spg = None if spg is None else torch.as_tensor(spg, dtype=torch.float32).reshape(-1)
    out = []
    for i, chunk in enumerate(torch.split(pv, rows)):
        rec = {"video_grid_thw": grid[i].tolist(), "pixel_values_videos": tensor_digest(chunk)}
        if spg is not None:
            rec["second_per_grid_ts"] = float(spg[i])        # exact: a float32 is exact as a float64
        if values and chunk.numel() * 4 <= VALUES_MAX_BYTES:
            rec["values"] = base64.b64encode(chunk.detach().to("cpu", torch.float32).contiguous().numpy()
                                             .tobytes()).decode()
        out.append(rec)
    return out


def compare(expected: dict, got: dict, rows: torch.Tensor | None = None) -> list[str]:
    """What differs between the trainer's record ``expected`` and the server's ``got`` (empty: equal).

    ``rows``: the server's ``pixel_values_videos`` rows for this video; with ``expected["values"]`` the
    message gives the largest difference."""
    out = []
    if expected["video_grid_thw"] != got["video_grid_thw"]:
        out.append(f"video_grid_thw differs: server {got['video_grid_thw']}, trainer {expected['video_grid_thw']}")
    e, g = expected.get("second_per_grid_ts"), got.get("second_per_grid_ts")
    if e != g:
        diff = f" (difference {abs(e - g):.6g})" if e is not None and g is not None else ""
        out.append(f"second_per_grid_ts differs: server {g}, trainer {e}{diff}")
    if expected["pixel_values_videos"] != got["pixel_values_videos"]:
        msg = "pixel_values_videos differs (digest)"
        if rows is not None and expected.get("values"):
            want = torch.frombuffer(bytearray(base64.b64decode(expected["values"])), dtype=torch.float32)
            have = rows.detach().to("cpu", torch.float32).reshape(-1)
            if want.numel() == have.numel():
                d = (have - want).abs()
                msg += f": max difference {float(d.max()):.6g} in {int((d > 0).sum())} of {d.numel()} values"
        out.append(msg)
    if expected.get("embeddings") is not None and expected["embeddings"] != got.get("embeddings"):
        out.append("embeddings differ (digest): the server's record is not the trainer's")
    return out


def check_record(rec) -> dict:
    """A record from a request, checked for shape and types before anything compares it (never trusted)."""
    allowed = (*FIELDS, "values", "position", "embeddings")
    if not isinstance(rec, dict) or set(rec) - set(allowed):
        raise ValueError("attestation must be an object with the keys " + ", ".join(allowed))
    pos = rec.get("position")
    if pos is not None and not (isinstance(pos, list) and len(pos) == 2 and all(type(x) is int for x in pos)
                                and 0 <= pos[0] < pos[1] < 1 << 16):
        raise ValueError("attestation position must be [index, count] with 0 <= index < count")
    grid = rec.get("video_grid_thw")
    if not (isinstance(grid, list) and len(grid) == 3 and all(type(x) is int and 0 < x < 1 << 20 for x in grid)):
        raise ValueError("attestation video_grid_thw must be 3 positive integers")
    for name in ("pixel_values_videos", "embeddings"):
        digest = rec.get(name)
        if digest is None and name == "embeddings":
            continue
        if not (isinstance(digest, str) and len(digest) == 32 and all(c in "0123456789abcdef" for c in digest)):
            raise ValueError(f"attestation {name} must be a 32-digit hex digest")
    spg = rec.get("second_per_grid_ts")
    if spg is not None and type(spg) not in (int, float):
        raise ValueError("attestation second_per_grid_ts must be a number")
    values = rec.get("values")
    if values is not None and not (isinstance(values, str) and len(values) <= VALUES_MAX_BYTES * 4 // 3 + 4):
        raise ValueError("attestation values must be base64 of at most "
                         f"{VALUES_MAX_BYTES} bytes")
    return rec
