"""M-RoPE position ids of a whole Qwen-VL sequence, by the rule of the component that computes them.

Equal inputs are not equal computation: the model's rotary positions are computed *from* the ids and the
grids, and the components do not agree on how.  After a video, the text resumes

  ``sglang``        at ``max(all positions so far) + 1``.  SGLang 0.5.23
                    (``srt/layers/rotary_embedding/mrope_rope_index.py``: ``st_idx = llm_pos_ids_list[-1].max() + 1``)
                    and 0.5.16;
  ``vllm``          at the same place: vLLM 0.32.0 / 0.34.0 (``model_executor/models/qwen2_5_vl.py``,
                    ``qwen2_vl.py``, ``qwen3_vl.py``: ``get_mrope_input_positions``, ``st_idx = ...max() + 1``), and
                    the original Qwen2.5-VL code (transformers PR #35569: "the max vision position_ids plus 1");
  ``transformers``  at ``start + max(H, W) // merge``: transformers 5.x's ``get_rope_index``
                    (``current_pos += max(grid_thw[1], grid_thw[2]) // spatial_merge_size``), 5.12.1 to 5.25.0.
                    5.12.1 also truncates Qwen2.5-VL's seconds per grid to an integer
                    (``tokens_per_second * int(second_per_grid)``: 2/24 s becomes 0, 1.001 s becomes 1); 5.19.0 and
                    later keep the fraction.  Which one runs is the trainer's transformers version.

The two resume points differ whenever a video's temporal extent reaches past its spatial one:
``(T - 1) * tokens_per_second * second_per_grid`` (Qwen2.5-VL) or ``T - 1`` (Qwen2-VL) at least
``max(H, W) // merge``.  Every later token then sits at another position in a trainer that runs transformers'
model than in the rollout.  Qwen3-VL and its successors are not affected: each frame group is its own item
with ``T = 1`` behind a timestamp, so both rules give the same resume point.  Images (``T = 1``) never differ.

The video's own positions are the same in every rule; only the arithmetic order of Qwen2.5-VL's temporal
scaling is written as each component writes it, so that a float rounding, should one ever differ, is the
component's own.  Pure: ids and grids in, positions out (no handles, no processor); ``vidcache.positions``
computes the grids from a sample's handles.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .engines import ENGINES
from .families import FAMILIES

# Each engine's rule (named as the engine: vidcache.engines), and transformers' own.
RULES = (*ENGINES, "transformers")

# transformers releases whose Qwen2.5-VL get_rope_index was run against this module (tests/test_positions.py),
# by how they treat the seconds per grid.  Any other release is unverified: ``transformers_seconds`` refuses it.
TRANSFORMERS_INT_SECONDS = ("5.12.1",)
TRANSFORMERS_FLOAT_SECONDS = ("5.19.0", "5.22.2", "5.24.0", "5.25.0")

# Which temporal index a video item gets is the family's temporal rule (``families.Family.temporal``, the engines'
# own dispatch): "scaled" (Qwen2.5-VL) puts frame group t at ``t * second_per_grid * tokens_per_second`` (floored),
# "index" (Qwen2-VL) at t, and "per_frame" (Qwen3-VL and successors) makes each frame group its own item of T = 1.



def _scaled(family: str) -> bool:
    fam = FAMILIES.get(family)
    return fam is not None and fam.scaled_time

@dataclass(frozen=True)
class Item:
    """One vision item in the sequence: ``start`` is the index of its first pad id."""
    modality: str            # "image" | "video"
    start: int
    grid: tuple[int, int, int]
    second_per_grid: "torch.Tensor | float | None" = None


def transformers_seconds(version: str) -> str:
    """``"int"`` or ``"float"``: how transformers ``version``'s Qwen2.5-VL rule takes the seconds per grid."""
    if version in TRANSFORMERS_INT_SECONDS:
        return "int"
    if version in TRANSFORMERS_FLOAT_SECONDS:
        return "float"
    raise ValueError(f"transformers {version}'s Qwen2.5-VL position rule is unverified (verified: "
                     f"{', '.join(TRANSFORMERS_INT_SECONDS + TRANSFORMERS_FLOAT_SECONDS)}); use an engine's rule "
                     f"(sglang, vllm), which is what the trainer should be given anyway")


