#!/usr/bin/env bash
# The demo's two config files for this host, printed as "RELEASE UPDATE" (make demo):
#   cpu (configs/demo.json, configs/demo-update.json): the serving virtualenv is vLLM CPU;
#   gpu (configs/demo-gpu.json, configs/demo-gpu-update.json: the gpu_host sizing with the
#       demo's approvals): setup made it for CUDA (its llm-release-flavour file says gpu or
#       host-torch). The GPU demo needs two GPUs: the update's canary serves on one while the
#       stable release holds the other (the GPU ledger gives each server GPUs of its own).
# DEMO_CONFIG=FILE DEMO_UPDATE_CONFIG=FILE choose others.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=cpu
[ ! -f .venv-vllm/llm-release-flavour ] || flavour=$(cat .venv-vllm/llm-release-flavour)
case "$flavour" in
  gpu | host-torch)
    release=configs/demo-gpu.json update=configs/demo-gpu-update.json
    if [ -z "${DEMO_CONFIG:-}" ]; then
      gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU [0-9]' || true)
      if [ "$gpus" -lt 2 ]; then
        echo "demo: the serving runtime is CUDA vLLM ($flavour), and the GPU demo needs 2 GPUs (the stable release on one, the update's canary on the other); nvidia-smi lists $gpus: run it on a host with two, or give DEMO_CONFIG=FILE DEMO_UPDATE_CONFIG=FILE" >&2
        exit 1
      fi
    fi
    ;;
  *) release=configs/demo.json update=configs/demo-update.json ;;
esac
echo "${DEMO_CONFIG:-$release} ${DEMO_UPDATE_CONFIG:-$update}"
