"""Token layouts: how a processor lays a video's ids out around its pads, named, and moved between names.

A *layout* is the id sequence a family's processor expands one video placeholder
(``<|vision_start|><|video_pad|><|vision_end|>`` in a chat-templated prompt) into.  The trainer and the server
must use the same one, and which one a processor produces depends on its transformers release, not on the model:

``plain``      Qwen2-VL, Qwen2.5-VL: ``<|vision_start|>`` pads ``<|vision_end|>`` (every release).
``collapsed``  Qwen3-VL, per temporal group ``<t seconds><|vision_start|>`` pads ``<|vision_end|>``, nothing around
               them: transformers 4.57 (Qwen3-VL's release) and 5.25+.  The model's own layout (docs/sglang.md,
               "Token layouts", has the evidence).
``wrapped``    Qwen3-VL, the same groups inside one more ``<|vision_start|>`` ... ``<|vision_end|>`` pair (the chat
               template's, kept): transformers 5.10 to 5.24, so SGLang 0.5.23 (pins 5.19.0) and vLLM 0.34 (< 5.23).

Which layout a processor produces is detected from the processor's own output on a probe
(``processing.layout_of``); the release table here only *implies* one where no processor can be probed (a
server's, from its SGLang release's pin).  Imports nothing (the facts floor): ``processing``, ``sglang/`` and the
CLI read these.
"""
from __future__ import annotations

import re

from .errors import TokenLayoutError
from .families import FAMILIES

# A family's token layouts, and the one of the model's own release, are its record's (``Family.layouts``,
# ``Family.model_layout``).  Qwen3-VL's: the model shipped with transformers 4.57.x's processor ("collapsed"); the
# default that plugin-mode requests carry, whatever transformers the trainer or the server happens to have.


def layouts(family: str) -> tuple[str, ...]:
    """``family``'s token layouts (empty: no such family)."""
    fam = FAMILIES.get(family)
    return fam.layouts if fam is not None else ()


# The environment variable that pins a project's request layout (plugin mode: the server converts to it; stock
# mode: the trainer follows a server it names).  Values: a layout name, or "family:layout,family:layout".
ENV_LAYOUT = "VIDCACHE_TOKEN_LAYOUT"

# transformers releases the layout, id and parity tests ran under (CI: the main venv and the overlays of
# scripts/setup_transformers.sh and scripts/setup_sglang_overlay.sh, whose SGLang 0.5.16 pins 5.12.1).  Another release still works (its layout is probed, never guessed), but
# ``prewarm`` and ``check-server`` say once that it is unverified.
VERIFIED_TRANSFORMERS = ("5.12.1", "5.19.0", "5.24.0", "5.25.0")
# What Qwen3-VL's processor produces by release, as read in each release's processing_qwen3_vl.py: only used to
# *imply* a server's layout from its pinned transformers (a processor on this node is probed instead).
_QWEN3_WRAPPED_RELEASES = ((5, 10), (5, 24))        # inclusive (major, minor) range
# The transformers each SGLang release pins (its own metadata): a server's transformers, where nothing reports it.
SGLANG_TRANSFORMERS_PIN = {"0.5.16": "5.12.1", "0.5.23": "5.19.0"}


def check_layout(family: str, layout: str) -> str:
    if family not in FAMILIES:
        raise TokenLayoutError(f"unknown family {family!r}; expected one of {sorted(FAMILIES)}")
    if layout not in FAMILIES[family].layouts:
        raise TokenLayoutError(f"{family} has no token layout {layout!r}; its layouts: {', '.join(FAMILIES[family].layouts)}")
    return layout


def env_layout(family: str, environ=None) -> str | None:
    """The layout ``$VIDCACHE_TOKEN_LAYOUT`` names for ``family`` (None: it names none for it)."""
    import os
    raw = (environ if environ is not None else os.environ).get(ENV_LAYOUT, "").strip()
    if not raw:
        return None
    found = None
    for part in raw.split(","):
        fam, sep, name = part.strip().rpartition(":")
        fam, name = fam.strip(), name.strip()
        if not sep:                      # a bare name applies to every family that has it
            if not any(name in v for v in (f.layouts for f in FAMILIES.values())):
                raise TokenLayoutError(f"${ENV_LAYOUT}={raw!r}: no family has a token layout {name!r}")
            pick = name if name in layouts(family) else None
        elif fam not in FAMILIES:         # a misspelt family would drop the pin silently (D54)
            raise TokenLayoutError(f"${ENV_LAYOUT}={raw!r}: unknown family {fam!r}; families: {sorted(FAMILIES)}")
        else:
            pick = check_layout(family, name) if fam == family else None
        if pick is not None and found is not None and pick != found:
            raise TokenLayoutError(f"${ENV_LAYOUT}={raw!r} pins {family} to both {found!r} and {pick!r}")
        found = found or pick
    return found


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


