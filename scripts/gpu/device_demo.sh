#!/usr/bin/env bash
# `make setup` then `make demo` on the lent GPU machine (no registry, no apt there), run from
# the repo root with what scripts/gpu/build_carry.sh put in .gw/ taken along:
#
#   bash scripts/gpu/device_demo.sh stash          a trip that only brings parts (.gw/part.NN)
#   bash scripts/gpu/device_demo.sh go SECONDS     the last parts; then: check and unpack the
#        bundle (the wheelhouse of 'make wheelhouse HOST_PACKAGES=scripts/gpu/image_freeze.txt
#        VLLM_DEPS=lean', vLLM slimmed to sm_90; HAProxy, Prometheus and Alertmanager as
#        Debian packages), unpack the packages without apt into /tmp/debroot and put them on
#        PATH, 'make setup WHEELHOUSE=/tmp/gw/wh HOST_TORCH=1 VLLM_DEPS=lean', and start
#        'make demo' in its own session; wait for it up to SECONDS
#   bash scripts/gpu/device_demo.sh wait SECONDS   wait for the demo again (a later trip)
#
# TGZ=1: demo.tgz comes back even while the demo runs (a last trip, with the device time out).
# DEMO_CMD='...' runs instead of 'make demo' (e.g. a bench first: 'python bench/... ; make demo');
# bench/results/*.jsonl come back with the rest.
# DEMO_CONFIG=FILE DEMO_UPDATE_CONFIG=FILE (make demo's own knobs) pass through: on
# 2026-12-05, with too little device time left for the whole demo, both were
# configs/demo-gpu-update.json (no quantized candidates) to run promote, the canary walk and
# the update on the GPU.
#
# Every trip sends back steps.log, the demo's log so far and, once it has ended, demo.tgz
# (the release's and the update's results, reports, the worker's and every vLLM's log).
# /tmp is kept only between back-to-back trips (the machine's 30 s warm window); the demo
# runs on between them (setsid), so trips must follow each other.
set -uo pipefail
: "${OUT:=/tmp/out}"
mode=${1:?usage: device_demo.sh stash|go SECONDS|wait SECONDS}
limit=${2:-0}
ROOT=$(pwd)
mkdir -p "$OUT" /tmp/parts/gw /tmp/demo
T0=$(date +%s)
log() { echo "[$(date -u +%H:%M:%S) +$(($(date +%s) - T0))s] $*" | tee -a /tmp/demo/steps.log; }

for part in .gw/part.*; do [ -f "$part" ] && cp "$part" /tmp/parts/gw/; done
[ -f .gw/PARTS.sha256 ] && cp .gw/PARTS.sha256 /tmp/parts/gw/
log "$mode: parts here: $(cd /tmp/parts/gw && ls part.* 2>/dev/null | tr '\n' ' ')"

# The demo's log so far, copied to $OUT every minute of a wait: a trip cut by the device's
# limit (or its session's device time running out) still brings back how far it got.
snapshot() {
  cp /tmp/demo/steps.log "$OUT/" 2>/dev/null
  [ -f /tmp/demo/demo.log ] && tr '\r' '\n' < /tmp/demo/demo.log | grep -v -E 'it/s\]|s/it\]' > "$OUT/demo.log"
}

