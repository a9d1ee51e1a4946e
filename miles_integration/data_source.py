"""``VidcacheDataSource``: a lazy ``--data-source-path`` for video prompts.

Drop-in for Miles' ``RolloutDataSourceWithBuffer``: it inherits ``get_samples`` / ``add_samples`` / ``save`` /
``load`` / ``get_buffer_length`` unchanged (same offsets, epoch wrap, reshuffle, buffer filter, checkpoint file)
and only replaces the eager ``miles.utils.data.Dataset`` with ``VidcacheDataset``:

* init reads line offsets of the JSONL (vidcache's ``LazyVideoDataset``); nothing is fetched or decoded;
* a ``Sample`` is built when Miles slices ``dataset.samples``: the chat-templated prompt (each video item renders
  as ``<|vision_start|><|video_pad|><|vision_end|>``), ``metadata["vidcache"]`` = handle dicts, and
  ``multimodal_inputs=None`` so Miles' default code never calls the processor on it;
* the videos of the next ``--vidcache-read-ahead`` prompts, in the sampler's order (across epochs, and from the
  restored position after ``load``), are pulled into this node's local tier in the background
  (``vidcache.read_ahead``), so a fresh node's first reads do not wait on the shared tier;
* ``--rollout-max-prompt-len`` filters on the expanded length computed from cached manifests (token counts),
  never by decoding; a video that is not cached yet cannot be measured and is kept (it is built on first use),
  or rejected at init with ``--vidcache-require-cached``.

``VidcacheDataset`` has ``miles.utils.data.Dataset``'s constructor signature (plus ``config=``), so the rollout
function also uses it for eval datasets.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import random
import re
import threading
import weakref
from collections.abc import Sequence

import numpy as np

import miles.rollout.data_source as miles_data_source
from miles.rollout.data_source import RolloutDataSourceWithBuffer
from miles.utils import chat_template_utils
from miles.utils.data import _build_messages
from miles.utils.types import Sample

import vidcache
from vidcache import NotCachedError
from vidcache.families import FAMILIES
from vidcache.dataset import IMAGE_TOKEN, VIDEO_TOKEN, LazyVideoDataset, ensure_inline, image_source
from vidcache.processing import VIDEO_PLACEHOLDER, expanded_ids

from .args import VidcacheConfig
from .meta import KEY, metadata_entry

logger = logging.getLogger(__name__)

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
_SLICE = re.compile(r"^(?P<path>.*)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]$")


def _parse_path(path: str) -> tuple[str, slice | None]:
    """Miles' ``path@[start:end]`` row-slice syntax."""
    if m := _SLICE.match(path):
        s, e = m.group("start"), m.group("end")
        return m.group("path"), slice(int(s) if s else None, int(e) if e else None)
    return path, None


def expanded_length(num_compact_tokens: int, handles, family: str) -> int | None:
    """Prompt length after the processor's expansion, from cached manifests only; None if a video is not cached.

    Exact for qwen2_vl / qwen2_5_vl (each compact ``<|video_pad|>`` becomes ``video_pad_tokens`` pads).  For
    qwen3_vl it is a lower bound: the per-frame ``<t seconds>`` text is not counted.
    """
    n = num_compact_tokens
    for h in handles:
        if not _cached(h):
            return None
        n += h.num_video_tokens - 1
        if FAMILIES[family].per_frame:             # one vision_start/vision_end pair per temporal group
            n += 2 * (h.metadata["video_grid_thw"][0] - 1)
    return n


def _cached(handle) -> bool:
    """Whether the entry is here.  A handle of a video held as bytes carries its key from the start, so
    resolving it says nothing: the manifest must be found."""
    try:
        handle.resolve(build=False)
        if handle.source is None:
            handle.manifest  # noqa: B018 -- NotCachedError when the entry is absent
        return True
    except NotCachedError:
        return False


class _SampleView(Sequence):
    """A lazy ``list[Sample]``: indexing or slicing builds fresh Samples from the rows."""

    def __init__(self, dataset: "VidcacheDataset", order: np.ndarray):
        self._ds, self._order = dataset, order

    def __len__(self) -> int:
        return len(self._order)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._ds.build_sample(int(r)) for r in self._order[i]]
        return self._ds.build_sample(int(self._order[i]))


