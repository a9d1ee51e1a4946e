"""vidcache for vLLM: the same cached frames, and the same guarantee, on a vLLM rollout engine.

``vidcache.vllm.config``   the engine settings (one fact: ``ENGINE_KWARGS``, ``MM_PROCESSOR_KWARGS``)
``vidcache.vllm.request``  ``prepare_vllm`` (TokensPrompt for ``LLM.generate``), ``chat_request`` (OpenAI server)
``vidcache.vllm.loader``   the ``"vidcache"`` video loader (imports vLLM; loaded by vLLM's plugin entry point)
``vidcache.vllm.check``    ``check-server --engine vllm``

Nothing here imports vLLM except ``loader``, so ``import vidcache`` / ``vidcache.vllm`` never needs it.
See docs/vllm.md.
"""
from importlib import import_module

_EXPORTS = {"prepare_vllm": "vidcache.vllm.request", "VllmRequest": "vidcache.vllm.request",
            "chat_request": "vidcache.vllm.request", "ENGINE_KWARGS": "vidcache.vllm.config",
            "MM_PROCESSOR_KWARGS": "vidcache.vllm.config", "engine_kwargs": "vidcache.vllm.config"}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'vidcache.vllm' has no attribute {name!r}")