def installed_transformers() -> str:
    import importlib.metadata
    return importlib.metadata.version("transformers")


def _check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    return rule


def _runs(ids: list[int], token: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of ``token`` in ``ids``."""
    out, i, n = [], 0, len(ids)
    while i < n:
        if ids[i] == token:
            j = i
            while j < n and ids[j] == token:
                j += 1
            out.append((i, j - i))
            i = j
        else:
            i += 1
    return out


def items(ids: list[int], *, family: str, merge: int, image_token_id: int, video_token_id: int,
          image_grid_thw=None, video_grid_thw=None, second_per_grid_ts=None) -> list[Item]:
    """The sequence's vision items in order, each matched with its grid (and Qwen2.5-VL's seconds per grid).

    A Qwen3-VL video's grid ``(T, H, W)`` is T items of ``(1, H, W)`` (each behind its own timestamp). Raises
    ``ValueError`` when the pad runs and the grids disagree: positions from a mismatched pair would be wrong
    silently."""
    if family not in FAMILIES:
        raise ValueError(f"no M-RoPE rule for family {family!r}; expected one of {sorted(FAMILIES)}")
    vgrids = [tuple(int(x) for x in g) for g in (video_grid_thw.tolist() if torch.is_tensor(video_grid_thw)
                                                 else (video_grid_thw or []))]
    igrids = [tuple(int(x) for x in g) for g in (image_grid_thw.tolist() if torch.is_tensor(image_grid_thw)
                                                 else (image_grid_thw or []))]
    spg = list(second_per_grid_ts) if second_per_grid_ts is not None else [None] * len(vgrids)
    if len(spg) != len(vgrids):
        raise ValueError(f"{len(vgrids)} video grids but {len(spg)} second_per_grid_ts values")
    videos: list[tuple[tuple[int, int, int], object]] = []
    for g, s in zip(vgrids, spg):
        if FAMILIES[family].per_frame:
            videos += [((1, g[1], g[2]), s)] * g[0]
        else:
            videos.append((g, s))
    found = sorted([("image", s, n) for s, n in _runs(ids, image_token_id)]
                   + [("video", s, n) for s, n in _runs(ids, video_token_id)], key=lambda r: r[1])
    out, it_i, it_v = [], iter(igrids), iter(videos)
    for modality, start, n in found:
        try:
            grid, s = (next(it_i), None) if modality == "image" else next(it_v)
        except StopIteration:
            raise ValueError(f"the ids hold more {modality} pad runs than {modality} grids were given") from None
        if min(grid) < 1 or grid[1] % merge or grid[2] % merge:
            raise ValueError(f"the {modality} grid {list(grid)} at index {start} is not a grid of this model: its "
                             f"height and width must be positive multiples of the merge size {merge}")
        want = grid[0] * grid[1] * grid[2] // (merge * merge)
        if n != want:
            raise ValueError(f"a {modality} pad run at index {start} has {n} ids, but its grid {list(grid)} "
                             f"makes {want}: ids and grids do not belong together")
        out.append(Item(modality, start, grid, s))
    if next(it_i, None) is not None or next(it_v, None) is not None:
        raise ValueError("more grids were given than the ids hold pad runs")
    return out


# A bound far above any checkpoint (2), so a unit mistake (ms for s) or an overflow is refused, not computed.
MAX_TOKENS_PER_SECOND = 1000


def _temporal(item: Item, family: str, rule: str, tokens_per_second, h: int, w: int,
              seconds: str = "float") -> torch.Tensor:
    """The temporal index of each of the item's tokens (before its start offset), as ``rule`` computes it."""
    t = item.grid[0]
    if item.modality == "image" or not FAMILIES[family].scaled_time:
        return torch.arange(t).view(-1, 1).expand(-1, h * w).flatten()
    s = 1.0 if item.second_per_grid is None else item.second_per_grid
    if rule == "transformers":       # (arange(T) * (tokens_per_second * s)).long(); 5.12.1: int(s)
        s = int(s) if seconds == "int" else s
        return (torch.arange(t) * (tokens_per_second * s)).long().view(-1, 1).expand(-1, h * w).flatten()
    if rule == "sglang":             # (arange(T) expanded * s * tokens_per_second).long()
        return (torch.arange(t).view(-1, 1).expand(-1, h * w) * s * tokens_per_second).long().flatten()
    # vllm: indices * t_factor in float64, t_factor = float(s) * tokens_per_second (Python floats)
    factor = (float(s.item()) if torch.is_tensor(s) else float(s)) * tokens_per_second
    idx = torch.arange(t, dtype=torch.float64) * factor if factor != 1.0 else torch.arange(t)
    return idx.long().view(-1, 1).expand(-1, h * w).flatten()


