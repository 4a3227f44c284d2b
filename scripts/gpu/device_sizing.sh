#!/usr/bin/env bash
# Planner rows on the lent H200: vLLM started on a shape's config.json alone
# (--load-format dummy, no tokenizer), stopped once it has logged its KV-cache lines.
# Run from the repo root with the .gw bundle (scripts/gpu/build_carry.sh DEMO=1) brought by
# device_demo.sh stash trips, the last part with this call:
#
#   bash scripts/gpu/device_sizing.sh SHAPE:MAX_MODEL_LEN:UTIL[:FLAGS] ...
#   bash scripts/gpu/device_sizing.sh @scripts/gpu/sizing-matrix.rows   (one row a line)
#
# A row whose weights exceed the card at UTIL is skipped (logged), so one list serves an
# H100 (80 GB) and an H200 (141 GB). Rows already in $OUT/sizing.jsonl are not started
# again: a later call (back to back, /tmp kept) goes on where a cut one stopped.
#
# PEAK_TRACE=1 (the default) puts scripts/gpu/peak_trace on PYTHONPATH: each row also brings
# back <row>.peak.json, the tensors alive at the torch peak of vLLM's profile run; LOAD_TRACE=1
# adds <row>.load.json, what load_model keeps (parameters, buffers, caches) by allocating site.
#
# CALL_BUDGET_S (580) bounds the call: a row is begun only when its expected start time
# (EAGER_EST_S 110, GRAPHS_EST_S 180, from the H100's starts) still fits.
#
# SHAPE is a folder of scripts/gpu/shapes/. Each start's log comes back in $OUT/<row>.log and
# its KV lines in $OUT/sizing.jsonl, written as each start ends (a cut call keeps them).
set -uo pipefail
: "${OUT:=/tmp/out}"
S=/tmp/sizing  # kept between back-to-back calls; copied to $OUT as each row ends
mkdir -p "$S"
pkill -f vllm.entrypoints.openai 2>/dev/null; sleep 1  # a start a cut call left behind
ROOT=$(pwd)
mkdir -p "$OUT" /tmp/parts/gw
T0=$(date +%s)
log() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*" | tee -a "$S/steps.log"; }
for part in .gw/part.*; do [ -f "$part" ] && cp "$part" /tmp/parts/gw/; done
[ -f .gw/PARTS.sha256 ] && cp .gw/PARTS.sha256 /tmp/parts/gw/
if [ ! -f /tmp/gw/.unpacked ]; then
  (cd /tmp/parts/gw && sha256sum -c --quiet PARTS.sha256) || { log "bundle: parts missing"; exit 3; }
  mkdir -p /tmp/gw && cat /tmp/parts/gw/part.* | xz -dc -T0 | tar -x -C /tmp/gw &&
    touch /tmp/gw/.unpacked || { log "bundle: unpack failed"; exit 3; }
  log "bundle: $(ls /tmp/gw/wh/*.whl | wc -l) wheels"
fi
if [ ! -x .venv-vllm/bin/python ]; then
  bash scripts/setup.sh --only serving --host-torch --wheelhouse /tmp/gw/wh --vllm-deps lean \
    > "$S/setup.log" 2>&1 || { log "setup failed"; tail -n 30 "$S/setup.log"; exit 4; }
  log "setup: $(.venv-vllm/bin/python -c 'import vllm, torch; print(vllm.__version__, torch.__version__)')"
fi
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 PYTHONUNBUFFERED=1
# DEBUG: vLLM's profiling breakdown (weights, torch peak, non-torch, CUDA-graph estimate)
export VLLM_LOGGING_LEVEL=DEBUG
[ -f "$S/device.json" ] || .venv-vllm/bin/python -c '
import json, torch
p = torch.cuda.get_device_properties(0)
print(json.dumps({"name": p.name, "total_memory": p.total_memory, "capability": list(torch.cuda.get_device_capability(0))}))' \
  > "$S/device.json" 2>/dev/null
# a row's traces beside its log: <row>.peak.json (profile_run), <row>.load.json (load_model)
bring_traces() {
  local f
  for f in "$S/peak/$1"/peak-*.json; do [ -f "$f" ] && cp "$f" "$S/$1.peak.json"; done
  for f in "$S/peak/$1"/kept-*.json; do [ -f "$f" ] && cp "$f" "$S/$1.load.json"; done
}
ROW_LIMIT_S=${ROW_LIMIT_S:-300}
rows=()
for arg in "$@"; do
  if [[ $arg == @* ]]; then mapfile -t -O "${#rows[@]}" rows < <(grep -v '^#' "${arg#@}" | grep .);
  else rows+=("$arg"); fi
