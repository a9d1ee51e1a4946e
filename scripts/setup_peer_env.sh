#!/usr/bin/env bash
# Install SGLang's Qwen-VL multimodal preprocessing into an existing venv, as a CPU test peer.
#
# Usage: scripts/setup_peer_env.sh [PYTHON]      (default: .venv/bin/python)
#
# What it does (idempotent; a second run is a quick no-op check):
#   1. sglang==$SGLANG_VERSION with --no-deps (its full dependency set is CUDA-only: flashinfer,
#      sglang-kernel, ...; none of it is needed for sglang.srt.multimodal.processors.qwen_vl).
#   2. The ~20 small packages that the qwen_vl import chain needs, installed WITH their deps but under a
#      constraints file that pins the venv's current torch / torchvision / transformers / tokenizers / numpy,
#      so pip can never replace them (it fails instead).
#   3. torchcodec with --no-deps (SGLang's video decoder uses torchcodec when importable, else decord).
#      Tries SGLang's pin first and falls back to older releases until one actually decodes a frame.
#   4. Verifies: the import works, the pinned packages are unchanged, torchcodec decodes.
#
# Env overrides: SGLANG_VERSION, TORCHCODEC_CANDIDATES ("0.17.0 0.16.0 ..."; "none" to skip torchcodec).
set -euo pipefail

PY="${1:-.venv/bin/python}"
SGLANG_VERSION="${SGLANG_VERSION:-0.5.23}"
TORCHCODEC_CANDIDATES="${TORCHCODEC_CANDIDATES:-0.17.0 0.16.0 0.15.0 0.14.0 0.13.0}"

# Versions pinned in sglang 0.5.23's own metadata where it pins them; the rest unpinned.
EXTRA_PKGS=(
  orjson psutil pybase64 requests starlette msgspec pyzmq IPython aiohttp dill
  "apache-tvm-ffi==0.1.11" "sentencepiece==0.2.1" "compressed-tensors==0.18.0" gguf
  "openai==2.8.0" partial_json_parser einops
)
# triton is also required by the import chain; CUDA torch 2.14.1 already brings triton 3.8.0 with it.

if [[ ! -x "$PY" ]]; then
  echo "setup_peer_env: python not found: $PY" >&2
  exit 2
fi
PIP=("$PY" -m pip --disable-pip-version-check)
T0=$(date +%s)

log() { echo "[setup_peer_env] $*"; }

# The probe sets SGLANG_USE_CPU_ENGINE only after import (setting it before import makes
# mem_cache/memory_pool import sgl_kernel).
probe_import() {
  "$PY" - <<'EOF' 2>/dev/null
import importlib.metadata as md, sys
import sglang.srt.multimodal.processors.qwen_vl  # noqa: F401
print(md.version("sglang"))
EOF
}

probe_torchcodec() {
  # Exit 0 only if torchcodec imports AND decodes a tiny in-memory video.
  "$PY" - <<'EOF' >/dev/null 2>&1
import io, av, numpy as np, torch
buf = io.BytesIO()
c = av.open(buf, "w", format="nut"); s = c.add_stream("ffv1", rate=2)
s.width, s.height, s.pix_fmt = 32, 32, "bgr0"
fr = np.random.default_rng(0).integers(0, 256, (2, 32, 32, 3), dtype=np.uint8)
for f in fr:
    for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")): c.mux(p)
for p in s.encode(): c.mux(p)
c.close()
from torchcodec.decoders import VideoDecoder
d = VideoDecoder(buf.getvalue(), dimension_order="NHWC")
out = d.get_frames_at(indices=[0, 1]).data
assert torch.equal(out, torch.from_numpy(fr)), "torchcodec decode not exact"
EOF
}

pinned_versions() {
  "$PY" - <<'EOF'
import importlib.metadata as md
for p in ("torch", "torchvision", "transformers", "tokenizers", "numpy"):
    try:
        print(f"{p}=={md.version(p)}")
    except md.PackageNotFoundError:
        pass
EOF
}

BEFORE="$(pinned_versions)"
CONSTRAINTS="$(mktemp /tmp/peer-constraints.XXXXXX.txt)"
trap 'rm -f "$CONSTRAINTS"' EXIT
printf '%s\n' "$BEFORE" > "$CONSTRAINTS"
log "pinned for this install: $(echo $BEFORE)"

CHANGED=0
# 1 + 2: sglang and the import chain.
if [[ "$(probe_import || true)" == "$SGLANG_VERSION" ]]; then
  log "sglang $SGLANG_VERSION qwen_vl already importable; skipping package install"
else
  CHANGED=1
  log "installing sglang==$SGLANG_VERSION --no-deps"
  "${PIP[@]}" install -q --no-deps "sglang==$SGLANG_VERSION"
  log "installing import-chain packages under constraints: ${EXTRA_PKGS[*]}"
  log "(pip will list sglang requirements that are deliberately not installed; that is expected)"
  "${PIP[@]}" install -q -c "$CONSTRAINTS" "${EXTRA_PKGS[@]}"
  got="$(probe_import || true)"
  if [[ "$got" != "$SGLANG_VERSION" ]]; then
    echo "setup_peer_env: import of sglang.srt.multimodal.processors.qwen_vl still fails:" >&2
    "$PY" -c "import sglang.srt.multimodal.processors.qwen_vl" >&2 || true
    exit 1
  fi
fi

# 3: torchcodec (optional; SGLang falls back to decord when it is missing).
if [[ "$TORCHCODEC_CANDIDATES" == "none" ]]; then
  log "torchcodec: skipped (TORCHCODEC_CANDIDATES=none)"
elif probe_torchcodec; then
  log "torchcodec already works: $("$PY" -c 'import importlib.metadata as m; print(m.version("torchcodec"))')"
else
  CHANGED=1
  ok=""
  for v in $TORCHCODEC_CANDIDATES; do
    log "trying torchcodec==$v --no-deps"
    if "${PIP[@]}" install -q --no-deps "torchcodec==$v" && probe_torchcodec; then
      ok="$v"; break
    fi
  done
  if [[ -z "$ok" ]]; then
    log "no torchcodec candidate works here; uninstalling it so SGLang falls back to decord"
    "${PIP[@]}" uninstall -y -q torchcodec || true
  else
    log "torchcodec $ok works"
  fi
fi

# 4: verify nothing pinned moved.
AFTER="$(pinned_versions)"
if [[ "$BEFORE" != "$AFTER" ]]; then
  echo "setup_peer_env: pinned packages changed!" >&2
  diff <(echo "$BEFORE") <(echo "$AFTER") >&2 || true
  exit 1
fi
CHECK_IMPORT="$CHANGED" "$PY" -W ignore - <<'EOF'
import importlib.metadata as md, os
vers = {p: md.version(p) for p in ("sglang", "torch", "torchvision", "transformers")}
try:
    vers["torchcodec"] = md.version("torchcodec")
except md.PackageNotFoundError:
    vers["torchcodec"] = None
if os.environ["CHECK_IMPORT"] == "1":  # something was installed: re-check the whole chain
    import sglang.srt.multimodal.processors.qwen_vl  # noqa: F401
    from sglang.srt.utils.video_decoder import _BACKEND as backend
else:
    backend = "torchcodec" if vers["torchcodec"] else "decord"
print("[setup_peer_env] OK", vers, "SGLang video backend:", backend)
EOF
log "done in $(( $(date +%s) - T0 )) s"
