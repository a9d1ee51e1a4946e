"""The import floors, bottom up: the one statement of them.  Each module imports only from its own floor or
below (``tests/test_layers.py`` checks every import against this table; it also checks that the package docstring
of ``vidcache/__init__.py`` and the README's code map say the same).  A dotted name covers its submodules:
``store`` is ``vidcache/store/`` and everything in it; the most specific name wins.  SGLang's facts are
``sglang_facts``, beside ``sglang/``, since the trainer side reads them; what a model family is lives in
``families``, on the bottom floor, since every floor asks it.  On the rollout floor ``sglang/`` and ``vllm/`` stand side by
side on ``rollout/`` and never import each other (``vidcache.engines``).  Data only: nothing here is imported at run time.
"""
from __future__ import annotations

# (floor, modules, what the floor is for)
FLOORS: list[tuple[str, list[str], str]] = [
    ("facts", ["errors", "families", "engines", "digest", "keys", "options", "serving", "sglang_facts", "token_layout",
               "attest"],
     "exceptions, the model families and types and the rollout engines served (one record each), digests, keys, options, serving and SGLang "
     "facts, token layouts, train-tensor digests"),
    ("store", ["store"], "bytes under keys (LMDB, fsspec, tiers); imports only errors"),
    ("loader", ["loader"], "the pure pipeline: source bytes -> canonical frames"),
    ("entries", ["manifest", "encode", "frozen_file", "config", "identity", "embeddings.record"],
     "entry records; the video writer; the frozen-file format; node settings; the cache's identity; the "
     "embedding record"),
    ("integrity", ["integrity"], "is this copy sound? (blobs, manifests, frozen files): one answer for every path"),
    ("policies", ["frozen_copies", "compact", "repair", "catalog"],
     "the cache's policies: frozen files, compact layout, repair, listing/stats"),
    ("reads", ["reads"], "the read path: tiers, checks, the quarantine-and-retry rule, the memos"),
    ("cache", ["cache"], "VideoCache: lookup, build, housekeeping"),
    ("node", ["node"], "the caches open in this process, and the lookup by identity"),
    ("trainer", ["processing", "device", "mrope"],
     "the trainer side: tensors from cached frames and manifests (no handles); M-RoPE rules"),
    ("references", ["handle", "dataset", "prompt_files", "parquet_cells", "readahead", "inputs_ahead", "pullworker", "positions", "embeddings"],
     "references above the cache; datasets (what a row means; its files, one parquet cell at a time); read-ahead and its pull worker; positions by engine rule; the frozen-vision "
     "embedding tier"),
    ("rollout", ["sglang", "vllm", "rollout"],
     "the rollout side: frozen files, transports, prepare, serve, plugin; vLLM's loader; references, server checks "
     "and prompts"),
    ("jobs", ["planning", "prewarming", "pulling", "embeddings.jobs", "cli", "doctor", "floors", "contact_sheet", "testing", ""],
     "the jobs"),                                      # "": the lazy facade, vidcache/__init__
]
# Modules on a floor that the docstring and the README leave out (helpers, not parts of the house).
UNSTATED = ("floors", "contact_sheet", "testing", "")

# Stricter rules for the two bottom packages (their own modules are always allowed).
STORE_MAY_IMPORT = {"vidcache.errors"}
LOADER_MAY_IMPORT = {"vidcache.errors", "vidcache.digest", "vidcache.options"}
# The engine adapters (``vidcache.engines.ENGINES``, the engines' records): each builds on the engine-neutral core
# (rollout/) and none imports another, so one engine's code can change (or be absent) without the others' moving.
