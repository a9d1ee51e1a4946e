"""SGLang Qwen-VL processor that serves vidcache references from the cache.

Registered by SGLang's ``import_processors`` when the server runs with
``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE=vidcache.sglang.plugin``.  It replaces
``QwenVLImageProcessor`` for every Qwen-VL architecture, and behaves exactly
like it unless a request's ``video_data`` holds vidcache references (the
``.vidcache`` file / ``data:application/vnd.vidcache.ref+json`` URIs that
``vidcache.prepare(..., mode="plugin")`` produces).  For those it:

* reads the canonical uint8 frames straight from the cache: no codec, no
  re-sampling, no resize (the frames were sampled and sized once at prewarm);
* hands the HF processor the *original* video's metadata (fps, frame indices,
  total frames), so Qwen2.5-VL gets ``second_per_grid_ts = 2 / sample_fps`` and
  Qwen3-VL the original timestamps, exactly like ``train_inputs(mode="plugin")``.

No in-process memo of frames: a cache read is one copy out of LMDB's memory
map (page cache on a resend), which is small next to the HF processor's float
conversion, and a memo would pin up to GBs of frames in the server.
"""
from __future__ import annotations

import threading

from sglang.srt.managers.schedule_batch import Modality
from sglang.srt.multimodal.processors.qwen_vl import QWEN_VIDEO_PREPROCESS_CONFIG_KEYS, QwenVLImageProcessor

from ...cache import node_cache
from ...errors import TierMismatchError, VidcacheError
from ...options import PATCH_SIZE
from ...processing import video_metadata
from ..transport import parse_ref

# node_cache memoises per process, but SGLang loads items on several io threads at once.
_OPEN_LOCK = threading.Lock()


class VidcacheVideo:
    """A loaded reference.  Deliberately neither a dict (SGLang's processor_output
    format) nor a ``VideoDecoderWrapper``: ``preprocess_video`` then returns it
    untouched, which is what skips SGLang's fps sampler and its factor-28 resize."""

    __slots__ = ("frames", "metadata", "family", "key")

    def __init__(self, frames, metadata, family, key):
        self.frames, self.metadata, self.family, self.key = frames, metadata, family, key

    def __repr__(self) -> str:  # SGLang logs items on errors; never dump the frames
        return f"VidcacheVideo({self.key}, {tuple(self.frames.shape)})"


def load_ref(rec: dict) -> VidcacheVideo:
    """Frames and original metadata of a parsed reference, from *this node's* cache only.

    The cache is the node's (``VIDCACHE_DIR`` + ``VIDCACHE_SHARED``): a request never names a path,
    so it can neither make the server open or create a store where it likes, nor reach another cache.
    """
    with _OPEN_LOCK:
        cache = node_cache()
    if rec["tier"] != cache.identity:
        raise TierMismatchError(f"reference to cache {rec['tier']!r}, but this server's cache is "
                                f"{cache.identity!r}: start it with VIDCACHE_SHARED set to that cache's shared tier")
    key = rec["key"]              # checked against the key format by parse_ref
    m = cache.require_manifest(key)
    return VidcacheVideo(cache.frames(key, m), video_metadata(m, "plugin"), m.family, key)


class VidcacheQwenVLProcessor(QwenVLImageProcessor):
    # import_processors matches architectures by class name; take over all of Qwen-VL's.
    models = list(QwenVLImageProcessor.models)

    @classmethod
    def _load_single_item(cls, data, modality, *args, **kwargs):
        if modality == Modality.VIDEO:
            uri = getattr(data, "url", data)          # VideoData wraps the URI
            if isinstance(uri, str):
                try:
                    rec = parse_ref(uri)
                    if rec is not None:
                        return load_ref(rec)
                except VidcacheError as e:
                    # A bad or unknown reference is the client's problem (a 400, like an undecodable
                    # video), and must never fall through to stock decoding.
                    raise ValueError(f"cannot load vidcache reference {uri[:100]}: [{e.kind}] {e}") from e
        return super()._load_single_item(data, modality, *args, **kwargs)

    def process_mm_data(self, input_text, images=None, videos=None, audios=None, processor=None,
                        processor_video_config=None, **kwargs):
        refs = [v for v in (videos or []) if isinstance(v, VidcacheVideo)]
        if refs:
            if len(refs) != len(videos):
                # One HF call takes one do_resize/do_sample_frames setting for all videos, and a
                # decoded video needs them on; the trainer could not reproduce such a request.
                raise ValueError("vidcache references cannot be mixed with other videos in one request; "
                                 "prewarm every video into the cache, or send none as a reference")
            want = getattr(getattr(self._processor, "video_processor", None), "patch_size", None)
            for v in refs:
                if want is not None and PATCH_SIZE[v.family] != want:
                    raise ValueError(f"vidcache entry {v.key} was built for {v.family} (patch "
                                     f"{PATCH_SIZE[v.family]}) but this server's model uses patch {want}; "
                                     "prewarm with VideoOptions(family=<this model's family>)")
            # Frames are final: the HF processor must neither sample nor resize, only
            # normalise and patchify; the metadata carries the original timeline.
            kwargs["video_metadata"] = [v.metadata for v in refs]
            kwargs["do_sample_frames"] = False
            videos = [v.frames for v in refs]
            processor_video_config = {k: v for k, v in self.video_config.items()
                                      if k not in QWEN_VIDEO_PREPROCESS_CONFIG_KEYS}
            processor_video_config["do_resize"] = False
        return super().process_mm_data(input_text, images=images, videos=videos, audios=audios,
                                       processor=processor, processor_video_config=processor_video_config,
                                       **kwargs)