class VidcacheDataset:
    """Lazy stand-in for ``miles.utils.data.Dataset`` over a video JSONL (same constructor, same ``shuffle``)."""

    def __init__(self, path, tokenizer, processor=None, max_length=None, *, prompt_key="text", multimodal_keys=None,
                 label_key=None, tool_key=None, metadata_key="metadata", seed=42, apply_chat_template=False,
                 apply_chat_template_kwargs=None, config: VidcacheConfig | None = None, **miles_kwargs):
        """``miles_kwargs``: arguments newer Miles versions pass (e.g. ``video_process_config``).  Video
        processing is vidcache's (the ``--vidcache-*`` options, one record for rollout and training), so
        they are accepted and ignored, with a warning when they would have changed the frames."""
        if config is None:
            raise ValueError("VidcacheDataset needs config= (a VidcacheConfig)")
        ignored = {k: v for k, v in miles_kwargs.items() if v}
        if ignored:
            logger.warning("vidcache: ignoring Miles dataset arguments %s; video options come from --vidcache-*",
                           sorted(ignored))
        path, row_slice = _parse_path(str(path))
        if not path.endswith((".jsonl", ".parquet")):      # what Miles' read_file reads
            raise ValueError(f"vidcache's lazy dataset reads .jsonl and .parquet prompt files (as Miles does), "
                             f"got {path!r}")
        self.config = config
        self.tokenizer = tokenizer
        self.processor = processor      # when given, long prompts are measured exactly (see _filter_long)
        self.prompt_key, self.label_key, self.tool_key, self.metadata_key = prompt_key, label_key, tool_key, metadata_key
        self.multimodal_keys = dict(multimodal_keys or {})
        if set(self.multimodal_keys) - {"video", "image"}:
            raise NotImplementedError(f"vidcache's data source carries videos and images; got multimodal keys "
                                      f"{sorted(self.multimodal_keys)}")
        self.video_key = self.multimodal_keys.get("video", config.video_key)
        self.image_key = self.multimodal_keys.get("image")
        self.apply_chat_template = apply_chat_template
        self.apply_chat_template_kwargs = apply_chat_template_kwargs or {}
        self.rows = LazyVideoDataset(path, config.open_cache(), config.options, input_key=prompt_key,
                                     video_key=self.video_key, image_key=self.image_key,
                                     media_roots=config.media_roots)
        rows = np.arange(len(self.rows), dtype=np.int64)
        if row_slice is not None:
            rows = rows[row_slice]
        if config.require_cached:
            self._check_cached(rows)
        if max_length is not None:
            rows = self._filter_long(rows, max_length)
        self.origin_rows = rows
        self.epoch_id = -1
        self.seed = seed
        self.samples: Sequence = _SampleView(self, rows)
        self.origin_samples = self.samples

    # --- Miles Dataset interface -------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, idx):
        return self.samples[idx]

    def order(self, epoch_id: int, shuffle: bool) -> np.ndarray:
        """The rows in the order Miles samples them in epoch ``epoch_id``: ``shuffle``'s permutation, drawn the
        same way from a generator of its own (Miles' global ``random`` state is left alone)."""
        if not shuffle:
            return self.origin_rows
        permutation = list(range(len(self.origin_rows)))
        random.Random(self.seed + epoch_id).shuffle(permutation)
        return self.origin_rows[permutation]

    def upcoming_rows(self, epoch_id: int, offset: int, shuffle: bool):
        """The rows in the order Miles' data source takes them from ``(epoch_id, offset)`` on, across epochs."""
        while len(self.origin_rows):
            for r in self.order(epoch_id, shuffle)[offset:]:
                yield int(r)
            epoch_id, offset = epoch_id + 1, 0

    def upcoming(self, epoch_id: int, offset: int, shuffle: bool):
        """Each of ``upcoming_rows``' video handles: what read-ahead pulls."""
        return (self.rows[r].handles for r in self.upcoming_rows(epoch_id, offset, shuffle))

    def shuffle(self, new_epoch_id: int) -> None:
        """Exactly ``miles.utils.data.Dataset.shuffle``: same seed, same permutation."""
        if self.epoch_id == new_epoch_id:
            return
        random.seed(self.seed + new_epoch_id)
        permutation = list(range(len(self.origin_rows)))
        random.shuffle(permutation)
        self.samples = _SampleView(self, self.origin_rows[permutation])
        self.epoch_id = new_epoch_id

    # --- rows -> prompts ------------------------------------------------------------------------
    def _miles_data(self, row) -> tuple[dict, dict | None]:
        """The row as Miles' ``_build_messages`` reads it, and the ``multimodal_keys`` to give it: image values
        made sources ``fetch_image`` reads (``vidcache.dataset.image_source``: relative paths resolved, bytes as
        base64 ``data:image`` URIs), and only the keys this row holds (Miles' ``list(data.get(key))`` fails on
        a row without one, e.g. the video-only rows of a mixed set)."""
        data = copy.deepcopy(row.data)
        base, roots = self.rows._base_dir, self.rows.media_roots
        if self.image_key and data.get(self.image_key) is not None:
            v = data[self.image_key]
            data[self.image_key] = [image_source(x, "an image", base, roots)
                                    for x in (v if isinstance(v, list) else [v])]
        if isinstance(data.get(self.prompt_key), list):
            for msg in data[self.prompt_key]:
                for item in msg.get("content") if isinstance(msg, dict) and isinstance(msg.get("content"), list) else []:
                    if isinstance(item, dict) and item.get("type") != "video" and "image" in item:
                        item["image"] = image_source(item["image"], "an image item", base, roots)
        if isinstance(data.get(self.video_key), str):
            data[self.video_key] = [data[self.video_key]]
        mm = None
        if isinstance(data.get(self.prompt_key), str):
            mm = {t: k for t, k in (("image", self.image_key), ("video", self.video_key)) if k and data.get(k)} or None
        return data, mm

    def render(self, row) -> str | list:
        """The prompt Miles would build for ``row`` (``Dataset.__init__``), with video items as placeholders."""
        data, mm = self._miles_data(row)
        as_conversation = self.apply_chat_template or mm is not None or isinstance(data.get(self.prompt_key), list)
        if not self.apply_chat_template:
            prompt = data.get(self.prompt_key)
            if isinstance(prompt, str):
                return prompt.replace(VIDEO_TOKEN, VIDEO_PLACEHOLDER).replace(IMAGE_TOKEN, IMAGE_PLACEHOLDER)
            if row.handles:
                raise ValueError("video rows with a message-list prompt need --apply-chat-template")
            return prompt
        messages = _build_messages(data, self.prompt_key, as_conversation, mm)
        text = chat_template_utils.apply_chat_template(
            messages, tokenizer=self.tokenizer, tools=self._tools(row.data), tokenize=False,
            add_generation_prompt=True, **self.apply_chat_template_kwargs)
        if row.handles and text.count(VIDEO_PLACEHOLDER) != len(row.handles):
            raise ValueError(f"row {row.index}: the chat template rendered {text.count(VIDEO_PLACEHOLDER)} "
                             f"{VIDEO_PLACEHOLDER!r} for {len(row.handles)} video(s); vidcache needs one per video "
                             "(use the model's Qwen-VL chat template)")
        return text

    def images(self, row) -> list | None:
        """The row's images exactly as Miles' own ``Dataset`` gives them: its ``process_vision_info`` (qwen-vl-utils'
        ``fetch_image``, with the processor's patch size) on the row's messages, with the video items left out
        (vidcache serves those from the cache; Miles would decode them here).  Read when a sample is built,
        never at init.  None for a row without images."""
        if not row.images:
            return None
        from miles.utils.processing_utils import process_vision_info
        data, mm = self._miles_data(row)
        messages = _build_messages(data, self.prompt_key, True, mm)
        for m in messages:
            if isinstance(m.get("content"), list):
                m["content"] = [c for c in m["content"] if not (isinstance(c, dict) and c.get("type") == "video")]
        processor = self.processor
        if processor is None:      # Miles' patch-size fallback needs an image_processor attribute to read
            from types import SimpleNamespace

            processor = SimpleNamespace(image_processor=SimpleNamespace(patch_size=self.config.options.patch_size))
        return process_vision_info(messages, processor)["images"]

    def _tools(self, data: dict):
        if self.tool_key is None or self.tool_key not in data:
            return None
        import json
        tools = data[self.tool_key]
        return json.loads(tools) if isinstance(tools, str) else list(tools)

    def build_sample(self, i: int) -> Sample:
        row = self.rows[i]
        metadata = dict(row.data.get(self.metadata_key) or {})
        if (tools := self._tools(row.data)) is not None:
            metadata["tools"] = tools
        if row.handles:
            metadata[KEY] = metadata_entry(row.handles)
            for h in row.handles:      # a video held as bytes in the dataset: only this process can build it
                if h.key in row.inline and not _cached(h):
                    ensure_inline(self.rows.cache if not isinstance(self.rows.cache, str) else self.config.open_cache(),
                                  row.inline[h.key], h.options)
        images = self.images(row)
        # Miles' own shape: {"images": [...], "videos": None}; Miles' single_turn serves image-only rows from it,
        # and vidcache's generate sends the images beside the cached videos.
        mm = {"images": images, "videos": None} if images else None
        return Sample(prompt=self.render(row), label=row.data[self.label_key] if self.label_key is not None else None,
                      metadata=metadata, multimodal_inputs=mm)

    # --- init-time checks (no decoding) -------------------------------------------------------------
    def _check_cached(self, rows) -> None:
        missing = []
        for i in rows:
            for h in self.rows[int(i)].handles:
                if not _cached(h):
                    missing.append(h.source or h.key)
        if missing:
            raise NotCachedError(f"{len(missing)} video(s) are not in cache {self.config.open_cache()!r} "
                                 f"(--vidcache-require-cached), e.g. {missing[:3]}; run `vidcache prewarm`")

    def _filter_long(self, rows, max_length: int):
        keep, dropped, unknown = [], 0, 0
        for i in rows:
            row = self.rows[int(i)]
            prompt = self.render(row)
            if not isinstance(prompt, str):
                keep.append(i)
                continue
            if row.images:         # measuring would read the images at init: kept, counted as unmeasured
                unknown += 1
                keep.append(i)
                continue
            if self.processor is not None and all(_cached(h) for h in row.handles):
                # Exact, Qwen3 timestamps included: the processor's own expansion, from manifests only.
                manifests = [h.manifest for h in row.handles]
                n = len(expanded_ids(self.processor, prompt, manifests, self.config.mode))
            else:
                n_compact = len(self.tokenizer(prompt, add_special_tokens=False)["input_ids"])
                n = expanded_length(n_compact, row.handles, self.config.options.family)
            if n is None:
                unknown += 1
                keep.append(i)
            elif n <= max_length:
                keep.append(i)
            else:
                dropped += 1
        logger.info("vidcache: filtered %d prompts longer than max_length=%d (cached token counts); %d rows with "
                    "uncached videos or with images kept unmeasured", dropped, max_length, unknown)
        self.num_filtered, self.num_unmeasured = dropped, unknown
        return np.asarray(keep, dtype=np.int64)


