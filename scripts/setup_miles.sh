#!/usr/bin/env bash
# Make Miles (radixark/miles) importable on CPU for vidcache's miles_integration tests.
#
# Usage: scripts/setup_miles.sh [PYTHON] [MILES_CHECKOUT]      (default PYTHON: .venv/bin/python)
#   The Miles checkout (a directory holding miles/__init__.py) is MILES_CHECKOUT, else $MILES_SRC.
#   Neither given: print how to enable the Miles tests and exit 0 (they then skip, saying why).
#   vidcache was tested against Miles 31f1ca961 (2026-08-21); CI uses that snapshot.
#
# Idempotent. Steps:
#   1. Miles is NOT pip-installed; tests use it with PYTHONPATH=$MILES_SRC. Only the few extra PyPI packages
#      its rollout-side modules import are installed, under a constraints file that pins the venv's
#      torch / torchvision / transformers / tokenizers / numpy / sglang (pip fails rather than replace them).
#      sglang itself comes from scripts/setup_peer_env.sh (sglang --no-deps + its small deps); it is run
#      here if sglang is missing. sglang-router is installed --no-deps (its deps are listed explicitly).
#   2. Verify that the Miles modules vidcache uses import (with the test-only encoding_dsv4 stub, see
#      tests/support/miles_compat.py).
set -euo pipefail

cd "$(dirname "$0")/.."
PY="${1:-.venv/bin/python}"
MILES_SRC="${2:-${MILES_SRC:-}}"
SGLANG_ROUTER_VERSION="${SGLANG_ROUTER_VERSION:-0.3.2}"

log() { echo "[setup_miles] $*"; }

if [[ -z "$MILES_SRC" || ! -f "$MILES_SRC/miles/__init__.py" ]]; then
  log "no Miles checkout given (MILES_SRC='${MILES_SRC}'); Miles tests will skip."
  log "To run them: MILES_SRC=/path/to/miles-checkout bash scripts/setup_miles.sh, and keep MILES_SRC set for pytest."
  exit 0
fi
log "Miles checkout: $MILES_SRC"
MILES_ABS="$(cd "$MILES_SRC" && pwd)"

if [[ ! -x "$PY" ]]; then
  log "python not found: $PY (create the venv first); skipping package install"
  exit 0
fi
PIP=("$PY" -m pip --disable-pip-version-check -q)

# Ray first: Miles' rollout modules import it at module level, and it is vidcache's [ray] extra (install.sh
# --test has it; install.sh alone does not).  Said before the minutes of installs below, not after them.
if ! "$PY" -c "import ray" >/dev/null 2>&1; then
  log "error: ray does not import in $PY, and Miles' rollout modules need it."
  log "Fix: $PY -m pip install -e '.[ray]'   (vidcache's ray extra; or bash scripts/install.sh --test)"
  exit 1
fi

# ---------------------------------------------------------------- 2. packages
# The import check used both to decide whether to install and to verify afterwards.
probe() {
  PYTHONPATH="$MILES_ABS${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$@" <<'EOF'
import importlib, importlib.util, sys, types, logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
name = "sglang.srt.entrypoints.openai.encoding_dsv4"   # TEST-ONLY stub, see tests/support/miles_compat.py
try:
    have = importlib.util.find_spec(name) is not None
except ModuleNotFoundError:
    have = False
if not have:
    sys.modules[name] = types.ModuleType(name)
mods = [
    "miles.utils.types", "miles.utils.data", "miles.rollout.data_source", "miles.rollout.base_types",
    "miles.rollout.generate_hub.single_turn", "miles.rollout.generate_hub.multi_turn",
    "miles.rollout.generate_utils.generate_endpoint_utils", "miles.rollout.generate_utils.prefill_logprobs",
    "miles.rollout.generate_utils.sample_utils",
    "miles.rollout.inference_rollout.inference_rollout_common",
    "miles.rollout.inference_rollout.inference_rollout_train",
    "miles.rollout.inference_rollout.inference_rollout_eval",
    "miles.rollout.inference_rollout.compatibility",
    "miles.utils.processing_utils", "miles.utils.http_utils", "miles.utils.misc",
    "miles.utils.test_utils.mock_sglang_server",
]
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as e:  # noqa: BLE001
        bad.append(f"{m}: {type(e).__name__}: {e}")
verbose = "-v" in sys.argv
for b in bad:
    print("  FAIL", b, file=sys.stderr)
if verbose and not bad:
    print(f"  all {len(mods)} Miles modules import")
sys.exit(1 if bad else 0)
EOF
}

if probe 2>/dev/null; then
  log "Miles modules already import; nothing to install"
else
  if ! "$PY" -c "import sglang" >/dev/null 2>&1; then
    if [[ -f scripts/setup_peer_env.sh ]]; then
      log "sglang missing: running scripts/setup_peer_env.sh"
      bash scripts/setup_peer_env.sh "$PY"
    else
      log "sglang missing and scripts/setup_peer_env.sh absent; Miles' modules need sglang (--no-deps is enough)"
    fi
  fi
  CONSTRAINTS="$(mktemp)"
  trap 'rm -f "$CONSTRAINTS"' EXIT
  "$PY" - >"$CONSTRAINTS" <<'EOF'
import importlib.metadata as md
for p in ("torch", "torchvision", "transformers", "tokenizers", "numpy", "sglang"):
    try:
        print(f"{p}=={md.version(p)}")
    except md.PackageNotFoundError:
        pass
EOF
  # xgrammar: imported by sglang.srt.function_call (multi_turn, mock_sglang_server); use sglang's own pin.
  XGRAMMAR="$("$PY" - <<'EOF'
import importlib.metadata as md, re
try:
    reqs = md.requires("sglang") or []
except md.PackageNotFoundError:
    reqs = []
pins = [r.split(";")[0].strip() for r in reqs if re.match(r"xgrammar\b", r) and "extra ==" not in r]
print(pins[0].replace(" ", "") if pins else "xgrammar")
EOF
)"
  PKGS=(
    fastapi uvicorn httpx pybase64 aiohttp pydantic pyyaml jinja2 sympy pylatexenc openai
    setproctitle orjson           # sglang-router's deps (it is installed --no-deps below)
    "$XGRAMMAR"
  )
  log "installing (constrained): ${PKGS[*]}"
  "${PIP[@]}" install -c "$CONSTRAINTS" "${PKGS[@]}" 2>&1 | grep -vE "^WARNING: Location|which is not installed|which is incompatible|^ERROR: pip's dependency resolver" || true
  log "installing sglang-router==$SGLANG_ROUTER_VERSION --no-deps"
  "${PIP[@]}" install --no-deps "sglang-router==$SGLANG_ROUTER_VERSION" 2>&1 | grep -v "^WARNING: Location" || true
fi

# ---------------------------------------------------------------- 3. verify
if probe -v; then
  log "OK. Use: MILES_SRC=$MILES_ABS for the tests (PYTHONPATH=$MILES_ABS to import Miles)"
else
  log "some Miles modules still fail to import (see above)"
  exit 1
fi
