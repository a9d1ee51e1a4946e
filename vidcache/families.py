"""What a model family is, and the model types vidcache serves: one record each, the one home of these facts.

A *family* (``qwen2_vl``, ``qwen2_5_vl``, ``qwen3_vl``) is a way of processing video: the vision geometry (patch,
merge and temporal patch size), the M-RoPE temporal rule, the token layouts its processors have produced, and the
transformers classes that compute it.  It is a :class:`Family` record in ``FAMILIES``; code asks it for *traits*
(``fam.per_frame``, ``fam.scaled_time``, ``fam.grid``) rather than testing its name, so adding a family is adding a
record here (and to the engine tables that ``tests/test_families.py`` names), not editing every module that reads
one.  Engine-specific facts about a family stay with their engine (``sglang_facts``, ``vllm/config``), and that
test asserts each of their tables covers every family, so a family cannot be half-added.

A *model type* (a checkpoint's ``config.json`` ``model_type``) is a :class:`ModelType` record in ``MODEL_TYPES``
pointing at its family.  Frames cached for one family serve every model type of that family: a Qwen3.5 model
(``qwen3_5``) reads the entries a Qwen3-VL prewarm wrote, because its processor *is* Qwen3-VL's (transformers
5.19-5.25 map ``qwen3_5``, ``qwen3_5_moe`` and ``qwen4_exp`` to ``Qwen3VLProcessor`` + ``Qwen3VLVideoProcessor``;
their vision configs have patch 16, merge 2, temporal 2).

``derive(checkpoint_dir)`` reads the checkpoint's ``config.json`` (model type, architectures, vision config) and
its processor files (processor and video processor classes, the video processor's geometry) and answers with a
``Derived`` family, checked against ``MODEL_TYPES``:

* a known model type whose processing is the table's: its family, verified;
* a known model type whose processing differs (another processor class, another patch size): refused
  (``ModelTypeError``), naming the difference;
* an unknown model type whose processor classes and geometry are a family's: that family, **unverified**; the
  caller refuses it unless the operator names the family (``--family``), and says so when it runs;
* anything else: refused, naming what matches no family.

On the facts floor (every floor asks it): it imports only ``errors`` (transformers only inside ``derive``, and only
where a checkpoint leaves a class default unstated).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import ModelTypeError


@dataclass(frozen=True)
class Family:
    """One way of processing video, and the traits the rest of vidcache asks of it."""
    name: str
    patch: int                            # the vision tower's patch side (pixels)
    merge: int                            # spatial merge: merge x merge patches become one LLM token
    temporal_patch: int                   # frames per temporal patch
    # The M-RoPE temporal rule of the model's own release (what engines compute):
    #   "index":     a temporal patch's position is its index (Qwen2-VL);
    #   "scaled":    index x seconds per grid x tokens_per_second (Qwen2.5-VL);
    #   "per_frame": each temporal patch is an item of its own, with its timestamp in the text (Qwen3-VL line).
    temporal: str
    layouts: tuple[str, ...]              # the token layouts its processors have produced (vidcache.token_layout)
    model_layout: str                     # the layout of the model's own release: plugin requests' default
    # The transformers module and class whose ``get_rope_index`` differs from the engines' rule (vidcache patches
    # it for a trainer, vidcache.positions); None: transformers' rule is the engines'.
    trainer_rope: tuple[str, str] | None = None

    @property
    def grid(self) -> int:
        """A frame side's multiple: one merged token is ``grid`` x ``grid`` pixels (28, or 32 for Qwen3-VL)."""
        return self.patch * self.merge

    @property
    def per_frame(self) -> bool:
        """Videos are one item per temporal patch, with timestamps in the text (frozen files carry metadata)."""
        return self.temporal == "per_frame"

    @property
    def scaled_time(self) -> bool:
        """Positions scale with seconds per grid (``second_per_grid_ts`` is a train input)."""
        return self.temporal == "scaled"


_TEMPORAL_RULES = ("index", "scaled", "per_frame")

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("qwen2_vl", 14, 2, 2, "index", ("plain",), "plain",
           ("transformers.models.qwen2_vl.modeling_qwen2_vl", "Qwen2VLModel")),
    Family("qwen2_5_vl", 14, 2, 2, "scaled", ("plain",), "plain",
           ("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "Qwen2_5_VLModel")),
    # Qwen3-VL: transformers 4.57's processor wrote "collapsed", 5.x's "wrapped"; the model shipped with 4.57.
    Family("qwen3_vl", 16, 2, 2, "per_frame", ("collapsed", "wrapped"), "collapsed"),
)}


