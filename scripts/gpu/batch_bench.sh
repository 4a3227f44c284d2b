#!/usr/bin/env bash
# The seeds'-shape rows of issue 34, item 3 on the lent GPU: bench/gpu_batch_default.py's
# settings (vLLM's default, the project's default, the project's tuner) side by side on the
# full-size Qwen3-30B-A3B and Qwen3.5-35B-A3B shapes (--load-format dummy), in one session of
# one machine. Run as device_demo.sh's DEMO_CMD, after its 'make setup' (the pipeline's .venv
# with the host's CUDA torch, vLLM in .venv-vllm):
#
#   DEMO_CMD='bash scripts/gpu/batch_bench.sh' bash scripts/gpu/device_demo.sh go 575
#   bash scripts/gpu/device_demo.sh wait 580          (back to back, until it has ended)
#
# TUNE_SEQS, TUNE_BATCHED and TUNE_MAX pass the tuner's grid and its most server starts (the
# bench's --tune-seqs, --tune-batched, --tune-max-settings): on one H100 the hybrid shape's
# plan holds 238-242 state blocks, so the default grid's 256 and 1,024 do not fit there.
# Per shape, vLLM's default first (it takes the shape's cold compile, which is in no ratio),
# then the settings of SETTINGS_MOE / SETTINGS_HYBRID in order. Each row is appended to
# $WORK/batch.jsonl as it ends and the file is printed after each shape, so a cut session
# still brings back what has ended. Rows, every server's log and GuideLLM's logs stay under
# $LLM_RELEASE_HOME/bench-batch (device_demo.sh packs them into demo.tgz).
set -uo pipefail
ROOT=$(pwd)
export LLM_RELEASE_HOME=${LLM_RELEASE_HOME:-$ROOT/.llm-release}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
WORK=${WORK:-$LLM_RELEASE_HOME/bench-batch}
JSONL=$WORK/batch.jsonl
mkdir -p "$WORK"
T0=$(date +%s)
say() { echo "[batch_bench +$(($(date +%s) - T0))s] $*"; }

say "tokenizer: the demo model's, under $WORK/models"
.venv/bin/python - "$WORK" <<'EOF' || { say "tokenizer failed"; exit 3; }
import sys
from pathlib import Path

sys.path[:0] = ["scripts/gpu", "."]
from release_proof import models_for

print(models_for("smollm2", Path(sys.argv[1]), None)[1])
EOF
rc=0
for shape in ${SHAPES:-moe-full hybrid}; do
  if [ "$shape" = moe-full ]; then settings=${SETTINGS_MOE:-vllm-default,project-default,tuned}
  else settings=${SETTINGS_HYBRID:-vllm-default,tuned,project-default}; fi
  say "shape $shape: $settings"
  .venv/bin/python bench/gpu_batch_default.py --shape "$shape" --settings "$settings" \
    --requests "${REQUESTS:-100}" --work "$WORK" --jsonl "$JSONL" \
    ${TUNE_SEQS:+--tune-seqs "$TUNE_SEQS"} ${TUNE_BATCHED:+--tune-batched "$TUNE_BATCHED"} \
    ${TUNE_MAX:+--tune-max-settings "$TUNE_MAX"} || { rc=$?; say "$shape failed ($rc)"; }
  say "rows so far:"; cat "$JSONL" 2>/dev/null
done
mkdir -p bench/results && cp "$JSONL" bench/results/gpu-batch-default.jsonl 2>/dev/null
say "done"
exit "$rc"
