"""The offline toy processors live in vidcache.testing.processors (users try the API with them); the tests
import them from here, as before."""
from vidcache.testing.processors import (FAMILIES, HUB_VIDEO_KWARGS, MODEL_TYPES, SGLANG_QWEN2_VL_SIZE,  # noqa: F401
                                         SPECIAL_TOKENS, TOKEN_IDS, build_image_processor, build_processor,
                                         build_tokenizer, build_video_processor, checkpoint_config, save_checkpoint,
                                         token_ids, toy_processor)