# Miles builds its eager ``Dataset`` through a module-global name (``miles.rollout.data_source.Dataset`` for the
# training data, ``...inference_rollout_eval.Dataset`` for eval sets); vidcache swaps that name for the block in
# which Miles builds.  One swap at a time, process-wide: two overlapping swaps of one name would each restore
# what the other set, leaving vidcache's factory in place for the rest of the process.
_SWAP_LOCK = threading.Lock()


@contextlib.contextmanager
def _swapped(module, dataset_factory):
    saved = module.Dataset
    module.Dataset = dataset_factory
    try:
        yield
    finally:
        module.Dataset = saved


@contextlib.contextmanager
def miles_builds(module, dataset_factory):
    """Within the block, ``module``'s ``Dataset`` (the name Miles calls) is ``dataset_factory``; restored after."""
    with _SWAP_LOCK, _swapped(module, dataset_factory):
        yield


@contextlib.asynccontextmanager
async def miles_builds_async(module, dataset_factory):
    """``miles_builds`` around a coroutine (Miles' eval builds its datasets between awaits).  The lock is taken
    without blocking the event loop: a second eval on the same loop waits its turn instead of stopping the loop
    that would let the first one finish."""
    while not _SWAP_LOCK.acquire(blocking=False):
        await asyncio.sleep(0.01)
    try:
        with _swapped(module, dataset_factory):
            yield
    finally:
        _SWAP_LOCK.release()