def unknown_family(name: object) -> str:
    """The one message for a name that is no family (a model type's name gets its family as a hint)."""
    shown = repr(name)[:80]
    hint = (f" ({name} is a model type: its family is {MODEL_TYPES[name].family})"
            if isinstance(name, str) and name in MODEL_TYPES else "")
    return f"unknown family {shown}; expected one of {', '.join(FAMILIES)}{hint}"


@dataclass(frozen=True)
class ModelType:
    """One model type (a checkpoint's ``config.json`` ``model_type``) and the facts vidcache relies on."""
    name: str
    family: str
    architectures: tuple[str, ...]        # config.json "architectures" (SGLang and vLLM pick their class by it)
    processor: str                        # transformers' AutoProcessor class for this model type
    video_processor: str                  # transformers' AutoVideoProcessor class
    # vision_start, vision_end, image_pad, video_pad: transformers' <Model>Config defaults (the published
    # checkpoints' config.json carry the same), and the text config's default vocab_size.
    token_ids: tuple[int, int, int, int]
    vocab_size: int
    # Releases the parity / layout tests ran this model type under (a release not listed is "unverified").
    verified_transformers: tuple[str, ...]
    engines: dict = field(default_factory=dict)   # engine -> the releases whose own processor code was run
    # transformers' config and model classes (the trainer's: its get_rope_index is checked by vidcache.positions).
    trainer_classes: tuple[str, str] = ("", "")

    @property
    def fam(self) -> Family:
        return FAMILIES[self.family]

    @property
    def geometry(self) -> tuple[int, int, int]:
        """(patch_size, spatial merge_size, temporal_patch_size): its family's."""
        f = self.fam
        return (f.patch, f.merge, f.temporal_patch)


_QWEN2_IDS = (151652, 151653, 151655, 151656)
# Qwen3.5 / 3.6 / 3.8: transformers 5.24's Qwen3_5Config, Qwen3_5MoeConfig and Qwen4ExpConfig defaults
# (configuration_qwen3_5.py:179-182 and the same lines of the other two), equal to the published Qwen3.5
# config.json: 96,401 above Qwen3-VL's; text vocab_size 248320 (Qwen3_5TextConfig and its siblings).
_QWEN3_5_IDS = (248053, 248054, 248056, 248057)
_Q3_ENGINES = {"SGLang": ("0.5.16", "0.5.23"), "vLLM": ("0.34.0",)}
_TRANSFORMERS = ("5.12.1", "5.19.0", "5.24.0", "5.25.0")   # verified_transformers: each model type 5.12.1 already had