def positions(ids, *, rule: str, family: str, merge: int, image_token_id: int, video_token_id: int,
              tokens_per_second: float | None = None, image_grid_thw=None, video_grid_thw=None,
              second_per_grid_ts=None, transformers_version: str | None = None) -> torch.Tensor:
    """``[3, len(ids)]`` int64 M-RoPE position ids of one whole sequence (prompt, response, later turns), by
    ``rule`` (one of ``RULES``).  ``tokens_per_second``: the checkpoint's ``vision_config.tokens_per_second``
    (Qwen2.5-VL only).  ``transformers_version``: whose ``transformers`` rule (default: the installed one)."""
    _check_rule(rule)
    seconds = "float"
    if rule == "transformers" and _scaled(family):
        seconds = transformers_seconds(transformers_version or installed_transformers())
    if torch.is_tensor(ids) and ids.dim() != 1:
        raise ValueError(f"input_ids must be one sequence (1-D), got shape {tuple(ids.shape)}: positions are per "
                         "sequence; pass input_ids[i] for each row of a batch")
    ids = ids.tolist() if torch.is_tensor(ids) else list(ids)
    if ids and isinstance(ids[0], (list, tuple)):
        raise ValueError(f"input_ids must be one sequence (a flat list of ids), got a list of {len(ids)} lists")
    if _scaled(family):
        if tokens_per_second is None:
            raise ValueError("Qwen2.5-VL's positions need the checkpoint's vision_config.tokens_per_second")
        if isinstance(tokens_per_second, bool) or not isinstance(tokens_per_second, (int, float)) \
                or not math.isfinite(tokens_per_second) or not 0 < tokens_per_second <= MAX_TOKENS_PER_SECOND:
            raise ValueError(f"tokens_per_second must be a finite number in (0, {MAX_TOKENS_PER_SECOND}], got "
                             f"{tokens_per_second!r} (the checkpoint's vision_config.tokens_per_second: 2 in every "
                             "published Qwen2.5-VL)")
    parts, cursor, nxt = [], 0, 0          # nxt: the position the next text token gets
    for item in items(ids, family=family, merge=merge, image_token_id=image_token_id,
                      video_token_id=video_token_id, image_grid_thw=image_grid_thw,
                      video_grid_thw=video_grid_thw, second_per_grid_ts=second_per_grid_ts):
        text = item.start - cursor
        parts.append(torch.arange(text).view(1, -1).expand(3, -1) + nxt)
        start = nxt + text
        h, w = item.grid[1] // merge, item.grid[2] // merge
        tt = _temporal(item, family, rule, tokens_per_second, h, w, seconds)
        hh = torch.arange(h).view(1, -1, 1).expand(item.grid[0], -1, w).flatten()
        ww = torch.arange(w).view(1, 1, -1).expand(item.grid[0], h, -1).flatten()
        vision = torch.stack([tt, hh, ww]) + start
        parts.append(vision)
        cursor = item.start + vision.shape[1]
        # The one place the rules part: where the text after a vision item resumes.
        nxt = start + max(h, w) if rule == "transformers" else int(vision.max()) + 1
    parts.append(torch.arange(len(ids) - cursor).view(1, -1).expand(3, -1) + nxt)
    return torch.cat(parts, dim=1).to(torch.long)


def rules_differ(grid, *, family: str, merge: int = 2, tokens_per_second: float = 2,
                 second_per_grid: float = 1.0) -> bool:
    """Whether the ``transformers`` and engine rules resume the text at different positions after one video of
    ``grid`` (T, H, W): its temporal extent reaches past its spatial one."""
    t, h, w = (int(x) for x in grid)
    if FAMILIES[family].per_frame:
        return False
    last_t = int((t - 1) * second_per_grid * tokens_per_second) if FAMILIES[family].scaled_time else t - 1
    return last_t + 1 > max(h, w) // merge
