"""Engine-neutral rollout facts, shared by ``vidcache.sglang`` and ``vidcache.vllm`` (neither owns them).

``models``: the model types vidcache serves (one table) and a checkpoint's family, derived from what decides
its video processing.
"""
