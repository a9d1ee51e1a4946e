"""The offline toy processors live in vidcache.testing.processors (users try the API with them); the tests
import them from here, as before."""
from vidcache.testing.processors import (FAMILIES, HUB_VIDEO_KWARGS, SGLANG_QWEN2_VL_SIZE, SPECIAL_TOKENS,  # noqa: F401
                                         TOKEN_IDS, build_image_processor, build_processor, build_tokenizer,
                                         build_video_processor, toy_processor)
