"""SGLang's own model registry, with ``SGLANG_EXTERNAL_MODEL_PACKAGE=vidcache.sglang.models``, resolves
``Qwen2_5_VLForConditionalGeneration`` to vidcache's subclass, in both verified releases: 0.5.23 (external models
first, SGLang's merged under them: ``srt/models/registry.py:133-138``) and 0.5.16 (``register(external,
overwrite=True)``, :133-134).  SGLang's own ``Qwen2_5_VLForConditionalGeneration`` is the base class, so the rest
is SGLang's code.  The server itself (0.5.23) runs the class in test_sglang_real_server.py; 0.5.16's server is
not installed here (its processor overlay is), so for 0.5.16 this resolution is what is run."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from support import sglang_server as ss

pytestmark = [pytest.mark.peer]
OVERLAY = ss.ROOT / ".overlays" / "sglang-0.5.16"

PROBE = r"""
import importlib.metadata as md, json, sglang
from sglang.srt.models.registry import ModelRegistry
cls, arch = ModelRegistry.resolve_model_cls(["Qwen2_5_VLForConditionalGeneration"])
from sglang.srt.models import qwen2_5_vl as own
print(json.dumps({"sglang": getattr(sglang, "__version__", None), "module": cls.__module__, "arch": arch,
                  "subclass": issubclass(cls, own.Qwen2_5_VLForConditionalGeneration) and cls is not
                  own.Qwen2_5_VLForConditionalGeneration}))
"""


@pytest.mark.parametrize("release", ["0.5.23", "0.5.16"])
def test_sglangs_registry_resolves_qwen2_5_vl_to_the_model_package(release):
    if not ss.server_python().exists():
        pytest.fail(f"SGLang server environment not built ({ss.server_venv()}): run scripts/setup_sglang_server.sh",
                    pytrace=False)
    path = [str(ss.SHIM), str(ss.ROOT)]
    if release == "0.5.16":
        if not OVERLAY.exists():
            pytest.fail(f"{OVERLAY} missing: scripts/setup_sglang_overlay.sh (install.sh --test) builds it",
                        pytrace=False)
        path.insert(0, str(OVERLAY))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}, "SGLANG_USE_CPU_ENGINE": "1",
           "SGLANG_EXTERNAL_MODEL_PACKAGE": "vidcache.sglang.models", "PYTHONPATH": os.pathsep.join(path)}
    r = subprocess.run([str(ss.server_python()), "-W", "ignore", "-c", PROBE], capture_output=True, text=True,
                       env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["sglang"] == release, out
    assert out["module"] == "vidcache.sglang.models.qwen2_5_vl" and out["subclass"], out
