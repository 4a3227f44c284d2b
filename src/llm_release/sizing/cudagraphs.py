"""vLLM's CUDA graphs on a GPU: the batch sizes it captures, how many graphs of each mode
that makes, and the memory its profiler takes out of the KV cache for them.

vLLM 0.32's rules, read from its source (vllm/...):

* ``config/vllm.py`` ``VllmConfig._set_cudagraph_sizes``: with no sizes configured, the
  largest size is ``min(max_num_seqs × decode_query_len × 2, 512)`` (1,024 on a
  data-centre Blackwell GPU, device capability family 100), then capped at
  ``max_num_batched_tokens``; the sizes are 1, 2, 4, every multiple of 8 below 256 and
  every multiple of 16 from 256, up to that largest size, plus ``max_num_batched_tokens``
  when it is at most the largest size, plus ``max_num_seqs`` (the widest uniform decode
  batch) when it is at most the uncapped largest size and at most
  ``max_num_batched_tokens``. ``decode_query_len`` is 1 + the speculative tokens: 1 here
  (no speculative flag is allowed in ``serving.extra_args``). A family may set its own
  largest size first (``model_executor/models/config.py``: GptOssForCausalLM 1,024), and
  then no decode size is appended.
* ``config/vllm.py`` (``OPTIMIZATION_LEVEL_02/03``): the default ``cudagraph_mode`` is
  FULL_AND_PIECEWISE; ``--enforce-eager`` sets it to NONE and captures nothing
  (``_set_cudagraph_sizes`` is skipped, the sizes are ``[]``). LongcatFlashNgramForCausalLM
  defaults to FULL.
* ``v1/worker/gpu/cudagraph_utils.py`` ``_init_candidates`` (the V2 model runner) and
  ``v1/cudagraph_dispatcher.py`` ``initialize_cudagraph_keys`` (V1): FULL_AND_PIECEWISE
  captures one PIECEWISE graph per capture size (mixed batches) and one FULL graph per
  capture size ≤ ``max_num_seqs × decode_query_len`` (uniform decode batches); FULL mode
  captures one FULL graph per size; PIECEWISE one PIECEWISE graph per size.
* ``v1/worker/gpu_worker.py`` ``determine_available_memory``: unless
  ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0`` (default 1) the KV cache gets
  ``requested − non-KV − cudagraph_memory_estimate``. The estimate
  (``v1/worker/gpu/cudagraph_utils.py`` ``profile_cudagraph_memory``, V2) captures every
  PIECEWISE graph and the two largest FULL graphs and extrapolates the FULL ones as
  ``first + (n − 1) × second``; the V1 runner (``gpu_model_runner.profile_cudagraph_memory``)
  captures the two largest of each mode and takes ``max(first) + Σ (n − 1) × second``.
  Both are a first capture and then one graph's memory per further graph; counted here
  as ``first capture + (graphs − 1) × per graph`` over both modes (``graph_bytes``).

What one graph takes is a GPU measurement, not in the source: ``graph_bytes`` below.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llm_release.sizing.architecture import GiB, Record

CudaGraphMode = Literal["FULL_AND_PIECEWISE", "FULL", "PIECEWISE", "NONE"]

# vLLM's default max_num_seqs for its OpenAI server (engine/arg_utils.py get_batch_defaults,
# 0.26 and 0.32): 1,024 on a GPU of at least 70 GiB that is not an A100, 256 otherwise.
VLLM_DEFAULT_SEQS_LARGE_GPU = 1024
VLLM_DEFAULT_SEQS = 256

# _set_cudagraph_sizes: the platform's largest default capture size
DEFAULT_MAX_CAPTURE = 512
BLACKWELL_MAX_CAPTURE = 1024  # current_platform.is_device_capability_family(100)
# The planner knows a GPU by its memory only: ≥ 160 GiB is taken for a B200-class card (as
# kv.default_batched_tokens does); a larger capture ceiling means more graphs, less KV.
BLACKWELL_MIN_GIB = 160
# model_executor/models/config.py: families that set the compilation settings themselves
FAMILY_MAX_CAPTURE = {"GptOssForCausalLM": 1024}
FAMILY_MODE: dict[str, CudaGraphMode] = {"LongcatFlashNgramForCausalLM": "FULL"}

# What one captured graph takes, per GPU. The planner's figure before (0.45 GiB for every
# MoE / hybrid model, from vLLM 0.26's "Estimated CUDA graph memory" on the H200: 0.40 GiB
# for the 16-layer Qwen3-MoE shape served at max_num_seqs 950, 0.51 GiB for the
# Qwen3.5-35B-A3B shape at 294; docs/gpu-serving-2026-12-02.jsonl, cuda_graph_util × the
# card's memory) is kept as the figure at vLLM's default settings on an H200-class GPU:
# max_num_seqs 1,024, max_num_batched_tokens 8,192 -> 51 capture sizes, 51 PIECEWISE + 51
# FULL graphs (REFERENCE_GRAPHS, checked in tests/unit/sizing/test_cudagraphs.py). So a plan
# at default settings reserves what it did, and one with fewer graphs reserves less. Per
# graph that is 4.5 MiB; the same records give 4.0 (MoE, 102 graphs) and 5.7 (hybrid, 90)
# MiB, and the Qwen3-30B-A3B shape 5.7 at max_num_seqs 178 (68 graphs) and 6.4 at 29 (18
# graphs) (docs/gpu-serving-2026-12-02-night.jsonl): one constant for every shape, tensor
# parallel size and mode, to be measured again with each GPU record.
GPU_CUDA_GRAPH_ESTIMATE_GIB = 0.45
REFERENCE_GRAPHS = 102


# vLLM's estimate is the memory of a first capture and then of each further graph
# (gpu_model_runner.profile_cudagraph_memory, V1: "Estimated PIECEWISE CUDA graph memory: X
# MiB first-capture + (n-1) × Y MiB per-graph"). The first capture took 44 and 100 MiB in the
# H200 logs of 2026-12-06 (Qwen3-30B-A3B at 32 sequences, the 16-layer Qwen3.5 hybrid at 64),
# the graphs after it 1-6 MiB: the planner takes the larger first capture once, then its
# per-graph figure for every graph after the first. Against vLLM's totals that is 46-63 MiB
# above at 18-30 graphs, 22 MiB above at 68, 22 MiB below at 90 (Qwen3.5-35B-A3B) and 144
# MiB above at 102 (a 16-layer MoE).
GRAPH_FIRST_CAPTURE_BYTES = 100 << 20


def graph_bytes(graphs: int) -> int:
    """What the planner reserves for ``graphs`` graphs on one GPU: one first capture, then
    the per-graph figure (the former 0.45 GiB spread over REFERENCE_GRAPHS) for each further
    graph."""
    if graphs <= 0:
        return 0
    per_graph = GPU_CUDA_GRAPH_ESTIMATE_GIB * GiB / REFERENCE_GRAPHS
    return int(GRAPH_FIRST_CAPTURE_BYTES + (graphs - 1) * per_graph)


def large_gpu(gpu_memory_gib: float, gpu_name: str = "") -> bool:
    """vLLM's larger batch defaults: a GPU of at least 70 GiB that is not an A100
    (arg_utils.get_batch_defaults reads the device's name: large batches slowed A100s)."""
    return gpu_memory_gib >= 70 and "a100" not in gpu_name.lower()


def vllm_default_max_num_seqs(gpu_memory_gib: float, gpu_name: str = "") -> int:
    if large_gpu(gpu_memory_gib, gpu_name):
        return VLLM_DEFAULT_SEQS_LARGE_GPU
    return VLLM_DEFAULT_SEQS


def capture_sizes(
    max_num_seqs: int,
    max_num_batched_tokens: int,
    *,
    platform_max: int = DEFAULT_MAX_CAPTURE,
    family_max: int | None = None,
    decode_query_len: int = 1,
) -> list[int]:
    """The CUDA-graph capture sizes of vLLM 0.32 (``_set_cudagraph_sizes``, no sizes
    configured, performance_mode 'balanced'). ``family_max``: a largest size a model family
    sets itself (then no decode size is appended). Speculative decoding
    (``decode_query_len`` > 1) appends request-count grids scaled by the query length; the
    pipeline allows no speculative flag, so only 1 is modelled."""
    if decode_query_len != 1:
        raise ValueError("only decode_query_len 1 (no speculative decoding) is modelled")
    decode_sizes: list[int] = []
    if family_max is None:
        largest = min(max_num_seqs * decode_query_len * 2, platform_max)
        if max_num_seqs <= largest:
            decode_sizes = [max_num_seqs]
    else:
        largest = family_max
    largest = min(max_num_batched_tokens, largest)
    sizes = [n for n in (1, 2, 4) if n <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    sizes += [n for n in decode_sizes if n <= max_num_batched_tokens]
    return sorted(set(sizes))


class CudaGraphs(Record):
    """The graphs vLLM captures for one server, and what the planner reserves for them."""

    mode: CudaGraphMode
    max_num_seqs: int
    capture_sizes: list[int] = Field(default_factory=list)
    piecewise_graphs: int = 0
    full_graphs: int = 0
    bytes: int = Field(
        0, description="the profiler's estimate as planned: first capture + per further graph"
    )

    @property
    def graphs(self) -> int:
        return self.piecewise_graphs + self.full_graphs


def cuda_graphs(
    max_num_seqs: int,
    max_num_batched_tokens: int,
    *,
    enforce_eager: bool = False,
    architecture: str = "",
    gpu_memory_gib: float = 80.0,
) -> CudaGraphs:
    """The capture sizes, graphs per mode and reserved bytes for one GPU rank."""
    mode: CudaGraphMode = FAMILY_MODE.get(architecture, "FULL_AND_PIECEWISE")
    if enforce_eager:
        return CudaGraphs(mode="NONE", max_num_seqs=max_num_seqs)
    platform_max = (
        BLACKWELL_MAX_CAPTURE if gpu_memory_gib >= BLACKWELL_MIN_GIB else DEFAULT_MAX_CAPTURE
    )
    sizes = capture_sizes(
        max_num_seqs,
        max_num_batched_tokens,
        platform_max=platform_max,
        family_max=FAMILY_MAX_CAPTURE.get(architecture),
    )
    piecewise = len(sizes) if mode in ("FULL_AND_PIECEWISE", "PIECEWISE") else 0
    if mode == "FULL_AND_PIECEWISE":
        full = sum(1 for n in sizes if n <= max_num_seqs)  # uniform decode batches
    else:
        full = len(sizes) if mode == "FULL" else 0
    return CudaGraphs(
        mode=mode,
        max_num_seqs=max_num_seqs,
        capture_sizes=sizes,
        piecewise_graphs=piecewise,
        full_graphs=full,
        bytes=graph_bytes(piecewise + full),
    )
