"""vLLM's own account of its KV cache, read from a server log, to check the planner.

vLLM 0.32 logs, once per engine (``vllm/v1/core/kv_cache_utils.py`` update_kv_cache_capacity):

    CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 1,024 tokens per request: 2048.00x

(``GPU`` on CUDA, ``GPU + host`` with HiSparse). vLLM 0.26 (``kv_cache_utils.py:2177``) logs the
same two figures as two ``info_once`` lines, in this order:

    GPU KV cache size: 4,025,520 tokens
    Maximum concurrency for 4,096 tokens per request: 982.79x

Both forms are read. Then the memory it gave the cache:
``Available KV cache memory: 61.2 GiB`` (GPU worker) or ``Explicitly set (1.0/23.54) GiB for
KV cache`` / ``Auto set (…/…) GiB for KV cache`` (CPU worker). A hybrid model also logs
``Setting attention block size to N tokens``.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

_NUM = r"[\d,]+"
# One line (0.32) or two lines (0.26): the size, then the concurrency, whatever lies between
# (a log line's prefix, or nothing but ", ").
KV_SIZE = re.compile(rf"(?P<device>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>{_NUM}) tokens")
KV_CONCURRENCY = re.compile(
    rf"Maximum concurrency for (?P<len>{_NUM}) tokens per request: (?P<conc>[\d.,]+)x"
)
# 0.26's gpu_worker logs its profile at DEBUG (VLLM_LOGGING_LEVEL=DEBUG): the non-KV terms
PROFILE = re.compile(
    r"Total non KV cache memory: (?P<non_kv>[\d.]+)GiB; torch peak memory increase: "
    r"(?P<peak>[\d.]+)GiB; non-torch forward increase memory: (?P<non_torch>[\d.]+)GiB; "
    r"weights memory: (?P<weights>[\d.]+)GiB"
)
CUDA_GRAPH_ESTIMATE = re.compile(
    r"--gpu-memory-utilization=(?P<util>[\d.]+) is equivalent to "
    r"--gpu-memory-utilization=(?P<equiv>[\d.]+) without CUDA graph memory profiling"
)
GPU_KV_MEMORY = re.compile(r"Available KV cache memory: (?P<gib>[\d.]+) GiB")
CPU_KV_MEMORY = re.compile(
    r"(?:Explicitly|Auto) set \((?P<gib>[\d.]+)/(?P<total>[\d.]+)\) GiB for KV cache"
)
BLOCK_SIZE = re.compile(r"Setting attention block size to (?P<n>\d+) tokens")
VERSION = re.compile(r"Initializing a V1 LLM engine \(v(?P<v>[^)]+)\)")
WEIGHTS = re.compile(r"Model loading took (?P<gib>[\d.]+) GiB")


class VllmMemoryProfile(BaseModel):
    """What vLLM's GPU worker measured before sizing the KV cache (GiB, rounded to 0.01)."""

    model_config = ConfigDict(extra="forbid")

    non_kv_gib: float = Field(description="weights + torch peak increase + non-torch increase")
    torch_peak_increase_gib: float = Field(description="activations of the profile run")
    non_torch_increase_gib: float = Field(description="cuBLAS/NCCL workspaces and the like")
    weights_gib: float
    cuda_graph_util: float | None = Field(
        None, description="utilization taken by the CUDA-graph estimate (util - equivalent)"
    )


class VllmKvReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field(description="CPU, GPU, or 'GPU + host'")
    kv_cache_tokens: int
    max_model_len: int
    max_concurrency: float
    kv_memory_gib: float | None = Field(None, description="memory vLLM gave the KV cache")
    attention_block_size: int | None = Field(None, description="raised for hybrid models")
    weights_gib: float | None = None
    vllm_version: str | None = None
    profile: VllmMemoryProfile | None = Field(
        None, description="the non-KV terms, when the server logged at DEBUG"
    )


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_vllm_kv_report(log_text: str) -> VllmKvReport | None:
    """The last engine start's KV report in ``log_text``, or None if it has none yet."""
    sizes = list(KV_SIZE.finditer(log_text))
    if not sizes:
        return None
    last = sizes[-1]
    concurrency = KV_CONCURRENCY.search(log_text, last.end())
    if concurrency is None:  # 0.26 wrote the first line and not yet the second
        return None
    # the memory and version lines come before the capacity line of the same start
    before = log_text[: last.start()]

    def last_match(pattern: re.Pattern[str]) -> re.Match[str] | None:
        found = list(pattern.finditer(before))
        return found[-1] if found else None

    memory = last_match(GPU_KV_MEMORY) or last_match(CPU_KV_MEMORY)
    block = last_match(BLOCK_SIZE)
    version = last_match(VERSION)
    weights = last_match(WEIGHTS)
    profile = last_match(PROFILE)
    graphs = last_match(CUDA_GRAPH_ESTIMATE)
    return VllmKvReport(
        device=last.group("device"),
        kv_cache_tokens=_int(last.group("tokens")),
        max_model_len=_int(concurrency.group("len")),
        max_concurrency=float(concurrency.group("conc").replace(",", "")),
        profile=VllmMemoryProfile(
            non_kv_gib=float(profile.group("non_kv")),
            torch_peak_increase_gib=float(profile.group("peak")),
            non_torch_increase_gib=float(profile.group("non_torch")),
            weights_gib=float(profile.group("weights")),
            cuda_graph_util=round(float(graphs.group("util")) - float(graphs.group("equiv")), 4)
            if graphs
            else None,
        )
        if profile
        else None,
        kv_memory_gib=float(memory.group("gib")) if memory else None,
        attention_block_size=int(block.group("n")) if block else None,
        weights_gib=float(weights.group("gib")) if weights else None,
        vllm_version=version.group("v") if version else None,
    )


def relative_error(predicted: float, reported: float) -> float:
    """(predicted − reported) / reported: positive when the planner promises too much."""
    return (predicted - reported) / reported if reported else float("inf")


class KvCheck(BaseModel):
    """The planner next to vLLM for one served candidate: what a report shows."""

    model_config = ConfigDict(extra="forbid")

    planner_kv_cache_tokens: int
    vllm_kv_cache_tokens: int
    tokens_error: float = Field(description="(planner − vLLM) / vLLM")
    planner_max_concurrency: float
    vllm_max_concurrency: float
    concurrency_error: float
    max_model_len: int
    vllm_version: str | None = None
    device: str = Field("cpu", description="cpu or gpu: where the non-KV term exists")
    planner_overhead_bytes: int | None = Field(
        None, description="the planner's non-KV estimate per GPU, before any correction"
    )
    planner_kv_memory_bytes: int | None = Field(None, description="the planner's KV memory/GPU")
    vllm_kv_memory_bytes: int | None = Field(None, description="the KV memory vLLM logged")


def check_plan(
    planner_tokens: int,
    planner_concurrency: float,
    report: VllmKvReport,
    *,
    overhead_bytes: int | None = None,
    kv_memory_bytes: int | None = None,
) -> KvCheck:
    return KvCheck(
        device="cpu" if report.device == "CPU" else "gpu",
        planner_overhead_bytes=overhead_bytes,
        planner_kv_memory_bytes=kv_memory_bytes,
        vllm_kv_memory_bytes=int(report.kv_memory_gib * 2**30)
        if report.kv_memory_gib is not None
        else None,
        planner_kv_cache_tokens=planner_tokens,
        vllm_kv_cache_tokens=report.kv_cache_tokens,
        tokens_error=relative_error(planner_tokens, report.kv_cache_tokens),
        planner_max_concurrency=planner_concurrency,
        vllm_max_concurrency=report.max_concurrency,
        concurrency_error=relative_error(planner_concurrency, report.max_concurrency),
        max_model_len=report.max_model_len,
        vllm_version=report.vllm_version,
    )
