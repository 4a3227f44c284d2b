"""The GPU server's batch size when the operator sets none: as many sequences as the KV cache
holds at the length of the requests the release is sized for, at most vLLM's own default.

Why not the sequences of ``max_model_len`` the KV cache holds (the worst case, what the
project did before): vLLM admits a request only when its prompt fits and preempts (frees
and later recomputes) the newest running request when KV runs short
(``v1/core/sched/scheduler.py``), so a limit sized for full-length sequences is a
throughput limit and nothing else. On one H200 a Qwen3-30B-A3B shape at max_model_len
32,768 with 512 + 256-token requests got 22 sequences that way and gave 0.31× vLLM's own
throughput at 100 streams (TTFT p95 16.0 s against 0.8 s).

Why not vLLM's default (1,024 on a GPU of ≥ 70 GiB) always: it is what vLLM profiles its
sampler and CUDA graphs with, and that memory comes out of the KV cache. Where the KV cache
is small (Qwen3.5-35B-A3B at gpu_memory_utilization 0.5 and 32,768 tokens) vLLM's profile at
1,024 sequences left 0.32 GiB, less than one sequence, and it refused to start; and a
hybrid (Mamba / Gated DeltaNet) model refuses to start when ``max_num_seqs`` exceeds its
state blocks (``config/compilation.py``: "max_num_seqs (N) exceeds available Mamba cache
blocks"). So the choice is the largest count, at most vLLM's default, for which

* every admitted sequence of the workload's length has its blocks (no preemption at the
  length the release is sized for),
* one sequence of ``max_model_len`` still fits (the plan's own check), and
* both hold after the memory vLLM's profile takes for that many sequences beyond what the
  plan already counts for its own ``max_num_seqs``: its profile peak (``profile.py``: the
  sampler's rows, MLA's prefill workspace) and the CUDA graphs of its capture sizes
  (``cudagraphs.py``: more sequences, more sizes, more graphs up to vLLM's capture ceiling).

A hybrid model's state blocks come from the same pool, so the first rule keeps
``max_num_seqs`` below them.
"""

from __future__ import annotations

import math

from pydantic import Field

from llm_release.sizing.architecture import Record
from llm_release.sizing.cudagraphs import (  # noqa: F401 (re-exported: the batch defaults)
    VLLM_DEFAULT_SEQS,
    VLLM_DEFAULT_SEQS_LARGE_GPU,
    vllm_default_max_num_seqs,
)
from llm_release.sizing.kv import Runtime, kv_layout
from llm_release.sizing.planner import CapacityPlan, request_overhead_bytes, request_runtime


class BatchChoice(Record):
    max_num_seqs: int
    workload_tokens: int = Field(description="prompt + output tokens of a typical request")
    cap: int = Field(description="vLLM's own default, the most this chooses")
    blocks: int = Field(description="KV blocks the plan gives one GPU")
    blocks_per_workload_request: int
    blocks_per_full_request: int
    reason: str


def seqs_bytes(plan: CapacityPlan, runtime: Runtime, seqs: int | None) -> int:
    """The plan's non-KV memory (before the learned factor) with the server at ``seqs``
    sequences (None: as the plan's own request)."""
    request = plan.request.model_copy(update={"max_num_seqs": seqs})
    return request_overhead_bytes(plan.arch, request, runtime, plan.max_model_len)


def extra_blocks(plan: CapacityPlan, runtime: Runtime, seqs: int, bytes_per_block: int) -> int:
    """Blocks a server of ``seqs`` sequences takes beyond what the plan counted for its own
    max_num_seqs (0 where it takes less: the plan's blocks are kept, erring safe)."""
    if plan.request.device != "gpu" or plan.request.non_kv_overhead_gib is not None:
        return 0
    factor = plan.request.non_kv_overhead_factor
    extra = (
        seqs_bytes(plan, runtime, seqs) - seqs_bytes(plan, runtime, plan.request.max_num_seqs)
    ) * factor
    return math.ceil(extra / bytes_per_block) if extra > 0 else 0


def choose_max_num_seqs(plan: CapacityPlan, workload_tokens: int, cap: int) -> BatchChoice:
    """The batch size for ``plan`` (its first option: the GPU count the server starts with)."""
    request = plan.request
    option = plan.options[0]
    runtime = request_runtime(plan.arch, request, option.tensor_parallel_size)
    length = max(1, min(workload_tokens, plan.max_model_len))
    full = kv_layout(plan.arch, runtime, plan.max_model_len)
    # what a request of the workload's length holds while it runs (a hybrid's second state
    # block a group only past a block boundary), against what vLLM reserves at max_model_len
    work = kv_layout(plan.arch, runtime, length, running=True)
    blocks = option.num_blocks
    usable = blocks - 1  # vLLM's BlockPool keeps block 0 as its null block, never handed out

    def holds(seqs: int) -> bool:
        left = usable - extra_blocks(plan, runtime, seqs, full.bytes_per_block)
        return left >= full.blocks_per_request and left >= seqs * work.blocks_per_request

    lo, hi = 0, max(1, cap)
    while lo < hi:  # holds() only turns false as seqs grows
        mid = (lo + hi + 1) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid - 1
    seqs = max(1, lo)
    if lo == 0:
        reason = (
            "the KV cache does not hold one sequence of max_model_len with the sampler's "
            "profile memory: 1 (the plan says whether it fits)"
        )
    elif seqs == cap:
        reason = f"vLLM's own default {cap}: the KV cache holds more {length}-token sequences"
    else:
        reason = (
            f"the {length}-token sequences (the load profile's prompt + output) the KV cache "
            f"holds at once, below vLLM's default {cap}"
        )
    return BatchChoice(
        max_num_seqs=seqs,
        workload_tokens=length,
        cap=cap,
        blocks=blocks,
        blocks_per_workload_request=work.blocks_per_request,
        blocks_per_full_request=full.blocks_per_request,
        reason=reason,
    )