done
total=$(.venv-vllm/bin/python -c 'import json,sys; print(json.load(open(sys.argv[1]))["total_memory"])' "$S/device.json")
for row in "${rows[@]}"; do
  IFS=: read -r shape len util flags <<< "$row"
  name="${shape}-${len}-${util}${flags:+-$(echo "$flags" | tr -c 'a-z0-9' '_')}"
  grep -q "\"row\": \"$name\"" "$S/sizing.jsonl" 2>/dev/null && { log "have $name"; continue; }
  weights=$(.venv-vllm/bin/python -c 'import json,sys; t=json.load(open(sys.argv[1])); import math; print(sum(math.prod(s)*{"BF16":2,"F16":2,"F32":4,"F8_E4M3":1,"I32":4,"I64":8}[d] for d,s in t.values()))' "tests/unit/data/gpu/shapes/$shape.tensors.json")
  if [ "$(.venv-vllm/bin/python -c "print(int($weights + 2*2**30 > $util * $total))")" = 1 ]; then
    log "skip $name: weights $((weights / 2**30)) GiB + 2 GiB exceed $util of the card"; continue
  fi
  # A start the call cannot finish is not begun: a row cut by the call's limit is lost.
  est=$([[ $flags == *--enforce-eager* ]] && echo "${EAGER_EST_S:-110}" || echo "${GRAPHS_EST_S:-180}")
  if [ $(($(date +%s) - T0 + est)) -gt "${CALL_BUDGET_S:-580}" ]; then
    log "stop before $name: ${est} s expected, $(($(date +%s) - T0)) s of ${CALL_BUDGET_S:-580} used"; break
  fi
  log "start $name"
  # shellcheck disable=SC2086
  trace=()
  if [ "${PEAK_TRACE:-1}" = 1 ]; then  # the live tensors at the profile's torch peak
    mkdir -p "$S/peak/$name"
    trace=(env "PYTHONPATH=$ROOT/scripts/gpu/peak_trace" "LLM_RELEASE_PEAK_TRACE=$S/peak/$name"
      "LLM_RELEASE_LOAD_TRACE=${LOAD_TRACE:-}")
  fi
  setsid "${trace[@]}" .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
    --model "$ROOT/scripts/gpu/shapes/$shape" --load-format dummy --skip-tokenizer-init \
    --max-model-len "$len" --gpu-memory-utilization "$util" --port 8199 $flags \
    > "$S/$name.log" 2>&1 &
  pid=$!
  t0=$(date +%s)
  until grep -q "Maximum concurrency" "$S/$name.log" || ! kill -0 $pid 2>/dev/null ||
    [ $(($(date +%s) - t0)) -gt "$ROW_LIMIT_S" ]; do sleep 2; done
  kill -- -$pid 2>/dev/null; sleep 3; kill -9 -- -$pid 2>/dev/null; wait $pid 2>/dev/null
  line=$(grep -E "KV cache size|Maximum concurrency|Available KV cache memory|GPU blocks|Model loading took|torch peak|non-torch|CUDA graph|cudagraph memory|Memory profiling|Total non KV|is equivalent to|Setting attention block size|Initializing a V1|Error|error:" "$S/$name.log" | grep -v "^DEBUG.*Traceback" | tr '\n' ' ' | cut -c1-3000)
  printf '{"row": "%s", "shape": "%s", "max_model_len": %s, "gpu_memory_utilization": %s, "flags": "%s", "lines": "%s"}\n' \
    "$name" "$shape" "$len" "$util" "$flags" "$(echo "$line" | tr -d '"\\')" >> "$S/sizing.jsonl"
  bring_traces "$name"
  rsync -a --exclude peak "$S/" "$OUT/" 2>/dev/null || cp "$S"/*.* "$OUT/"
  log "done $name: $(grep -o 'KV cache size: [0-9,]* tokens' "$S/$name.log" | head -1)"
done
for d in "$S"/peak/*/; do [ -d "$d" ] && bring_traces "$(basename "$d")"; done
rsync -a --exclude peak "$S/" "$OUT/" 2>/dev/null || cp "$S"/*.* "$OUT/"
# A call brings back at most 8 files: everything of /tmp/sizing in one archive as well.
tar -czf /tmp/sizing.tgz -C "$S" --exclude ./peak . && rm -rf "${OUT:?}"/* &&
  cp /tmp/sizing.tgz "$S/steps.log" "$S/sizing.jsonl" "$OUT/"
