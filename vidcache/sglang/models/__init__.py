"""vidcache's external model package for SGLang: the original models' vision computation, nothing else changed.

Start the server with ``SGLANG_EXTERNAL_MODEL_PACKAGE=vidcache.sglang.models`` (``vidcache sglang-config`` prints it
for the families that need it).  SGLang imports every non-package submodule of this package and registers the
classes each names in ``EntryClass``; an external class wins over SGLang's own of the same name (0.5.23:
``ModelRegistry.models`` is filled from this package first and SGLang's defaults are merged under it; 0.5.16:
``register(..., overwrite=True)``), and SGLang's multimodal processor is found by the class *name*, so SGLang's own
(or vidcache's plugin) still processes the requests.

Why: SGLang's Qwen2.5-VL vision tower (0.5.16 and 0.5.23, ``srt/models/qwen2_5_vl.py``) gives its full-attention
blocks one sequence per *video* (``cu_seqlens`` of ``t*h*w``), where the model was trained, and transformers (every
trainer: Miles' Megatron-Bridge and FSDP paths included) computes, one sequence per *temporal patch* (``h*w``).
With identical inputs and positions that is 1.6-2.6 nats/token of KL on multi-patch videos.  Nothing here imports
sglang at package import, so ``import vidcache`` stays light; ``qwen2_5_vl`` imports it when SGLang loads it.
"""
# The package's import path: what the server's environment names, and what check-server asks the plugin about.
from ...sglang_facts import MODEL_PACKAGE as PACKAGE  # noqa: E402  (one spelling: the env value)
