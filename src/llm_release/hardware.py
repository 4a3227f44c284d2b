"""What this host can compute fast: the CPU's instruction sets, native bf16, accelerators.

Machines of one kind differ by an order of magnitude here. On an AVX2-only CPU (no
AVX-512, no native bf16) one core multiplies bf16 matrices at about 1.2 GFLOP/s and float32
at about 78 GFLOP/s (measured on such a machine, 2026-11), so CPU-side model math there must
run in float32; on a CPU with AVX512_BF16 or AMX bf16 is native. The capabilities are read
once and recorded with every run, so a figure in a report always names the CPU it came from.
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llm_release.settings import settings

CPUINFO = Path("/proc/cpuinfo")

# The flags that decide which kernels run, strongest first.
ISA_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx512_vnni", "avx2", "fma")

Isa = Literal["AMX", "AVX512_BF16", "AVX512", "AVX2", "baseline"]


class CpuInfo(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str
    cores: int = Field(description="cores this process may use")
    flags: list[str] = Field(description="the instruction-set flags that matter, present ones")

    @property
    def native_bf16(self) -> bool:
        """bf16 matrix math in hardware (AVX512_BF16 or AMX); else it is emulated, ~60x slower."""
        return "avx512_bf16" in self.flags or "amx_bf16" in self.flags

    @property
    def isa(self) -> Isa:
        if "amx_bf16" in self.flags:
            return "AMX"
        if "avx512_bf16" in self.flags:
            return "AVX512_BF16"
        if "avx512f" in self.flags:
            return "AVX512"
        if "avx2" in self.flags:
            return "AVX2"
        return "baseline"

    def describe(self) -> str:
        bf16 = "native bf16" if self.native_bf16 else "no native bf16"
        return f"{self.model_name} ({self.isa}, {bf16}, {self.cores} cores)"


class Hardware(BaseModel):
    """The host a stage runs on, as recorded in manifests, quantization records and reports."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: CpuInfo
    machine: str = Field(description="platform.machine(), e.g. x86_64")
    gpus: list[str] = Field(default_factory=list, description="CUDA device names, if any")

    @property
    def cuda(self) -> bool:
        return bool(self.gpus)

    def describe(self) -> str:
        gpus = f"; GPUs: {', '.join(self.gpus)}" if self.gpus else "; no GPU"
        return self.cpu.describe() + gpus

    def key(self) -> str:
        """What a cached measurement of this host depends on."""
        return "|".join([self.machine, self.cpu.model_name, *self.cpu.flags, *self.gpus])


def parse_cpuinfo(text: str, cores: int) -> CpuInfo:
    """The first processor's model name and the ISA flags that matter, from /proc/cpuinfo."""
    model_name = "unknown CPU"
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model_name == "unknown CPU":
            model_name = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return CpuInfo(model_name=model_name, cores=cores, flags=[f for f in ISA_FLAGS if f in flags])


def gpu_names() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


# What ``llm-release plan`` assumes per GPU when no GPU is present: an 80 GiB card (A100/H100).
ASSUMED_GPU_MEMORY_GIB = 80.0


def gpu_memory_gib(index: int = 0) -> float | None:
    """GPU ``index``'s memory as torch (and so vLLM) sees it, in GiB; None without a GPU.
    An H200 is 139.80 GiB here, not the 143,771 MiB nvidia-smi prints. A host with no NVIDIA
    driver answers at once, without importing torch (seconds, for a CLI that plans)."""
    import shutil

    if not (Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi")):
        return None
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available() or torch.cuda.device_count() <= index:
        return None
    return torch.cuda.get_device_properties(index).total_memory / 2**30


@functools.cache
def detect() -> Hardware:
    """This host. ``LLM_RELEASE_CPU_FLAGS`` (comma-separated, e.g. ``avx2,fma``) replaces the
    CPU's flags: to plan for, or emulate, a host of the other kind (scripts/avx2-emulation)."""
    try:
        text = CPUINFO.read_text(errors="replace")
    except OSError:
        text = ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = parse_cpuinfo(text, cores or 1)
    override = settings().cpu_flags
    if override is not None:
        flags = set(override)
        unknown = sorted(flags - set(ISA_FLAGS))
        if unknown:
            raise ValueError(
                f"LLM_RELEASE_CPU_FLAGS: unknown flags {unknown}; known: {', '.join(ISA_FLAGS)}"
            )
        cpu = cpu.model_copy(
            update={
                "model_name": f"{cpu.model_name} [flags set by LLM_RELEASE_CPU_FLAGS]",
                "flags": [f for f in ISA_FLAGS if f in flags],
            }
        )
    return Hardware(cpu=cpu, machine=platform.machine(), gpus=gpu_names())


def compute_dtype(hardware: Hardware) -> Literal["auto", "float32"]:
    """The dtype for model math in the pipeline (calibration): the checkpoint's own on a GPU
    or a CPU with native bf16; float32 on a CPU without it. AWQ of the demo model took
    1,749 s in bf16 and 345 s in float32 on an AVX2-only machine."""
    if hardware.cuda or hardware.cpu.native_bf16:
        return "auto"
    return "float32"
