#!/usr/bin/env bash
# Make Miles (radixark/miles) importable on CPU for vidcache's miles_integration tests.
#
# Usage: scripts/setup_miles.sh [PYTHON]        (default: .venv/bin/python)
#   env: MILES_SRC     checkout location            (default: third_party/miles, gitignored)
#        MILES_COMMIT  commit to check out           (default: the audited one below, if the mirror has it)
#        MILES_MIRROR  a git dir / repo to clone from (default: first of /work/.mirror/radixark+miles*)
#
# Idempotent. Steps:
#   1. If $MILES_SRC has no checkout, clone one from a local mirror (never from the network).
#      No mirror -> print a message and exit 0, so Miles tests skip.
#   2. Miles is NOT pip-installed; use it with PYTHONPATH=$MILES_SRC. Only the few extra PyPI packages
#      its rollout-side modules import are installed, under a constraints file that pins the venv's
#      torch / torchvision / transformers / tokenizers / numpy / sglang (pip fails rather than replace them).
#      sglang itself comes from scripts/setup_peer_env.sh (sglang --no-deps + its small deps); it is run
#      here if sglang is missing. sglang-router is installed --no-deps (its deps are listed explicitly).
#   3. Verify that the Miles modules vidcache uses import (with the test-only encoding_dsv4 stub, see
#      tests/miles_smoke_example.py::install_miles_test_shims).
set -euo pipefail

cd "$(dirname "$0")/.."
REPO="$PWD"
PY="${1:-.venv/bin/python}"
MILES_SRC="${MILES_SRC:-third_party/miles}"
MILES_COMMIT="${MILES_COMMIT:-31f1ca961a94cb860cec3b2dea34ec332bfa8f76}"   # 2026-08-21, audited in third_party/MILES_API.md
SGLANG_ROUTER_VERSION="${SGLANG_ROUTER_VERSION:-0.3.2}"

log() { echo "[setup_miles] $*"; }

# ---------------------------------------------------------------- 1. checkout
if [[ -f "$MILES_SRC/miles/__init__.py" ]]; then
  log "checkout present: $MILES_SRC ($(git -C "$MILES_SRC" log -1 --format='%h %cs' 2>/dev/null || echo 'not a git checkout'))"
else
  MIRROR="${MILES_MIRROR:-}"
  if [[ -z "$MIRROR" ]]; then
    for cand in /work/.mirror/radixark+miles*; do
      [[ -e "$cand" ]] || continue
      if [[ -d "$cand/repo" ]]; then MIRROR="$cand/repo"; else MIRROR="$cand"; fi
      break
    done
  fi
  mirror_ok() {
    [[ -n "$MIRROR" ]] && { git --git-dir="$MIRROR" rev-parse --verify -q HEAD >/dev/null 2>&1 \
      || git -C "$MIRROR" rev-parse --verify -q HEAD >/dev/null 2>&1; }
  }
  if ! mirror_ok; then
    log "no Miles checkout at $MILES_SRC and no local mirror (/work/.mirror/radixark+miles*)."
    log "Miles tests will be skipped. To enable them, put a checkout at \$MILES_SRC."
    exit 0
  fi
  log "cloning $MIRROR -> $MILES_SRC"
  mkdir -p "$(dirname "$MILES_SRC")"
  git clone -q --shared --no-checkout "$MIRROR" "$MILES_SRC"
  if git -C "$MILES_SRC" cat-file -e "${MILES_COMMIT}^{commit}" 2>/dev/null; then
    git -C "$MILES_SRC" checkout -q --detach "$MILES_COMMIT"
  else
    log "commit $MILES_COMMIT not in mirror; using the mirror's HEAD (API may differ from MILES_API.md)"
    git -C "$MILES_SRC" checkout -q --detach HEAD
  fi
  log "checked out $(git -C "$MILES_SRC" log -1 --format='%H %ci')"
fi
MILES_ABS="$(cd "$MILES_SRC" && pwd)"

if [[ ! -x "$PY" ]]; then
  log "python not found: $PY (create the venv first); skipping package install"
  exit 0
fi
PIP=("$PY" -m pip --disable-pip-version-check -q)

# ---------------------------------------------------------------- 2. packages
# The import check used both to decide whether to install and to verify afterwards.
probe() {
  PYTHONPATH="$MILES_ABS${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$@" <<'EOF'
import importlib, importlib.util, sys, types, logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
name = "sglang.srt.entrypoints.openai.encoding_dsv4"   # TEST-ONLY stub, see tests/miles_smoke_example.py
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
  log "OK. Use: PYTHONPATH=$MILES_SRC (commit $(git -C "$MILES_SRC" log -1 --format=%h 2>/dev/null || echo '?'))"
else
  log "some Miles modules still fail to import (see above)"
  exit 1
fi
