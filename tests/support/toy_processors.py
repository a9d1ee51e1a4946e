"""The offline toy processors live in vidcache.testing.processors (users try the API with them); the tests
import them from here, as before."""
from vidcache.testing.processors import (FAMILIES, HUB_VIDEO_KWARGS, SGLANG_QWEN2_VL_SIZE, SPECIAL_TOKENS,  # noqa: F401
                                         TOKEN_IDS, build_image_processor, build_processor, build_tokenizer,
                                         build_video_processor, toy_processor)


def save_checkpoint(family: str, path, chat_template: str | None = None):
    """A toy processor saved as a checkpoint directory (``path``), with ``chat_template`` on the processor and its
    tokenizer when given: what Miles' ``load_processor`` / ``load_tokenizer`` read.  Returns the processor."""
    proc = build_processor(family)
    if chat_template is not None:
        proc.tokenizer.chat_template = chat_template
        proc.chat_template = chat_template
    proc.save_pretrained(str(path))
    return proc
