"""The engine-neutral rollout core, shared by ``vidcache.sglang`` and ``vidcache.vllm`` (neither owns it, and neither
imports the other: tests/test_layers.py checks).

``models``: the model types vidcache serves (one table) and a checkpoint's family, derived from what decides
its video processing (on the facts floor).
``ref``: the plugin-mode reference (``ref_uri``, ``parse_ref``, ``open_ref``) that SGLang's plugin and vLLM's
loader both read.
``check``: the server-check framework (``ServerCheck``, ``Cause``, ``http_json``, the version verdict, the canary).
``prompt``: one model placeholder per video / image (``video_prompt``, ``image_prompt``).
``embeddings``: precomputed vision embeddings for the engines: which record serves which video (``Tower``,
``records_for``), the rows in the engines' layout (``decoder_rows``), the checks, and the server's lookup.
"""
