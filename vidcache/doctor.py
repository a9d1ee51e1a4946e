"""``vidcache doctor``: is this node set up right?  One line per check, OK or what to do.

It checks without importing torch (versions come from the installed distributions' metadata); the
SGLang plugin and the Miles adapters are imported in child processes, because an import that fails
there is what users otherwise meet as SGLang ignoring the plugin or Miles' ``unrecognized arguments:
--vidcache-family`` (Miles swallows the adapter's ``ModuleNotFoundError``).
"""
from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import platform
import subprocess
import sys
from dataclasses import dataclass

from .engines import ENGINES

# (distribution, import name, required): what vidcache runs on, and the optional peers.
DEPENDENCIES = (
    ("torch", "torch", True), ("torchvision", "torchvision", True), ("numpy", "numpy", True),
    ("transformers", "transformers", True), ("qwen-vl-utils", "qwen_vl_utils", True),
    ("lmdb", "lmdb", True), ("xxhash", "xxhash", True), ("fsspec", "fsspec", True), ("s3fs", "s3fs", True),
    ("decord", "decord", platform.machine() == "x86_64"), ("av", "av", True), ("pebble", "pebble", True), ("tqdm", "tqdm", True),
    ("torchcodec", "torchcodec", False), ("ray", "ray", False),
    *((e.distribution, e.distribution, False) for e in ENGINES.values()),   # the rollout engines (vidcache.engines)
)
NETWORK_FS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "glusterfs", "beegfs",
              "fuse.sshfs", "9p"}


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def text(self) -> str:
        head = f"{'OK  ' if self.ok else 'FAIL'} {self.name:<22} {self.detail}"
        return head + (f"\n     FIX: {self.fix}" if self.fix and not self.ok else "")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def versions() -> list[Check]:
    from . import __version__
    out = [Check("vidcache", True, f"{__version__} at {os.path.dirname(os.path.abspath(__file__))}")]
    for dist, mod, required in DEPENDENCIES:
        v = _version(dist)
        if v is None and importlib.util.find_spec(mod) is not None:
            v = "(installed without metadata)"
        if v is None:
            out.append(Check(dist, not required, "not installed" + ("" if required else " (optional)"),
                             f"pip install {dist}"))
        elif (spec := _fought(dist, v)) is not None:
            out.append(Check(dist, False, f"{v}, but vidcache requires {dist}{spec}: installing vidcache would "
                                          "replace this image's pin", f"keep the image's {dist} and use a vidcache "
                                                                      f"release whose floor it meets, or the image's "
                                                                      f"{dist} that meets {spec}"))
        else:
            out.append(Check(dist, True, v + _layout_note(dist, v)))
    return out


