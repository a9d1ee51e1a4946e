"""vidcache's external multimodal processor package for SGLang.

Start the server with ``SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE=vidcache.sglang.plugin``
(``vidcache sglang-config --mode plugin`` prints it).  SGLang imports every
non-package submodule of this package and registers its processor classes;
classes defined here in ``__init__`` would be ignored, so the processor lives in
``qwen_vl.py``.  Nothing here imports sglang, so ``import vidcache`` stays light.
"""
