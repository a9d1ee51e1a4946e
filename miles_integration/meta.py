"""Handles in ``sample.metadata["vidcache"]``: plain, JSON-able, ``==``-comparable dicts (no Miles import).

Layout::

    sample.metadata["vidcache"] = {
        "videos": [VideoHandle.to_dict(), ...],            # set by the data source, in prompt order
        "request": {"compact_ids": [...], "prompt_len": N,  # set by the generate function on the first turn,
                    "video_data": [...], "mode": "stock"},  # reused on partial-rollout resume and later turns
    }

Plain dicts survive ``deepcopy``, pickling, Ray, ``Sample.to_dict`` dumps and ``merge_samples``' equality checks.
"""
from __future__ import annotations

from vidcache import VideoHandle

KEY = "vidcache"


def metadata_entry(handles) -> dict:
    return {"videos": [h.to_dict() if isinstance(h, VideoHandle) else dict(h) for h in handles]}


def handles_from_metadata(metadata: dict | None) -> list[VideoHandle]:
    entry = (metadata or {}).get(KEY) or {}
    return [VideoHandle.from_dict(d) for d in entry.get("videos") or []]


def has_video(metadata: dict | None) -> bool:
    return bool(((metadata or {}).get(KEY) or {}).get("videos"))


def request_state(metadata: dict | None) -> dict | None:
    return ((metadata or {}).get(KEY) or {}).get("request")


def set_request_state(metadata: dict, prepared) -> dict:
    state = {"compact_ids": list(prepared.compact_ids), "prompt_len": len(prepared.expanded_ids),
             "video_data": list(prepared.video_data), "mode": prepared.mode}
    metadata.setdefault(KEY, {})["request"] = state
    return state