_OPEN: "weakref.WeakSet" = weakref.WeakSet()      # data sources whose read-ahead may still run
_OPEN_LOCK = threading.Lock()


def _close_at_exit(ds) -> None:
    """Stop ``ds``'s read-ahead when the interpreter exits, before its thread pools go.

    A script (or a Miles run that never calls ``dispose``) ends with read-ahead scheduling pulls; at exit
    ``concurrent.futures`` shuts every pool down from a ``threading`` exit hook, which runs before ``atexit``'s,
    and the read-ahead thread's next ``submit`` then raised ``cannot schedule new futures after shutdown``
    (a traceback at rc 0).  A hook of the same kind registered after ``concurrent.futures``' runs before it
    (they run in reverse order) and closes read-ahead first, so nothing is scheduled on a closed pool."""
    with _OPEN_LOCK:
        if not getattr(_close_at_exit, "registered", False):
            import concurrent.futures.thread  # noqa: F401 -- its hook first, so that ours runs before it
            threading._register_atexit(_close_all)    # noqa: SLF001 -- the hook concurrent.futures itself uses
            _close_at_exit.registered = True
        _OPEN.add(ds)


def _close_all() -> None:
    for ds in list(_OPEN):
        with contextlib.suppress(Exception):
            ds.close()


_LATEST: list = []      # the data source of this (rollout) process, for its generate function's hints


