#!/usr/bin/env bash
# The demo's two config files for this host, printed as "RELEASE UPDATE" (make demo):
#   cpu (configs/demo.json, configs/demo-update.json): the serving virtualenv is vLLM CPU;
#   gpu (configs/demo-gpu.json, configs/demo-gpu-update.json: the gpu_host sizing at a third
#       of a GPU with the demo's approvals): setup made it for CUDA (its llm-release-flavour
#       file says gpu or host-torch). One GPU is enough: the stable release, its canary and a
#       measured candidate share it (the GPU ledger's shares, serving/gpus.py).
# DEMO_CONFIG=FILE DEMO_UPDATE_CONFIG=FILE choose others.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=cpu
[ ! -f .venv-vllm/llm-release-flavour ] || flavour=$(cat .venv-vllm/llm-release-flavour)
case "$flavour" in
  gpu | host-torch)
    release=configs/demo-gpu.json update=configs/demo-gpu-update.json
    gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU [0-9]' || true)
    if [ -z "${DEMO_CONFIG:-}" ] && [ "$gpus" -lt 1 ]; then
      echo "demo: the serving runtime is CUDA vLLM ($flavour), and nvidia-smi lists no GPU: check the NVIDIA driver, run 'make setup TARGET=cpu' for the CPU demo, or give DEMO_CONFIG=FILE DEMO_UPDATE_CONFIG=FILE" >&2
      exit 1
    fi
    ;;
  *) release=configs/demo.json update=configs/demo-update.json ;;
esac
echo "${DEMO_CONFIG:-$release} ${DEMO_UPDATE_CONFIG:-$update}"
