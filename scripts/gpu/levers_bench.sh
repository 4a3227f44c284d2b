#!/usr/bin/env bash
# The seeds' hand levers measured on the lent GPU (issue 38, item 3), in one session of one
# machine. Run as device_demo.sh's DEMO_CMD, after its 'make setup' (the pipeline's .venv with
# the host's CUDA torch, vLLM in .venv-vllm):
#
#   DEMO_CMD='bash scripts/gpu/levers_bench.sh' bash scripts/gpu/device_demo.sh go 460
#   bash scripts/gpu/device_demo.sh wait 580          (back to back, until it has ended)
#
# 1. prefix: the demo model with its real weights (SmolLM2-135M-Instruct, bf16, compiled and
#    graph-captured), prefix caching on and off, under the shipped GPU profile's sharing
#    (90% of the requests behind one of 4 system prompts of 1,024 tokens; 512 + 256 tokens
#    of their own), 10 / 50 / 100 streams: the tuner's exhaustive sweep, so every setting
#    is measured at every level, and its choice.
# 2. speculation: the same model with no speculation and prompt lookup (ngram, 3 and 5
#    drafted tokens), under the manufacturing eval set's own prompts (passages asked about:
#    what prompt lookup can copy from), the same levels; the tuner's greedy-answer check
#    decides whether a setting with speculation may be chosen at all.
# 3. mtp-memory: the Qwen3.5 MoE 16-layer shape with one MTP layer, --load-format dummy,
#    served without speculation and with its MTP head: the plan's KV
#    cache beside vLLM's (scripts/gpu/speculation_memory.py). No speed figure: dummy
#    weights accept no drafts.
# SLO for 1 and 2: the seeds' TTFT p95 3.8 s, ITL p95 100 ms. PARTS picks parts (default all
# three); each part's results are printed as it ends, so a cut session keeps what has ended.
# Results and every server's log stay under $LLM_RELEASE_HOME/bench-levers (device_demo.sh
# packs them into demo.tgz).
set -uo pipefail
ROOT=$(pwd)
export LLM_RELEASE_HOME=${LLM_RELEASE_HOME:-$ROOT/.llm-release}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
WORK=${WORK:-$LLM_RELEASE_HOME/bench-levers}
mkdir -p "$WORK"
T0=$(date +%s)
say() { echo "[levers_bench +$(($(date +%s) - T0))s] $*"; }

say "the demo model's real weights under $WORK/models"
MODEL=$(.venv/bin/python - "$WORK" <<'EOF'
import sys
from pathlib import Path

sys.path[:0] = ["scripts/gpu", "."]
from release_proof import models_for

print(models_for("smollm2", Path(sys.argv[1]), None)[1])
EOF
) || { say "model conversion failed"; exit 3; }
say "model: $MODEL"
COMMON=(--gpu --model-dir "$MODEL" --seqs 256 --levels "${LEVELS:-10,50,100}"
  --requests "${REQUESTS:-100}" --max-model-len 4096 --ttft-slo-s 3.8 --itl-slo-ms 100
  --strategies exhaustive --skip-warmup)
rc=0
for part in ${PARTS:-prefix speculation mtp-memory}; do
  say "part $part"
  case $part in
    prefix)
      .venv/bin/python bench/tune_goodput.py "${COMMON[@]}" --prefix-caching on,off \
        --shared-prefix 1024:0.9:4 --prompt-tokens 512 --output-tokens 256 \
        --output "$WORK/prefix.json" > "$WORK/prefix.log" 2>&1 || { rc=$?; say "prefix failed ($rc)"; }
      cat "$WORK/prefix.log" | grep -v -E 'it/s\]|s/it\]' | tail -n 40 ;;
    speculation)
      .venv/bin/python bench/tune_goodput.py "${COMMON[@]}" --speculation none,ngram:3:4,ngram:5:4 \
        --prompts-from manufacturing_kb --output-tokens 128 \
        --output "$WORK/speculation.json" > "$WORK/speculation.log" 2>&1 || { rc=$?; say "speculation failed ($rc)"; }
      cat "$WORK/speculation.log" | grep -v -E 'it/s\]|s/it\]' | tail -n 40 ;;
    mtp-memory)
      VLLM_LOGGING_LEVEL=DEBUG .venv/bin/python scripts/gpu/speculation_memory.py --tokenizer "$MODEL" \
        --work "$WORK/mtp" --jsonl "$WORK/mtp-memory.jsonl" --speculation none,mtp:1 \
        || { rc=$?; say "mtp-memory failed ($rc)"; } ;;
    *) say "unknown part $part"; rc=2 ;;
  esac
done
mkdir -p bench/results
cp "$WORK"/*.jsonl bench/results/ 2>/dev/null
say "done"
exit "$rc"