MODEL_TYPES: dict[str, ModelType] = {m.name: m for m in (
    ModelType("qwen2_vl", "qwen2_vl", ("Qwen2VLForConditionalGeneration",), "Qwen2VLProcessor",
              "Qwen2VLVideoProcessor", _QWEN2_IDS, 152064,
              _TRANSFORMERS, _Q3_ENGINES,
              trainer_classes=("Qwen2VLConfig", "Qwen2VLModel")),
    ModelType("qwen2_5_vl", "qwen2_5_vl", ("Qwen2_5_VLForConditionalGeneration",), "Qwen2_5_VLProcessor",
              "Qwen2VLVideoProcessor", _QWEN2_IDS, 152064,
              _TRANSFORMERS, _Q3_ENGINES,
              trainer_classes=("Qwen2_5_VLConfig", "Qwen2_5_VLModel")),
    ModelType("qwen3_vl", "qwen3_vl", ("Qwen3VLForConditionalGeneration",), "Qwen3VLProcessor",
              "Qwen3VLVideoProcessor", _QWEN2_IDS, 151936,
              _TRANSFORMERS, _Q3_ENGINES,
              trainer_classes=("Qwen3VLConfig", "Qwen3VLModel")),
    ModelType("qwen3_vl_moe", "qwen3_vl", ("Qwen3VLMoeForConditionalGeneration",), "Qwen3VLProcessor",
              "Qwen3VLVideoProcessor", _QWEN2_IDS, 151936,
              _TRANSFORMERS, {"SGLang": ("0.5.16", "0.5.23")},
              trainer_classes=("Qwen3VLMoeConfig", "Qwen3VLMoeModel")),
    ModelType("qwen3_5", "qwen3_vl", ("Qwen3_5ForConditionalGeneration",), "Qwen3VLProcessor",
              "Qwen3VLVideoProcessor", _QWEN3_5_IDS, 248320,
              _TRANSFORMERS, {"SGLang": ("0.5.16", "0.5.23"), "vLLM": ("0.34.0",)},
              trainer_classes=("Qwen3_5Config", "Qwen3_5Model")),
    ModelType("qwen3_5_moe", "qwen3_vl", ("Qwen3_5MoeForConditionalGeneration",), "Qwen3VLProcessor",
              "Qwen3VLVideoProcessor", _QWEN3_5_IDS, 248320,
              _TRANSFORMERS, {"SGLang": ("0.5.16", "0.5.23"), "vLLM": ("0.34.0",)},
              trainer_classes=("Qwen3_5MoeConfig", "Qwen3_5MoeModel")),
    ModelType("qwen4_exp", "qwen3_vl", ("Qwen4ExpForConditionalGeneration",), "Qwen3VLProcessor",
              "Qwen3VLVideoProcessor", _QWEN3_5_IDS, 248320,
              ("5.19.0", "5.24.0", "5.25.0"), {"SGLang": ("0.5.23",)},
              trainer_classes=("Qwen4ExpConfig", "Qwen4ExpModel")),
)}



class _FamilyOfModelType(Mapping):
    """model_type -> family name, read through ``MODEL_TYPES`` (a view, not a second table)."""

    def __getitem__(self, name):
        return MODEL_TYPES[name].family

    def __iter__(self):
        return iter(MODEL_TYPES)

    def __len__(self):
        return len(MODEL_TYPES)


# For the callers that only need a model type's family (a server's /model_info, Miles' checkpoint).
FAMILY_OF_MODEL_TYPE: Mapping[str, str] = _FamilyOfModelType()


def family_of_processor(processor) -> str | None:
    """The family of an HF processor object, from its class (``MODEL_TYPES``' processor classes): Qwen2-VL and
    Qwen2.5-VL share a patch size, so only the class tells them apart.  None: a class no family has."""
    fams = {m.family for m in MODEL_TYPES.values() if m.processor == type(processor).__name__}
    return fams.pop() if len(fams) == 1 else None