def implied_layout(family: str, transformers_version: str | None) -> str | None:
    """The layout ``family``'s processor of this transformers release produces, by the release table (None: not
    known).  Only for a side that cannot be probed; ``processing.layout_of`` probes a processor."""
    if transformers_version is None or family not in FAMILIES:
        return None
    if len(FAMILIES[family].layouts) == 1:
        return FAMILIES[family].layouts[0]
    v = _version_tuple(transformers_version)[:2]
    lo, hi = _QWEN3_WRAPPED_RELEASES
    if lo <= v <= hi:
        return "wrapped"
    if v >= (4, 57):
        return "collapsed"
    return None


def server_transformers(info: dict) -> tuple[str | None, str]:
    """A server's transformers release and how it is known: ``reported`` (its ``/server_info`` says), ``implied by
    SGLang X's pin``, or ``unknown``."""
    reported = info.get("transformers_version")
    if reported:
        return str(reported), "reported"
    pin = SGLANG_TRANSFORMERS_PIN.get(str(info.get("version")))
    if pin:
        return pin, f"implied by SGLang {info.get('version')}'s pin"
    return None, "unknown"


def unverified_warning(family: str, version: str | None) -> str | None:
    """One line for a transformers release the layout tests did not run, for a family whose layout moved between
    releases (None: verified, or a family with one layout).  ``prewarm`` and ``check-server`` print it."""
    if len(layouts(family)) < 2 or version in VERIFIED_TRANSFORMERS:
        return None
    return (f"transformers {version} is unverified for {family}'s token layout (verified: "
            f"{', '.join(VERIFIED_TRANSFORMERS)}); its layout is probed from the processor, never guessed, and "
            "`vidcache check-server` compares it with the server's")


def _find(ids: list[int], sub: list[int], start: int) -> int:
    first, n = sub[0], len(sub)
    i = start
    while True:
        try:
            i = ids.index(first, i)
        except ValueError:
            return -1
        if ids[i:i + n] == sub:
            return i
        i += 1


def convert(ids, reps: list[list[int]], src: str, dst: str, vision_start: int, vision_end: int) -> list[int]:
    """``ids`` (a whole prompt's expansion in layout ``src``) in layout ``dst``.

    ``reps``: each video's per-group block, in order, as the processor's own ``replace_video_token`` text
    tokenized alone (``<t seconds><|vision_start|>`` pads ``<|vision_end|>`` per group).  ``wrapped`` is each
    block with one ``vision_start``/``vision_end`` pair around it, ``collapsed`` the block alone; nothing else moves.
    A block that is not where ``src`` puts it raises ``TokenLayoutError`` (never a guess).
    """
    ids = list(ids)
    if src == dst:
        return ids
    if {src, dst} != {"collapsed", "wrapped"}:
        raise TokenLayoutError(f"no conversion from token layout {src!r} to {dst!r}")
    out: list[int] = []
    i = 0
    for n, rep in enumerate(reps):
        j = _find(ids, rep, i) if rep else -1
        if j < 0:
            raise TokenLayoutError(f"video {n}'s block of {len(rep)} ids is not in the prompt's ids (a tokenizer that "
                              "merges the text before a video into its timestamp?): cannot move it between layouts")
        end = j + len(rep)
        if src == "wrapped":
            if j == 0 or ids[j - 1] != vision_start or end >= len(ids) or ids[end] != vision_end:
                raise TokenLayoutError(f"video {n}'s block is not wrapped in <|vision_start|>...<|vision_end|>: these ids "
                                  "are not in the 'wrapped' layout")
            out += ids[i:j - 1] + rep
            i = end + 1
        else:
            if j > 0 and ids[j - 1] == vision_start and end < len(ids) and ids[end] == vision_end:
                raise TokenLayoutError(f"video {n}'s block is already wrapped: these ids are not in the 'collapsed' layout")
            out += ids[i:j] + [vision_start] + rep + [vision_end]
            i = end
    return out + ids[i:]


def layout_difference(expected, got) -> str | None:
    """Why two prompts' ids differ, when it is a token layout: one is the other with pairs of two tokens added
    (the wrapper pair around each video).  None: they differ otherwise (or not at all)."""
    expected, got = list(expected), list(got)
    if expected == got or not (len(expected) - len(got)) or (len(expected) - len(got)) % 2:
        return None
    longer, shorter = (expected, got) if len(expected) > len(got) else (got, expected)
    extra: list[int] = []
    j = 0
    for t in longer:                          # greedy subsequence match: the extras are what the longer adds
        if j < len(shorter) and t == shorter[j]:
            j += 1
        else:
            extra.append(t)
    if j != len(shorter) or len(set(extra)) != 2:
        return None
    a, b = sorted(set(extra), key=extra.index)
    if extra.count(a) != extra.count(b):
        return None
    who = "the trainer's" if longer is expected else "the server's"
    return (f"token layout: {who} ids carry {extra.count(a)} extra pair(s) of ids {a}/{b} (an outer "
            "<|vision_start|>...<|vision_end|> around each video: the 'wrapped' Qwen3-VL layout of transformers "
            "5.10-5.24, against the 'collapsed' one of 4.57 and 5.25+)")