def upcoming_keys(n: int) -> list[str]:
    """The keys of the next ``n`` entries this process's data source will hand out (its read-ahead window)."""
    ds = _LATEST[0] if _LATEST else None
    ahead = getattr(ds, "_ahead", None)
    return ahead.upcoming_keys(n) if ahead is not None and n > 0 else []


class VidcacheDataSource(RolloutDataSourceWithBuffer):
    """``--data-source-path miles_integration.data_source.VidcacheDataSource``.

    Built by Miles' own constructor, so every piece of state Miles sets up (offsets, buffer, filters, and
    whatever later versions add) is Miles'; only the dataset it constructs is vidcache's lazy one.
    """

    def __init__(self, args):
        self.config = VidcacheConfig.from_args(args)
        self._ahead, self._ahead_at = None, None
        with miles_builds(miles_data_source, functools.partial(VidcacheDataset, config=self.config)):
            super().__init__(args)
        self._follow()
        _LATEST[:] = [self]

    # --- read-ahead in the sampler's order (vidcache.readahead) ---------------------------------------------
    def get_samples(self, num_samples):
        samples = super().get_samples(num_samples)
        self._follow()
        return samples

    def load(self, rollout_id=None):
        super().load(rollout_id)
        self._follow()             # a resume: from the restored epoch and offset

    def _follow(self) -> None:
        """Keep read-ahead just past the sampler's position (epoch, offset): moved on when the sampler moved
        forward along the order, started again there otherwise (a resume)."""
        if self.config.read_ahead <= 0 or self.dataset is None:
            return
        at = (self.epoch_id, self.sample_offset)
        if self._ahead is not None:
            if (n := self._taken_since(self._ahead_at, at)) is not None:
                self._ahead.advance(n)
                self._ahead_at = at
                return
            self._ahead.close()
        shuffle = bool(getattr(self.args, "rollout_shuffle", False))
        _close_at_exit(self)
        self._ahead = vidcache.read_ahead(self.dataset.upcoming(*at, shuffle=shuffle), depth=self.config.read_ahead,
                                          max_bytes=self.config.read_ahead_bytes)
        self._ahead_at = at

    def _taken_since(self, before: tuple[int, int], after: tuple[int, int]) -> int | None:
        """Rows the sampler took between two positions, when ``after`` is on from ``before`` (within an epoch or
        into the next); None otherwise."""
        (e0, o0), (e1, o1) = before, after
        if e1 == e0 and o1 >= o0:
            return o1 - o0
        if e1 == e0 + 1:
            return len(self.dataset.origin_rows) - o0 + o1
        return None

    def close(self) -> None:
        """Called by ``RolloutManager.dispose``: stops read-ahead.  The cache is the node's per-process shared
        one, also used by the generate function in this process, so it is left open."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None