def family_signature(family: str) -> tuple[frozenset, frozenset, frozenset]:
    """The processor classes, video processor classes and geometries the table's model types of ``family`` have."""
    rows = [m for m in MODEL_TYPES.values() if m.family == family]
    return (frozenset(m.processor for m in rows), frozenset(m.video_processor for m in rows),
            frozenset(m.geometry for m in rows))


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint directory says about its video processing (None: it does not say)."""
    path: str
    model_type: str | None
    architectures: tuple[str, ...]
    processor: str | None
    video_processor: str | None
    vision_geometry: tuple | None         # config.json vision_config (patch, spatial_merge, temporal_patch)
    processor_geometry: tuple | None      # the video processor's (patch, merge, temporal_patch)


@dataclass(frozen=True)
class Derived:
    family: str
    model_type: str | None
    verified: bool
    reason: str                          # one line: why this family (and, unverified, why not verified)


def _read_json(path: str) -> dict:
    try:
        with open(path) as f:
            out = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ModelTypeError(f"cannot read {path}: {e}") from None
    except RecursionError:                    # json's parser recurses once per level of nesting
        raise ModelTypeError(f"cannot read {path}: its JSON is nested too deeply") from None
    if not isinstance(out, dict):
        raise ModelTypeError(f"{path} is not a JSON object")
    return out


def _check_types(d: dict, where: str, text=(), ints=()) -> dict:
    """``d`` (a config file's object, or part of one: ``where`` names it), refused with a ``ModelTypeError`` naming
    the field and its type where one of ``text`` is not a string or one of ``ints`` not an integer.  A class name
    that is a list would otherwise fail as a lookup (TypeError), and ``"16"`` compare unequal to 16 while
    printing the same."""
    for keys, want, ok in ((text, "a string", lambda v: isinstance(v, str)),
                           (ints, "an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))):
        for k in keys:
            v = d.get(k)
            if v is not None and not ok(v):
                shown = repr(v) if len(repr(v)) <= 60 else repr(v)[:57] + "..."
                raise ModelTypeError(f"{where}: {k} is a {type(v).__name__} ({shown}), expected {want}")
    return d


def _geometry(d: dict, keys: tuple[str, str, str]) -> tuple | None:
    vals = tuple(d.get(k) for k in keys)
    return None if all(v is None for v in vals) else vals


def _class_default(cls_name: str | None, keys) -> tuple | None:
    """The geometry a video processor class defaults to (a checkpoint that does not state it gets these)."""
    if not cls_name:
        return None
    import transformers
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        return None
    return tuple(getattr(cls, k, None) for k in keys)


def _auto_processor_class(model_type: str | None, which: str) -> str | None:
    """The class transformers' Auto* mapping names for ``model_type`` (``which``: processor | video)."""
    if not model_type:
        return None
    try:
        if which == "processor":
            from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES as names
        else:
            from transformers.models.auto.video_processing_auto import VIDEO_PROCESSOR_MAPPING_NAMES as names
    except ImportError:
        return None
    got = names.get(model_type)
    if isinstance(got, dict):                 # 5.2x: {"torchvision": "Qwen3VLVideoProcessor"}
        got = next(iter(got.values()), None)
    return got if isinstance(got, str) else None


_VIDEO_KEYS = ("patch_size", "merge_size", "temporal_patch_size")
_VISION_KEYS = ("patch_size", "spatial_merge_size", "temporal_patch_size")


def read_checkpoint(path, model_type: str | None = None) -> Checkpoint:
    """The facts of a checkpoint directory (``config.json`` and the processor files ``save_pretrained`` writes);
    a class the files do not name is the one transformers' Auto mapping gives the model type.  ``model_type``:
    the one to assume when the directory has no ``config.json`` naming one (a processor saved alone, served by
    a server whose ``/model_info`` names it)."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ModelTypeError(f"{path!r} is not a checkpoint directory here (config.json and the processor files "
                             "of the model the server runs)")
    _check_types({"model_type": model_type}, "the model type given (the server's)", text=("model_type",))
    config = _check_types(_read_json(os.path.join(path, "config.json")), f"{path}/config.json", text=("model_type",))
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else {}
    _check_types(vision, f"{path}/config.json vision_config", ints=_VISION_KEYS)
    video_keys = {"text": ("processor_class", "video_processor_type"), "ints": _VIDEO_KEYS}
    proc = _check_types(_read_json(os.path.join(path, "processor_config.json")), f"{path}/processor_config.json",
                        text=("processor_class",))
    vname = "video_preprocessor_config.json"
    video = _read_json(os.path.join(path, vname))
    if not video:                             # older checkpoints keep the video processor's settings here
        vname = "preprocessor_config.json"
        video = _read_json(os.path.join(path, vname))
    _check_types(video, f"{path}/{vname}", **video_keys)
    if isinstance(proc.get("video_processor"), dict):      # 5.x saves the sub-processors inside processor_config
        video = {**video, **_check_types(proc["video_processor"], f"{path}/processor_config.json video_processor",
                                         **video_keys)}
    model_type = config.get("model_type") or model_type
    processor = (proc.get("processor_class") or video.get("processor_class")
                 or _auto_processor_class(model_type, "processor"))
    video_processor = video.get("video_processor_type") or _auto_processor_class(model_type, "video")
    vgeo = _geometry(vision, _VISION_KEYS)
    pgeo = _geometry(video, _VIDEO_KEYS)
    default = _class_default(video_processor, _VIDEO_KEYS)
    if default is not None:                   # unstated values are the class's defaults, as transformers loads them
        pgeo = tuple(d if v is None else v for v, d in zip(pgeo or (None,) * 3, default))
    arch = config.get("architectures") or ()
    return Checkpoint(path, model_type, tuple(arch) if isinstance(arch, list) else (), processor, video_processor,
                      vgeo, pgeo)


def _differences(ck: Checkpoint, procs, vprocs, geos) -> list[str]:
    out = []
    if ck.processor not in procs:
        out.append(f"processor {ck.processor} (expected {' or '.join(sorted(procs))})")
    if ck.video_processor not in vprocs:
        out.append(f"video processor {ck.video_processor} (expected {' or '.join(sorted(vprocs))})")
    for what, geo in (("vision_config", ck.vision_geometry), ("video processor", ck.processor_geometry)):
        if geo is not None and tuple(geo) not in geos:
            want = " or ".join("/".join(map(str, g)) for g in sorted(geos))
            out.append(f"{what} patch/merge/temporal {'/'.join(map(str, geo))} (expected {want})")
    return out


def derive(checkpoint, family: str | None = None, model_type: str | None = None) -> Derived:
    """The family of the checkpoint directory ``checkpoint`` (or a ``Checkpoint``), from what decides its video
    processing.  ``family``: the one the operator named; it must agree, and it is what lets an unknown model
    type whose processing is a family's run (unverified).  ``model_type``: assumed where the directory names none
    (``read_checkpoint``).  Raises ``ModelTypeError`` with the reason otherwise."""
    ck = checkpoint if isinstance(checkpoint, Checkpoint) else read_checkpoint(checkpoint, model_type)
    if family is not None and family not in FAMILIES:
        raise ModelTypeError(f"unknown family {family!r}; expected one of {', '.join(FAMILIES)}")
    known = MODEL_TYPES.get(ck.model_type)
    if known is not None:
        diff = _differences(ck, {known.processor}, {known.video_processor}, {known.geometry})
        if diff:
            raise ModelTypeError(f"{ck.path}: model_type {ck.model_type} is processed by vidcache as {known.family}, "
                                 f"but this checkpoint has {'; '.join(diff)}: its video processing is not "
                                 f"{known.family}'s, so its cached frames and ids would not be the server's")
        if family is not None and family != known.family:
            raise ModelTypeError(f"{ck.path}: model_type {ck.model_type} is {known.family}, not {family}: drop "
                                 f"--family (or pass --family {known.family})")
        return Derived(known.family, ck.model_type, True, f"model_type {ck.model_type} -> {known.family}")
    matches = [f for f in FAMILIES if not _differences(ck, *family_signature(f))]
    what = (f"processor {ck.processor}, video processor {ck.video_processor}, patch/merge/temporal "
            f"{'/'.join(map(str, ck.processor_geometry or ck.vision_geometry or ('?',) * 3))}")
    if not matches:
        near = min(FAMILIES, key=lambda f: len(_differences(ck, *family_signature(f))))
        raise ModelTypeError(f"{ck.path}: model_type {ck.model_type!r} is not one vidcache knows "
                             f"({', '.join(MODEL_TYPES)}), and its video processing matches no family: against "
                             f"{near}, {'; '.join(_differences(ck, *family_signature(near)))}")
    fam = matches[0]
    if ck.model_type is None and family == fam:
        # No config.json names a model type (a processor saved alone): the processing is all there is to check.
        return Derived(fam, None, True, f"no model_type in {ck.path}; its {what} are {fam}'s, as --family says")
    reason = (f"model_type {ck.model_type!r} is not in vidcache's table ({', '.join(MODEL_TYPES)}); its {what} are "
              f"{fam}'s, so it is processed as {fam}, UNVERIFIED (no parity test ran it)")
    if family is None:
        raise ModelTypeError(f"{ck.path}: {reason}. To run it anyway, name the family: --family {fam}")
    if family != fam:
        raise ModelTypeError(f"{ck.path}: {reason}, not {family}")
    return Derived(fam, ck.model_type, False, reason)


def family_of(checkpoint, family: str | None = None) -> str:
    """``derive(...).family`` (for callers that do not print the reason)."""
    return derive(checkpoint, family).family


def supported_table() -> str:
    """The Markdown table of supported model types (docs/sglang.md carries it; a test checks the copy)."""
    lines = ["| model type | family | architecture | special-token ids (vision start/end, image/video pad) | "
             "verified transformers | engines (verified releases) |", "|---|---|---|---|---|---|"]
    for m in MODEL_TYPES.values():
        eng = "; ".join(f"{e} {', '.join(v)}" for e, v in m.engines.items())
        lines.append(f"| `{m.name}` | `{m.family}` | `{', '.join(m.architectures)}` | "
                     f"{'/'.join(map(str, m.token_ids))} | {', '.join(m.verified_transformers)} | {eng} |")
    return "\n".join(lines)
