#!/usr/bin/env bash
# The tuner against the exhaustive grid (and, on request, vLLM's own defaults) on the lent
# GPU (issue 34, item 4), in one session of one machine. Run as device_demo.sh's DEMO_CMD, after
# its 'make setup' (the pipeline's .venv with the host's CUDA torch, vLLM in .venv-vllm):
#
#   DEMO_CMD='bash scripts/gpu/tune_bench.sh' bash scripts/gpu/device_demo.sh go 575
#   bash scripts/gpu/device_demo.sh wait 580          (back to back, until it has ended)
#
# The model is the random-weight 2.45B Llama of release_proof.py (built on the GPU in
# seconds, the demo model's tokenizer), bf16, max_model_len 4096, prompts of 512 tokens and
# 128 output tokens at 50 / 100 / 200 streams, SLO TTFT p95 1 s and ITL p95 10 ms: the levels
# and SLO of 2026-12-03's defaults-and-coordinate run (docs/gpu-serving-2026-12-03), which
# separated the settings there.
#
# The grid is 3 x 3 (max_num_seqs 64 / 128 / 1024 x max_num_batched_tokens 1024 / 2048 /
# vLLM's, 8192 on a GPU of 70 GiB or more), 100 requests a level, and the strategies are the
# coordinate search then the exhaustive sweep: on 2026-12-06's 2 x 2 grid (SEQS=128,1024
# BATCHED=2048,default REQUESTS=200 STRATEGIES='defaults coordinate exhaustive', 19 minutes)
# the search started 3 of 4 settings, so no time ratio near a third could show. Expected on
# an H100: 9 starts of ~80-140 s and 27 levels for the sweep, 3-5 starts for the search,
# about 25 minutes with setup: more than one session's device time once the machine's start
# and the parts' trips are counted; cut the grid (SEQS, BATCHED) for a shorter session.
#
# Order (with STRATEGIES='defaults coordinate exhaustive'): vLLM's defaults first (the cold
# start after setup is billed to it, and its time is in no ratio), then the coordinate
# search, then the exhaustive sweep. The sweep starts the settings the search already
# compiled with vLLM's compile cache warm, so the time ratio is, if anything, in the sweep's
# favour. Each strategy is its own bench call and the
# results file is printed after each, so a cut session still brings back what has ended.
# Results and every server's log go under $LLM_RELEASE_HOME/bench-tune (device_demo.sh packs
# them into demo.tgz).
set -uo pipefail
ROOT=$(pwd)
export LLM_RELEASE_HOME=${LLM_RELEASE_HOME:-$ROOT/.llm-release}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
WORK=${WORK:-/tmp/proof}
RESULT=$LLM_RELEASE_HOME/bench-tune/${TUNE_RESULT:-tune_goodput-gpu.json}
mkdir -p "$WORK" "$(dirname "$RESULT")"
T0=$(date +%s)
say() { echo "[tune_bench +$(($(date +%s) - T0))s] $*"; }

say "model: the random 2.45B Llama under $WORK/models"
.venv/bin/python - "$WORK" <<'EOF' || { say "model build failed"; exit 3; }
import sys
from pathlib import Path

sys.path[:0] = ["scripts/gpu", "."]
from release_proof import models_for

models_for("smollm2", Path(sys.argv[1]), None)  # the tokenizer the random model takes
print(models_for("dense", Path(sys.argv[1]), None))
EOF
ARGS=(--gpu --model-dir "$WORK/models/llama-2.5b-random" --seqs "${SEQS:-64,128,1024}"
  --batched "${BATCHED:-1024,2048,default}" --levels "${LEVELS:-50,100,200}" --requests "${REQUESTS:-100}"
  --prompt-tokens 512 --output-tokens 128 --max-model-len 4096
  --ttft-slo-s "${TTFT_SLO_S:-1.0}" --itl-slo-ms "${ITL_SLO_MS:-10}" --output "$RESULT" --skip-warmup)
rc=0
for strategy in ${STRATEGIES:-coordinate exhaustive}; do
  say "strategy $strategy"
  .venv/bin/python bench/tune_goodput.py "${ARGS[@]}" --strategies "$strategy" || { rc=$?; say "$strategy failed ($rc)"; }
  say "results so far:"; cat "$RESULT" 2>/dev/null
done
say "done"
exit "$rc"