def _fought(dist: str, version: str) -> str | None:
    """The requirement of the installed vidcache on ``dist`` that ``version`` does not meet (pip would replace
    it), or None: read from vidcache's own metadata, so it is always the floor this install declares."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion
    for raw in md.requires("vidcache") or []:
        try:
            req = Requirement(raw)
        except InvalidRequirement:
            continue
        if req.marker is None and req.name.lower() == dist.lower() and req.specifier:
            try:
                if not req.specifier.contains(version, prereleases=True):
                    return str(req.specifier)
            except InvalidVersion:
                return None
    return None


def _layout_note(dist: str, version: str) -> str:
    from .token_layout import VERIFIED_TRANSFORMERS
    if dist == "transformers" and version not in VERIFIED_TRANSFORMERS:
        return (f" (UNVERIFIED for Qwen3-VL's token layout: verified {', '.join(VERIFIED_TRANSFORMERS)}; "
                "check-server compares it with the server's)")
    return ""


def _fstype(path: str) -> str | None:
    """The filesystem type of the mount holding ``path`` (Linux /proc/mounts), or None."""
    path, best, fstype = os.path.realpath(path), "", None
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) \
                        and len(parts[1]) >= len(best):
                    best, fstype = parts[1], parts[2]
    except OSError:
        return None
    return fstype


def node_dir(path: str) -> Check:
    from .config import ENV_DIR
    where = path
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    fs = _fstype(where)
    if fs in NETWORK_FS:
        return Check(ENV_DIR, False, f"{path} is on {fs}",
                     f"LMDB must be on a local disk: point {ENV_DIR} at node-local storage")
    from .config import NodeLayout
    if not NodeLayout(path).has_local_tier():
        return Check(ENV_DIR, True, f"{path} (empty: a fresh node; prewarm or the first read fills it)")
    if not os.access(path, os.W_OK):
        return Check(ENV_DIR, False, f"{path} is not writable", "fix its permissions or choose another")
    return Check(ENV_DIR, True, f"{path}" + (f" ({fs})" if fs else ""))


def shared_tier(url: str | None) -> Check:
    from .config import ENV_SHARED, open_shared_tier
    from .identity import shared_identity, tier_holds_objects
    from .errors import VidcacheError
    if not url:
        return Check(ENV_SHARED, True, "not set: a single-node cache (other nodes cannot resolve its "
                                              "handles; set it for a cluster)")
    if "://" not in url and not os.path.isdir(url):
        return Check(ENV_SHARED, False, f"{url}: missing (no such directory here)",
                     f"mount the shared tier there (an NFS export?), or fix {ENV_SHARED}")
    try:
        store = open_shared_tier(url, read_only=True)
        try:
            return Check(ENV_SHARED, True, f"{url}: reachable, identity {shared_identity(store, False)}")
        except VidcacheError:
            if tier_holds_objects(store):
                raise
            return Check(ENV_SHARED, True, f"{url}: reachable, new (prewarm gives it its identity)")
    except VidcacheError as e:
        return Check(ENV_SHARED, False, f"{url}: [{e.kind}] {e}", "see the message above")
    except Exception as e:  # noqa: BLE001  any reachability failure (credentials, DNS, permissions) is reported
        return Check(ENV_SHARED, False, f"{url}: {type(e).__name__}: {str(e)[:200]}",
                     "check the URL, the mount or the credentials (AWS_* / storage options)")


def decoders() -> list[Check]:
    out = []
    decord_why = ("the default decoder" if platform.machine() == "x86_64" else
                  "no wheel for this machine: PyAV is the default decoder here")
    for name, mod, why in (("decord", "decord", decord_why), ("PyAV", "av", "writes frozen files"),
                           ("torchcodec", "torchcodec", "optional decoder (--decoder torchcodec)")):
        found = importlib.util.find_spec(mod) is not None
        out.append(Check(f"decoder {name}", found or mod == "torchcodec" or (mod == "decord" and
                                                                             platform.machine() != "x86_64"),
                         f"{'found' if found else 'missing'} ({why})", f"pip install {mod}"))
    return out


def _child_import(modules: list[str], timeout_s: float = 300.0) -> str | None:
    """None if ``modules`` import in a fresh interpreter, else the last line of its error."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [pkg_root, os.environ.get("PYTHONPATH")]))}
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)"
    try:
        r = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"import did not finish in {timeout_s:.0f} s"
    if r.returncode == 0:
        return None
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {r.returncode}"


def _fix_for(error: str) -> str:
    if "No module named" in error:
        mod = error.split("No module named", 1)[1].strip().strip("'\"").split(".")[0]
        return f"pip install {mod}  (the missing module)"
    return "see the error above"


def integrations() -> list[Check]:
    out = []
    if importlib.util.find_spec("sglang") is None:
        out.append(Check("SGLang plugin", True, "SGLang not installed here (needed on SGLang nodes only)"))
    else:
        err = _child_import(["vidcache.sglang.plugin"])
        out.append(Check("SGLang plugin", err is None, "vidcache.sglang.plugin imports" if err is None else err,
                         _fix_for(err or "")))
    if importlib.util.find_spec("miles") is None:
        out.append(Check("Miles adapters", True, "Miles not importable here (needed on Miles nodes only: "
                                                 "Miles' image has it; else install a Miles checkout, e.g. "
                                                 "pip install -e /path/to/miles, or put it on PYTHONPATH)"))
    else:
        err = _child_import(["miles_integration.args", "miles_integration.data_source",
                             "miles_integration.generate", "miles_integration.rollout"])
        out.append(Check("Miles adapters", err is None, "miles_integration imports" if err is None else
                         err + " (Miles hides this as `unrecognized arguments: --vidcache-family`)",
                         _fix_for(err or "")))
    return out


def run_checks(cache_dir: str, shared: str | None, imports: bool = True) -> list[Check]:
    checks = versions() + [node_dir(cache_dir), shared_tier(shared)] + decoders()
    return checks + (integrations() if imports else [])