finish() {
  snapshot
  [ -f /tmp/demo/setup.log ] && cp /tmp/demo/setup.log "$OUT/"
  cp "$ROOT"/bench/results/*.jsonl "$OUT/" 2>/dev/null
  if [ -f /tmp/demo/rc ] || [ -n "${TGZ:-}" ]; then
    # results, reports, logs and configs; no model files (TGZ=1: also while it runs)
    (cd "$ROOT" && find .llm-release .setup-logs -type f -size -8M \( -name '*.log' -o \
      -name '*.json' -o -name '*.jsonl' -o -name '*.md' -o -name '*.cfg' -o -name '*.yml' \) \
      -not -path '.llm-release/models/*' -not -path '.llm-release/candidates/*' -not -path '.llm-release/hub/*' -not -name 'config.json' \
      -not -name 'tokenizer*.json' -not -path '*/prefect/*' | tar -czf "$OUT/demo.tgz" -T -) 2>/dev/null
    ls -la "$OUT/demo.tgz" >> /tmp/demo/steps.log
  fi
  nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader >> "$OUT/steps.log"
}

wait_demo() {
  local until=$(($(date +%s) + limit)) next=0
  while [ ! -f /tmp/demo/rc ] && [ "$(date +%s)" -lt "$until" ]; do
    if [ "$(date +%s)" -ge "$next" ]; then snapshot; next=$(($(date +%s) + 60)); fi
    sleep 5
  done
  if [ -f /tmp/demo/rc ]; then log "demo ended with $(cat /tmp/demo/rc)"; else log "demo still running"; fi
  tail -n 25 /tmp/demo/demo.log 2>/dev/null | tr '\r' '\n' | grep -v 'it/s' | cut -c1-300
}

# stopped from outside (the call's limit): what there is so far goes back
trap 'log "stopped by a signal"; TGZ=1 finish; exit 143' TERM INT
if [ "$mode" = stash ]; then finish; exit 0; fi
if [ "$mode" = wait ]; then wait_demo; finish; exit 0; fi
[ "$mode" = go ] || { echo "unknown mode $mode"; exit 2; }

# --- the bundle: every part checked, then unpacked once --------------------------------------
if [ ! -f /tmp/gw/.unpacked ]; then
  (cd /tmp/parts/gw && sha256sum -c --quiet PARTS.sha256) ||
    { log "bundle: parts missing or damaged"; finish; exit 3; }
  mkdir -p /tmp/gw && cat /tmp/parts/gw/part.* | xz -dc -T0 | tar -x -C /tmp/gw &&
    touch /tmp/gw/.unpacked || { log "bundle: unpack failed"; finish; exit 3; }
  log "bundle: $(ls /tmp/gw/wh/*.whl | wc -l) wheels, $(ls /tmp/gw/debs/*.deb | wc -l) Debian packages"
fi
# --- HAProxy, Prometheus, Alertmanager: the Debian packages unpacked without apt ------------
if [ ! -f /tmp/debroot/.done ]; then
  for deb in /tmp/gw/debs/*.deb; do dpkg -x "$deb" /tmp/debroot; done
  mkdir -p /tmp/debbin
  # haproxy needs Lua and OpenTracing's libraries (the image lacks them): its own path only
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/debroot/usr/lib/x86_64-linux-gnu exec /tmp/debroot/usr/sbin/haproxy "$@"\n' \
    > /tmp/debbin/haproxy
  chmod +x /tmp/debbin/haproxy
  for b in prometheus promtool prometheus-alertmanager amtool; do
    ln -sf /tmp/debroot/usr/bin/$b /tmp/debbin/$b
  done
  # Debian's Alertmanager reads its default notification template from a path compiled in
  # (/usr/share/prometheus/alertmanager/default.tmpl): the 2026-12-04 run's promote stopped on
  # it ("failed to parse templates"); one link, nothing else under /usr
  [ -e /usr/share/prometheus ] || ln -s /tmp/debroot/usr/share/prometheus /usr/share/prometheus
  touch /tmp/debroot/.done
  log "debs: $(/tmp/debbin/haproxy -v | head -1); $(/tmp/debbin/prometheus --version 2>&1 | head -1)"
fi
export PATH=/tmp/debbin:$PATH
# no NVLink multicast (KINDS.md); FlashInfer is left out of the lean runtime
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1

# --- make setup, then make demo in its own session ------------------------------------------
if [ ! -f /tmp/demo/started ]; then
  log "make setup WHEELHOUSE=/tmp/gw/wh HOST_TORCH=1 VLLM_DEPS=lean"
  if ! make setup WHEELHOUSE=/tmp/gw/wh HOST_TORCH=1 VLLM_DEPS=lean > /tmp/demo/setup.log 2>&1; then
    log "make setup failed"; tail -n 40 /tmp/demo/setup.log; finish; exit 4
  fi
  log "$(grep -E '^setup: (branch|host torch|done|[0-9]+ s)' /tmp/demo/setup.log | tr '\n' ' ' | cut -c1-600)"
  touch /tmp/demo/started
  cmd=${DEMO_CMD:-make demo}
  log "$cmd (in its own session)${DEMO_CONFIG:+ DEMO_CONFIG=$DEMO_CONFIG}${DEMO_UPDATE_CONFIG:+ DEMO_UPDATE_CONFIG=$DEMO_UPDATE_CONFIG}"
  setsid bash -c "$cmd"' > /tmp/demo/demo.log 2>&1; echo $? > /tmp/demo/rc' < /dev/null &
fi
wait_demo
finish
