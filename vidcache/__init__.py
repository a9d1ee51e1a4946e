"""vidcache: decode each video once, feed SGLang and the trainer bit-identical frames."""
from .cache import VideoCache, cache_key, open_cache
from .digest import Digest
from .errors import NotCachedError, ParityError, VidcacheError
from .loader.handle import VideoHandle
from .options import VideoOptions
from .processing import PreparedRequest, prepare, train_inputs

__all__ = ["VideoCache", "VideoHandle", "VideoOptions", "Digest", "PreparedRequest", "prepare", "train_inputs",
           "open_cache", "cache_key", "VidcacheError", "NotCachedError", "ParityError"]
