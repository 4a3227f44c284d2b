"""What vLLM's CPU kernels need from the processor, checked before a server starts.

vLLM CPU 0.32 holds an fp8 KV cache (``--kv-cache-dtype fp8``) only on an x86 CPU with
AVX-512 or AMX, and only for head sizes its fp8 path handles
(``vllm/v1/attention/backends/cpu_attn.py`` ``_get_attn_isa``: "FP8 KV cache on CPU requires
x86 with AVX-512 or AMX"; "FP8 KV cache requires head_size divisible by 32 on CPU"). It
says so in its engine process after about half a minute of start-up, and the API server's
own traceback hides it. Here the same rule is asked first, of the same torch calls vLLM
asks (``torch.cpu._is_avx512_supported``, ``torch.cpu._is_amx_tile_supported``) in the
serving runtime's own interpreter, so a release, a probe or a plan that asks for an fp8 KV
cache where it cannot be held gets one line that names the missing CPU feature, before
anything starts. On a GPU none of this applies.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from llm_release import paths
from llm_release.errors import ConfigError
from llm_release.fileio import atomic_write_json
from llm_release.hardware import Hardware

# The serving interpreter's answer to vLLM's own questions (one JSON line).
FEATURES_CODE = (
    "import json, platform, torch.cpu as c\n"
    "print(json.dumps({'machine': platform.machine(), "
    "'avx512': bool(c._is_avx512_supported()), 'amx': bool(c._is_amx_tile_supported())}))"
)


class CpuFeatures(BaseModel):
    """The features vLLM CPU's fp8 KV cache asks for, and who answered."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    machine: str
    avx512: bool
    amx: bool
    source: str


def from_host(host: Hardware) -> CpuFeatures:
    """From the CPU flags (``/proc/cpuinfo`` or ``LLM_RELEASE_CPU_FLAGS``): for a plan, which
    may be made for another host of the kind the flags describe."""
    return CpuFeatures(
        machine=host.machine,
        avx512="avx512f" in host.cpu.flags,
        amx="amx_tile" in host.cpu.flags or "amx_bf16" in host.cpu.flags,
        source="the CPU flags",
    )


def from_runtime(host: Hardware, python: Path | None = None) -> CpuFeatures:
    """From the serving runtime's torch, as vLLM itself will ask it (cached per host and
    interpreter: a torch import, a few seconds the first time)."""
    from llm_release.serving.dtype import cache_key, read_cache

    python = python or paths.vllm_python()
    cache = paths.probes_dir() / f"cpu-features-{cache_key(host.key(), str(python))[:16]}.json"
    cached = read_cache(cache)
    if cached is not None:
        try:
            return CpuFeatures.model_validate(cached)
        except ValueError:
            pass
    try:
        proc = subprocess.run(
            [str(python), "-P", "-c", FEATURES_CODE],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        answer = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        answer = None
    if not isinstance(answer, dict):
        # No runtime to ask (or it could not answer): the flags decide, as for a plan.
        return from_host(host)
    features = CpuFeatures(
        machine=str(answer.get("machine", host.machine)),
        avx512=answer.get("avx512") is True,
        amx=answer.get("amx") is True,
        source="the serving runtime's torch",
    )
    atomic_write_json(cache, features.model_dump())
    return features


def effective_kv_cache_dtype(kv_cache_dtype: str, extra_args: list[str]) -> str:
    """The KV dtype vLLM is asked for: the typed setting, or ``--kv-cache-dtype`` in the
    extra arguments (the config refuses both at once)."""
    value = kv_cache_dtype
    for i, arg in enumerate(extra_args):
        if arg == "--kv-cache-dtype" and i + 1 < len(extra_args):
            value = extra_args[i + 1]
        elif arg.startswith("--kv-cache-dtype="):
            value = arg.split("=", 1)[1]
    return value


def head_size(config: dict) -> int | None:
    """The attention head size of a config.json (its text part for multimodal ones)."""
    text = config.get("text_config") or config
    size = text.get("head_dim")
    if isinstance(size, int) and size > 0:
        return size
    hidden, heads = text.get("hidden_size"), text.get("num_attention_heads")
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def fp8_kv_refusal(
    kv_cache_dtype: str, features: CpuFeatures, head: int | None, cpu: str
) -> str | None:
    """Why vLLM CPU cannot hold this KV dtype here (vLLM 0.32's rule), or None when it can."""
    if not kv_cache_dtype.startswith("fp8"):
        return None
    if head is not None and head % 32 and head % 16 == 0:
        return (
            f"an fp8 KV cache on a CPU needs a head size divisible by 32 and this model's is "
            f"{head} (vLLM CPU's fp8 attention): set serving.kv_cache_dtype to auto"
        )
    x86 = features.machine.lower() in ("x86_64", "amd64", "i386", "i686")
    if x86 and (features.avx512 or features.amx):
        return None
    lacks = "AVX-512 and AMX" if x86 else f"an x86 CPU ({features.machine})"
    return (
        f"an fp8 KV cache on a CPU needs x86 with AVX-512 or AMX (vLLM CPU's fp8 attention), "
        f"and {cpu} lacks {lacks} ({features.source}): set serving.kv_cache_dtype to auto "
        "on this host"
    )


def check_kv_cache(
    kv_cache_dtype: str,
    extra_args: list[str],
    model_config: dict | None,
    host: Hardware,
    features: CpuFeatures | None = None,
) -> None:
    """ConfigError (one line) when a CPU host's vLLM cannot hold the KV dtype asked for;
    nothing on a GPU host. ``features``: None asks the serving runtime."""
    wanted = effective_kv_cache_dtype(kv_cache_dtype, extra_args)
    if host.cuda or not wanted.startswith("fp8"):
        return
    features = features or from_runtime(host)
    why = fp8_kv_refusal(
        wanted, features, head_size(model_config or {}), host.cpu.model_name or "this CPU"
    )
    if why:
        raise ConfigError(why)
