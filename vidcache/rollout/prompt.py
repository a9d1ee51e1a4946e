"""A prompt with one model placeholder per video (and per image): what every engine's request builder tokenises
(``vidcache.sglang.request.prepare``, ``vidcache.vllm.request.prepare_vllm``).

A dataset row writes ``<video>`` / ``<image>`` markers (``vidcache prewarm`` datasets, Miles rows); a chat-templated
prompt already holds the model's own placeholders.  Either way each item gets one, in order, or the prompt is refused.
"""
from __future__ import annotations

from ..processing import VIDEO_PLACEHOLDER


def _one_placeholder_each(prompt: str, n: int, placeholder: str, marker: str, what: str, fix: str) -> str:
    """``prompt`` with one ``placeholder`` per item: a dataset row's own ``marker``s (``<video>`` / ``<image>``, as
    Miles rows write them) are replaced in order; a chat-templated prompt that already holds the placeholders is
    returned as it is."""
    have, marked = prompt.count(placeholder), prompt.count(marker)
    if have == n and (marked == 0 or have > 0):
        return prompt
    if have == 0 and marked == n:
        return prompt.replace(marker, placeholder)
    raise ValueError(f"prompt has {have} {placeholder!r} and {marked} {marker!r} placeholder(s) but {n} {what}(s) "
                     f"were given: {fix}")


def video_prompt(prompt: str, n_videos: int) -> str:
    """``prompt`` with one ``VIDEO_PLACEHOLDER`` per video (``vidcache prewarm`` datasets' ``<video>`` too)."""
    from ..dataset import VIDEO_TOKEN
    return _one_placeholder_each(prompt, n_videos, VIDEO_PLACEHOLDER, VIDEO_TOKEN, "video",
                                 "put one of either per video, in order")


IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


def image_prompt(prompt: str, n_images: int) -> str:
    """``prompt`` with one ``IMAGE_PLACEHOLDER`` per image (a Miles row's ``<image>`` markers too)."""
    from ..dataset import IMAGE_TOKEN
    return _one_placeholder_each(prompt, n_images, IMAGE_PLACEHOLDER, IMAGE_TOKEN, "image",
                                 "pass the row's images as images=[...], one per placeholder, in order")
