"""Which SGLang is installed here, and which of its processor modules could serve Qwen-VL.

Read from the distribution's metadata and file list: nothing of SGLang is imported (``sglang-config``
runs on rollout nodes, where importing SGLang is slow or impossible).  The plugin, which runs inside
SGLang, finds the processor *classes* itself (``plugin/qwen_vl.py``).
"""
from __future__ import annotations

import importlib.metadata as md
import re

PROCESSORS_DIR = "sglang/srt/multimodal/processors/"
# qwen_vl.py today; a separate Qwen3-VL module (sgl-project/sglang#36109) would match too.
_QWEN_VL_MODULE = re.compile(r"qwen\d*(_\d+)?_?vl[a-z0-9_]*\.py")


def installed_sglang() -> str | None:
    try:
        return md.version("sglang")
    except md.PackageNotFoundError:
        return None


def installed_transformers() -> str | None:
    try:
        return md.version("transformers")
    except md.PackageNotFoundError:
        return None


def qwen_vl_processor_modules() -> list[str]:
    """Dotted names of SGLang's processor modules whose name says Qwen-VL (``...processors.qwen_vl``)."""
    try:
        files = md.files("sglang") or []
    except md.PackageNotFoundError:
        return []
    out = []
    for f in files:
        p = str(f).replace("\\", "/")
        if p.startswith(PROCESSORS_DIR) and _QWEN_VL_MODULE.fullmatch(p[len(PROCESSORS_DIR):]):
            out.append(p[:-3].replace("/", "."))
    return sorted(out)
