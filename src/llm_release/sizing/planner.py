"""The plan: a request (device, memory, dtype, max_model_len, tensor parallel) and what fits
-- KV tokens, maximum concurrency, the tensor-parallel options and the recommendation.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from llm_release.errors import ConfigError
from llm_release.sizing.architecture import (
    TORCH_DTYPE_BYTES,
    GiB,
    ModelArch,
    Record,
    parse_config,
)
from llm_release.sizing.cudagraphs import (
    GPU_CUDA_GRAPH_ESTIMATE_GIB,
    CudaGraphs,
    cuda_graphs,
    vllm_default_max_num_seqs,
)
from llm_release.sizing.kv import (
    Runtime,
    default_batched_tokens,
    kv_capacity,
    kv_layout,
    seeds_kv_bytes_per_token,
)
from llm_release.sizing.profile import profile_moments, profile_peak_bytes
from llm_release.sizing.weights import (
    TensorInfo,
    WeightBytes,
    estimate_params,
    weights_from_tensors,
)

# ---------------------------------------------------------------- the plan


class PlanRequest(Record):
    device: Literal["gpu", "cpu"] = "gpu"
    gpu_memory_gib: float = Field(80.0, gt=0)
    gpu_name: str = Field("", description="the GPU's name (vLLM gives an A100 smaller defaults)")
    gpu_counts: list[int] = Field(default_factory=lambda: [1, 2, 4, 8])
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    cpu_kvcache_space_gib: int = Field(1, ge=1)
    max_model_len: int | None = Field(None, ge=1, description="None: the model's maximum")
    concurrency: int = Field(1, ge=1, description="sequences of max_model_len to hold at once")
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    online_quantization: Literal["none", "fp8"] = Field(
        "none",
        description="vLLM --quantization fp8 on an unquantized checkpoint: the linear layers "
        "are cast to FP8 at load, so their weights take 1 byte each on the GPU",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="the served dtype (vLLM --dtype); 'auto' is the checkpoint's. On a CPU "
        "without native bf16 the pipeline serves float32, which doubles the KV bytes",
    )
    mamba_ssm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="linear-attention recurrent state dtype; 'auto': the config's "
        "mamba_ssm_dtype, else the model dtype. vLLM CPU on a host with AVX512_BF16 stores "
        "it in float32 (platforms/cpu.py): see cpu_ssm_dtype_for_host()",
    )
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="vLLM --max-num-seqs: its CUDA-graph capture sizes and its sampler's "
        "profile rows. None: vLLM's default for the GPU (1,024 on ≥ 70 GiB)",
    )
    enforce_eager: bool = Field(False, description="vLLM --enforce-eager: no CUDA graphs")
    language_model_only: bool = Field(
        False, description="vLLM --language-model-only: a multimodal model's tower not loaded"
    )
    speculative_mtp: bool = Field(
        False,
        description="speculative decoding by the model's MTP layers: they are loaded, and "
        "their attention holds KV beside the model's",
    )
    speculative_tokens: int = Field(
        0, ge=0, le=16, description="tokens drafted a step by any speculation method (0: none)"
    )
    vllm_version: str | None = Field(
        None,
        description="the serving vLLM's version (corrections.apply sets it): which model "
        "runners subtract a CUDA-graph estimate. None: the pinned 0.32's rule",
    )
    unmodelled: list[str] = Field(
        default_factory=list,
        description="serving settings that move vLLM's memory and the planner does not "
        "model (request_for_serving fills it); each is named in the plan's notes",
    )
    block_size: int | None = None
    async_scheduling: bool | None = Field(
        None, description="--async-scheduling / --no-async-scheduling; None: vLLM's default"
    )
    non_kv_overhead_gib: float | None = Field(
        None,
        description="GPU memory per rank that is neither weights nor KV (activations, CUDA "
        "graphs, NCCL); None: an estimate from the model's widths",
    )
    non_kv_overhead_factor: float = Field(
        1.0,
        gt=0,
        description="multiplies the overhead estimate: the correction learned per vLLM "
        "version from recorded starts (llm_release.sizing.corrections)",
    )
    overhead_note: str | None = Field(None, description="where the factor came from")


class TpOption(Record):
    tensor_parallel_size: int
    weights_per_gpu_bytes: int
    overhead_per_gpu_bytes: int
    kv_memory_per_gpu_bytes: int
    cuda_graph_bytes: int = Field(
        0, description="the CUDA-graph estimate within overhead_per_gpu_bytes (uncorrected)"
    )
    kv_bytes_per_token: int = Field(description="attention layers only, one rank")
    state_bytes_per_sequence: int
    block_size: int
    num_blocks: int
    kv_cache_tokens: int
    max_concurrency: float
    fits: bool
    reasons: list[str] = Field(default_factory=list)
    min_gpu_memory_utilization: float | None = None


class Recommendation(Record):
    tensor_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    gpu_memory_utilization: float | None = None
    cpu_kvcache_space_gib: int | None = None


class CapacityPlan(Record):
    model: str
    arch: ModelArch
    request: PlanRequest
    weights: WeightBytes
    max_model_len: int
    kv_bytes_per_token_unsharded: int
    seeds_kv_bytes_per_token: int
    options: list[TpOption]
    fits: bool
    verdict: str
    recommendation: Recommendation | None
    alternative: Recommendation | None = Field(
        None,
        description="when nothing fits as asked: the longest max_model_len that holds the "
        "requested concurrency, at the largest tensor-parallel size whose weights fit",
    )
    notes: list[str] = Field(default_factory=list)


def longest_fitting_len(
    arch: ModelArch, runtime: Runtime, kv_memory_bytes: int, concurrency: int, upper: int
) -> int | None:
    """The largest max_model_len ≤ ``upper`` at which ``concurrency`` sequences fit (the
    concurrency only falls as the length grows, so a bisection finds it)."""

    def holds(length: int) -> bool:
        layout = kv_layout(arch, runtime, length)
        return kv_capacity(layout, kv_memory_bytes, length).max_concurrency >= concurrency

    if upper < 1 or not holds(1):
        return None
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if holds(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def cpu_ssm_dtype_for_host() -> Literal["auto", "float32"]:
    """vLLM CPU 0.32 resets the linear-attention state to float32 when the host has
    AVX512_BF16 (its accelerated GDN kernel) unless bf16/fp16 was asked for explicitly."""
    from llm_release.hardware import detect

    return "float32" if "avx512_bf16" in detect().cpu.flags else "auto"


# vLLM's non-KV GPU memory beyond the weights (gpu_worker.determine_available_memory, 0.26):
# the torch peak of its profile run (sizing/profile.py, modelled tensor by tensor), the
# non-torch memory that grew meanwhile (cuBLAS/NCCL handles) and its estimate of the CUDA
# graphs' memory (sizing/cudagraphs.py). vLLM 0.26 runs dense models on the V2 runner (no
# graph estimate subtracted) and MoE and hybrid models on the V1 runner
# (vllm/config/vllm.py: _is_default_v2_model_runner_model); vLLM 0.32 runs every model
# planned here on the V2 runner, which subtracts an estimate too (graphs_subtracted()).
# The non-torch growth is a measurement, not in the source: 0.22 GiB for every dense,
# sliding-window, FP8, W4A16 and MLA row on the H100 and H200 (docs/gpu-sizing-2026-12-06*),
# 0.23-0.25 GiB for the V1 runner's MoE and hybrid rows with CUDA graphs.
GPU_NON_TORCH_GIB = 0.22
GPU_NON_TORCH_MOE_GIB = 0.24


# vllm/config/vllm.py (0.26) DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES: MoE families that vLLM
# 0.26 runs on the V2 model runner all the same
V2_RUNNER_MOE_ARCHITECTURES_026 = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "GraniteMoeForCausalLM",
        "InklingForCausalLM",
        "InklingForConditionalGeneration",
        "LongcatFlashNgramForCausalLM",
        "Qwen2MoeForCausalLM",
    }
)


def is_version(vllm_version: str | None, series: str) -> bool:
    """Whether ``vllm_version`` ('0.26.0', 'v0.26.0+sm90lean', '0.26') is of ``series``
    ('0.26'); None or empty is of none."""
    version = (vllm_version or "").strip().lstrip("v")
    return version == series or version.startswith(series + ".")


def v1_runner(arch: ModelArch, vllm_version: str | None) -> bool:
    """Whether vLLM serves this model on its V1 model runner: vLLM 0.26
    (config/vllm.py _is_default_v2_model_runner_model) for hybrid models and MoE models
    outside V2_RUNNER_MOE_ARCHITECTURES_026; never on 0.32 (use_v2_model_runner) or any
    other version the planner is told."""
    if not is_version(vllm_version, "0.26"):
        return False
    if arch.linear:
        return True
    return bool(arch.moe) and arch.architecture not in V2_RUNNER_MOE_ARCHITECTURES_026


def graphs_subtracted(arch: ModelArch, vllm_version: str | None) -> bool:
    """Whether vLLM takes its CUDA-graph estimate out of the KV cache for this model: vLLM
    0.26's V2 runner (profile_cudagraph_memory returns 0) does not, its V1 runner does;
    vLLM 0.32 and any other version: subtracted for every model (its V2 runner's
    profile_cudagraph_memory; where unsure, the smaller KV)."""
    if not is_version(vllm_version, "0.26"):
        return True
    return v1_runner(arch, vllm_version)


def request_graphs(arch: ModelArch, request: PlanRequest, runtime: Runtime) -> CudaGraphs:
    """The CUDA graphs vLLM captures for ``request`` on one rank (none on a CPU, nor where
    vLLM subtracts no estimate for them: their ``bytes`` is then 0)."""
    seqs = request_max_num_seqs(request)
    if request.device != "gpu":
        return CudaGraphs(mode="NONE", max_num_seqs=seqs)
    graphs = cuda_graphs(
        seqs,
        default_batched_tokens(runtime),
        enforce_eager=request.enforce_eager,
        architecture=arch.architecture,
        gpu_memory_gib=request.gpu_memory_gib,
    )
    if not graphs_subtracted(arch, request.vllm_version):
        graphs = graphs.model_copy(update={"bytes": 0})
    return graphs


def captures_full_graphs(arch: ModelArch, request: PlanRequest, runtime: Runtime) -> bool:
    """Whether the server captures FULL CUDA graphs (not under --enforce-eager)."""
    return request_graphs(arch, request, runtime).full_graphs > 0


def request_max_num_seqs(request: PlanRequest) -> int:
    """The server's max_num_seqs: the request's, else vLLM's default for the GPU."""
    return request.max_num_seqs or vllm_default_max_num_seqs(
        request.gpu_memory_gib, request.gpu_name
    )


def estimate_overhead_bytes(
    arch: ModelArch,
    tp: int,
    batched_tokens: int,
    *,
    max_num_seqs: int,
    max_model_len: int,
    v1: bool = False,
    compiled: bool = True,
    cuda_graph_bytes: int | None = None,
) -> int:
    """Non-KV GPU memory of one rank beyond its weights, as vLLM profiles it: the torch peak
    of its profile run on ``batched_tokens`` tokens (sizing/profile.py: the forward, the
    sampler on min(tokens, max_num_seqs) rows, the compiler's example inputs), the non-torch
    growth measured above and the CUDA-graph estimate ``cuda_graph_bytes`` (None: the 0.45
    GiB of vLLM's default settings for MoE and hybrid models, 0 for dense ones)."""
    moe_like = bool(arch.moe or arch.linear)
    if cuda_graph_bytes is None:
        cuda_graph_bytes = int(GPU_CUDA_GRAPH_ESTIMATE_GIB * GiB) if moe_like else 0
    peak = profile_peak_bytes(
        arch,
        tp,
        batched_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        v1_runner=v1,
        compiled=compiled,
    )
    non_torch = GPU_NON_TORCH_MOE_GIB if moe_like and v1 and compiled else GPU_NON_TORCH_GIB
    return peak + int(non_torch * GiB) + cuda_graph_bytes


def modelled_version(vllm_version: str | None) -> bool:
    """Whether the planner follows this vLLM version's rules (None: the pinned 0.32)."""
    return not (vllm_version or "").strip() or any(
        is_version(vllm_version, v) for v in GRAPH_RULE_VERSIONS
    )


def runners_to_plan(arch: ModelArch, vllm_version: str | None) -> tuple[bool, ...]:
    """The model runners whose profile the plan takes (True: V1): the version's own; for a
    version the planner does not know, both for a MoE or hybrid model (where unsure, the
    larger peak: V1's sampler holds 14 B a logit, V2's 2 B)."""
    if modelled_version(vllm_version) or not (arch.moe or arch.linear):
        return (v1_runner(arch, vllm_version),)
    return (True, False)


def _profile_settings(request: PlanRequest, max_model_len: int) -> dict:
    """The serving settings vLLM's profile run depends on, as profile_moments takes them."""
    return {
        "max_num_seqs": request_max_num_seqs(request),
        "max_model_len": max_model_len,
        "compiled": not request.enforce_eager,
    }


def request_overhead_bytes(
    arch: ModelArch, request: PlanRequest, runtime: Runtime, max_model_len: int
) -> int:
    """estimate_overhead_bytes for a request's serving settings on one rank."""
    graphs = request_graphs(arch, request, runtime).bytes
    tp, tokens = runtime.tensor_parallel_size, default_batched_tokens(runtime)
    settings = _profile_settings(request, max_model_len)
    return max(
        estimate_overhead_bytes(arch, tp, tokens, v1=v1, cuda_graph_bytes=graphs, **settings)
        for v1 in runners_to_plan(arch, request.vllm_version)
    )


def _tp_problem(arch: ModelArch, tp: int) -> str | None:
    if arch.num_attention_heads % tp:
        return f"tensor_parallel_size {tp} does not divide num_attention_heads {arch.num_attention_heads}"
    if arch.num_kv_heads >= tp and arch.num_kv_heads % tp:
        return f"tensor_parallel_size {tp} does not divide num_key_value_heads {arch.num_kv_heads}"
    return arch.linear.tp_problem(tp) if arch.linear else None


def _flag(args: list[str], *names: str) -> str | None:
    """The value of the last ``--name value`` / ``--name=value`` in a vLLM argument list."""
    value = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                value = args[i + 1]
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


# Allowed serving flags (serving/serving_flags.py) that move vLLM's GPU memory and that the
# planner does not model, with what they do (vLLM 0.32).
UNMODELLED_FLAGS = {
    "--kv-cache-memory-bytes": "vLLM takes this KV size and skips its memory profile",
    "--cpu-offload-gb": "part of the weights stay in CPU memory",
    "--pipeline-parallel-size": "the layers are split over GPUs",
    "--data-parallel-size": "one engine per GPU group",
    "--attention-backend": "the backend decides which CUDA-graph modes it supports",
}


def unmodelled_settings(args: list[str]) -> list[str]:
    """The flags of UNMODELLED_FLAGS that ``args`` set to something other than vLLM's
    default, as 'flag value (what it does)'."""
    found = []
    for name, what in UNMODELLED_FLAGS.items():
        value = _flag(args, name)
        if value is None or (name.endswith("-parallel-size") and value == "1"):
            continue
        found.append(f"{name} {value} ({what})")
    return found


def request_for_serving(
    serving,
    *,
    device: Literal["gpu", "cpu"],
    gpu_memory_gib: float = 80.0,
    gpu_name: str = "",
    dtype: str | None = None,
    concurrency: int | None = None,
    extra_args: list[str] | None = None,
) -> PlanRequest:
    """The PlanRequest for a ``config.ServingConfig`` as serve.build_command passes it to vLLM:
    max-model-len, KV space or memory utilization, prefix caching, max_num_seqs and
    enforce_eager (vLLM's CUDA graphs and sampler rows), and the flags in ``extra_args`` that
    change the KV arithmetic (--kv-cache-dtype, --max-num-batched-tokens, --block-size,
    --tensor-parallel-size, --enforce-eager); those that move vLLM's memory in ways the
    planner does not model are named in the plan's notes (UNMODELLED_FLAGS). ``dtype`` is
    the served dtype once resolved (serving.dtype 'fastest' is resolved per host by
    serve.resolve_dtype)."""
    args = serving.parallel_args() + list(serving.extra_args) + list(extra_args or [])
    served = dtype or serving.dtype
    if served not in ("auto", "bfloat16", "float16", "float32"):
        raise ConfigError(
            f"served dtype {served!r} is not resolved",
            hint="pass the dtype serve.resolve_dtype chose ('fastest' depends on the host)",
        )
    kv = _flag(args, "--kv-cache-dtype") or "auto"
    quantization = _flag(args, "--quantization", "-q")
    tp = _flag(args, "--tensor-parallel-size", "-tp")
    batched = _flag(args, "--max-num-batched-tokens")
    block = _flag(args, "--block-size")
    eager = bool(getattr(serving, "enforce_eager", False)) or "--enforce-eager" in args
    asynchronous = None
    for arg in args:  # the last of the pair wins, as argparse's BooleanOptionalAction
        if arg in ("--async-scheduling", "--no-async-scheduling"):
            asynchronous = arg == "--async-scheduling"
    unmodelled = unmodelled_settings(args)
    speculation = getattr(serving, "speculation", None)
    if speculation is not None:
        # vLLM turns asynchronous scheduling off for ngram speculation (vllm/config/vllm.py)
        if speculation.method == "ngram" and asynchronous is None:
            asynchronous = False
        if not eager:
            # cudagraphs.py captures decode batches of one query token only
            unmodelled.append(
                f"speculative decoding {speculation.label()}'s CUDA graphs (decode batches "
                f"of {1 + speculation.num_speculative_tokens} query tokens)"
            )
    try:
        return PlanRequest(
            device=device,
            gpu_memory_gib=gpu_memory_gib,
            gpu_name=gpu_name,
            gpu_counts=[int(tp)] if tp else [1],
            gpu_memory_utilization=serving.gpu_memory_utilization,
            cpu_kvcache_space_gib=serving.cpu_kvcache_space_gib,
            max_model_len=serving.max_model_len,
            concurrency=concurrency or 1,
            kv_cache_dtype="fp8" if kv.startswith("fp8") else "auto",
            online_quantization="fp8" if quantization == "fp8" else "none",
            dtype=served,
            mamba_ssm_dtype=cpu_ssm_dtype_for_host() if device == "cpu" else "auto",
            enable_prefix_caching=serving.enable_prefix_caching,
            max_num_batched_tokens=int(batched) if batched else None,
            max_num_seqs=getattr(serving, "max_num_seqs", None),
            enforce_eager=eager,
            language_model_only="--language-model-only" in args,
            speculative_mtp=speculation is not None and speculation.method == "mtp",
            speculative_tokens=speculation.num_speculative_tokens if speculation else 0,
            unmodelled=unmodelled,
            block_size=int(block) if block else None,
            async_scheduling=asynchronous,
        )
    except ValueError as exc:
        raise ConfigError(f"serving arguments the planner cannot read: {exc}") from exc


def served_weights(
    tensors: dict[str, TensorInfo], config: dict, request: PlanRequest
) -> WeightBytes:
    """The weights vLLM loads from a checkpoint's tensors for ``request``'s settings (MTP
    layers only with MTP speculation, a vision tower not under --language-model-only)."""
    dtype_bytes = TORCH_DTYPE_BYTES.get(request.dtype) if request.dtype != "auto" else None
    if dtype_bytes is None:
        dtype_bytes = parse_config(config).dtype_bytes
    return weights_from_tensors(
        tensors,
        config,
        language_model_only=request.language_model_only,
        speculative_mtp=request.speculative_mtp,
        dtype_bytes=int(dtype_bytes),
    )


def online_fp8_weights(arch: ModelArch, weights: WeightBytes) -> WeightBytes:
    """The weights vLLM keeps after ``--quantization fp8`` of a checkpoint stored in 16 bits:
    every linear layer llm-compressor would quantize at 1 byte per weight (per-tensor scales:
    a few bytes), the rest as stored. A checkpoint already quantized is left as it is."""
    if any(d.upper().startswith(("F8", "I8", "U8", "I4", "U4", "I32")) for d in weights.by_dtype):
        return weights  # FP8 or packed int weights: quantized already
    saved = estimate_params(arch).quantizable * (arch.dtype_bytes - 1)
    total = max(weights.total_bytes - saved, weights.replicated_bytes)
    return weights.model_copy(
        update={"total_bytes": total, "scheme": "online fp8", "by_dtype": {"mixed": total}}
    )


# the vLLM versions whose CUDA-graph rules the planner follows (cudagraphs.py: 0.32's
# source; 0.26: the same capture rule as measured on the H200, dense models without estimate)
GRAPH_RULE_VERSIONS = ("0.26", "0.32")


def _peak_note(arch: ModelArch, request: PlanRequest, runtime: Runtime, max_len: int) -> str:
    runners = runners_to_plan(arch, request.vllm_version)
    peaks = []
    tp, tokens = runtime.tensor_parallel_size, default_batched_tokens(runtime)
    settings = _profile_settings(request, max_len)
    for v1 in runners:
        moments = profile_moments(arch, tp, tokens, v1_runner=v1, **settings)
        moment, peak = max(moments.items(), key=lambda kv: kv[1])
        peaks.append((peak, moment, "V1" if v1 else "V2"))
    peak, moment, runner = max(peaks)
    unsure = (
        f", the larger of V1's and V2's: vLLM {request.vllm_version}'s runner is not modelled"
        if len(runners) > 1
        else ""
    )
    return (
        f"vLLM's profile peak: {peak / GiB:.2f} GiB per GPU at {moment} "
        f"({runner} model runner, {default_batched_tokens(runtime):,} tokens{unsure})"
    )


def _graph_notes(arch: ModelArch, request: PlanRequest, graphs: CudaGraphs) -> list[str]:
    notes: list[str] = []
    if graphs.mode == "NONE":
        notes.append("CUDA graphs: none (--enforce-eager)")
    else:
        seqs = (
            f"max_num_seqs {graphs.max_num_seqs}"
            if request.max_num_seqs
            else f"vLLM's default max_num_seqs {graphs.max_num_seqs}"
        )
        reserved = (
            f"{graphs.bytes / GiB:.2f} GiB reserved per GPU"
            if graphs.bytes
            else "no estimate subtracted by this vLLM for a dense model"
        )
        notes.append(
            f"CUDA graphs ({graphs.mode}, {seqs}): {len(graphs.capture_sizes)} capture sizes "
            f"up to {graphs.capture_sizes[-1] if graphs.capture_sizes else 0}, "
            f"{graphs.piecewise_graphs} PIECEWISE + {graphs.full_graphs} FULL graphs; {reserved}"
        )
    version = (request.vllm_version or "").strip().lstrip("v")
    if not modelled_version(version):
        notes.append(
            f"CUDA graphs: vLLM {version}'s capture rule is not modelled; vLLM 0.32's is used "
            "and the estimate is subtracted for every model"
        )
    return notes


def request_runtime(arch: ModelArch, request: PlanRequest, tp: int) -> Runtime:
    """The settings of ``request`` that change the KV arithmetic, at ``tp`` GPUs."""
    same = set(Runtime.model_fields) & set(PlanRequest.model_fields)  # one name, one meaning
    return Runtime(
        **request.model_dump(include=same),
        tensor_parallel_size=tp,
        drafter_attention_layers=arch.mtp_layers if request.speculative_mtp else 0,
    )


def plan(
    arch: ModelArch, weights: WeightBytes, request: PlanRequest, model: str = "model"
) -> CapacityPlan:
    if request.online_quantization == "fp8" and request.device == "gpu":
        weights = online_fp8_weights(arch, weights)
    if request.dtype != "auto":
        arch = arch.model_copy(
            update={"dtype_bytes": TORCH_DTYPE_BYTES[request.dtype], "dtype_name": request.dtype}
        )
    if request.mamba_ssm_dtype != "auto" and arch.linear:
        linear = arch.linear.model_copy(
            update={"ssm_dtype_bytes": TORCH_DTYPE_BYTES[request.mamba_ssm_dtype]}
        )
        arch = arch.model_copy(update={"linear": linear})
    max_len = request.max_model_len or arch.max_position_embeddings or 4096
    notes: list[str] = []
    too_long = None
    if arch.max_position_embeddings and max_len > arch.max_position_embeddings:
        # vLLM raises at start unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 (and then rope breaks)
        too_long = (
            f"max_model_len {max_len:,} > the model's max_position_embeddings "
            f"{arch.max_position_embeddings:,} (vLLM refuses it)"
        )
    counts = [1] if request.device == "cpu" else sorted(set(request.gpu_counts))
    options: list[TpOption] = []
    tried: list[tuple[TpOption, Runtime, int, bool]] = []
    for tp in counts:
        runtime = request_runtime(arch, request, tp)
        layout = kv_layout(arch, runtime, max_len)
        reasons: list[str] = [too_long] if too_long else []
        problem = _tp_problem(arch, tp)
        if problem:
            reasons.append(problem)
        w = weights.per_gpu(tp)
        graph_mem = 0
        if request.device == "cpu":
            overhead = 0
            kv_mem = request.cpu_kvcache_space_gib * GiB
            budget = None
        else:
            graphs = request_graphs(arch, request, runtime)
            graph_mem = graphs.bytes
            overhead = (
                int(request.non_kv_overhead_gib * GiB)
                if request.non_kv_overhead_gib is not None
                else int(
                    request_overhead_bytes(arch, request, runtime, max_len)
                    * request.non_kv_overhead_factor
                )
            )
            if request.non_kv_overhead_gib is None and tp == counts[0]:
                notes.extend(_graph_notes(arch, request, graphs))
                notes.append(_peak_note(arch, request, runtime, max_len))
            budget = request.gpu_memory_gib * GiB
            kv_mem = int(budget * request.gpu_memory_utilization) - w - overhead
            if kv_mem <= 0:
                reasons.append(
                    f"weights {w / GiB:.1f} GiB + overhead {overhead / GiB:.1f} GiB per GPU "
                    f"exceed {request.gpu_memory_gib:g} GiB × {request.gpu_memory_utilization:g}"
                )
        cap = kv_capacity(layout, kv_mem, max_len)
        if kv_mem > 0 and cap.max_concurrency < 1:
            reasons.append(
                f"KV cache holds {cap.kv_cache_tokens:,} tokens: not one sequence of "
                f"max_model_len {max_len:,}"
            )
        elif kv_mem > 0 and cap.max_concurrency < request.concurrency:
            reasons.append(
                f"max concurrency {cap.max_concurrency:.2f} at {max_len:,} tokens < "
                f"the {request.concurrency} requested"
            )
        seqs = request_max_num_seqs(request)
        if (
            request.device == "gpu"
            and arch.linear
            and captures_full_graphs(arch, request, runtime)
            and kv_mem > 0
            and seqs > cap.num_blocks
        ):
            # config/compilation.py (0.26): each decode sequence of a FULL CUDA graph holds
            # one Mamba / Gated DeltaNet state block; vLLM refuses to start with fewer blocks
            reasons.append(
                f"max_num_seqs {seqs} exceeds the {cap.num_blocks:,} KV blocks: each decoding "
                "sequence holds one linear-attention state block and vLLM refuses to start; "
                f"serve with --max-num-seqs {cap.num_blocks:,} or less"
            )
        min_util = None
        if budget:
            need = (
                w
                + overhead
                + request.concurrency * layout.blocks_per_request * layout.bytes_per_block
            )
            min_util = math.ceil(need / budget * 100) / 100
        options.append(
            TpOption(
                tensor_parallel_size=tp,
                weights_per_gpu_bytes=w,
                overhead_per_gpu_bytes=overhead,
                cuda_graph_bytes=graph_mem,
                kv_memory_per_gpu_bytes=max(0, kv_mem),
                kv_bytes_per_token=layout.attention_bytes_per_token,
                state_bytes_per_sequence=layout.state_bytes_per_sequence,
                block_size=layout.block_size,
                num_blocks=cap.num_blocks,
                kv_cache_tokens=cap.kv_cache_tokens,
                max_concurrency=round(cap.max_concurrency, 2),
                fits=not reasons,
                reasons=reasons,
                min_gpu_memory_utilization=min_util,
            )
        )
        tried.append((options[-1], runtime, kv_mem, problem is None))
        for note in layout.notes:
            if note not in notes:
                notes.append(note)
    for what in arch.unmodelled:
        notes.append(f"not modelled: {what}")
    if weights.rope_cache_bytes:
        notes.append(
            f"RoPE cos/sin caches: {weights.rope_cache_bytes / 2**20:,.0f} MiB per GPU, "
            "counted with the weights as vLLM allocates them"
        )
    for what, nbytes in weights.left_out.items():
        notes.append(
            f"{nbytes / GiB:.2f} GiB of the checkpoint's {what}: not loaded by vLLM, not "
            "counted in the weights"
        )
    if request.device == "gpu" and request.overhead_note and request.non_kv_overhead_gib is None:
        notes.append(request.overhead_note)
    for setting in request.unmodelled:
        notes.append(
            f"{setting}: changes vLLM's memory and is not modelled here; the figures are without it"
        )
    best = next((o for o in options if o.fits), None)
    unsharded = kv_layout(arch, Runtime(device=request.device), max_len).attention_bytes_per_token
    if request.kv_cache_dtype == "fp8":
        unsharded = kv_layout(
            arch, Runtime(device=request.device, kv_cache_dtype="fp8"), max_len
        ).attention_bytes_per_token
    recommendation = None
    if best:
        util = None
        if request.device == "gpu":
            util = request.gpu_memory_utilization
        recommendation = Recommendation(
            tensor_parallel_size=best.tensor_parallel_size,
            max_model_len=max_len,
            # every admitted sequence can grow to max_model_len without preemption
            max_num_seqs=max(request.concurrency, min(1024, int(best.max_concurrency))),
            gpu_memory_utilization=util,
            cpu_kvcache_space_gib=request.cpu_kvcache_space_gib
            if request.device == "cpu"
            else None,
        )
        where = "CPU" if request.device == "cpu" else f"{best.tensor_parallel_size} GPU(s)"
        verdict = (
            f"fits on {where}: {best.kv_cache_tokens:,} KV tokens, "
            f"{best.max_concurrency:.2f} sequences of {max_len:,}"
        )
    alternative = None
    if not best:
        last = options[-1]
        verdict = "does not fit: " + "; ".join(last.reasons)
        upper = min(max_len, arch.max_position_embeddings or max_len)
        for option, runtime, kv_mem, tp_ok in reversed(tried):
            if not tp_ok or kv_mem <= 0:
                continue
            length = longest_fitting_len(arch, runtime, kv_mem, request.concurrency, upper)
            if length:
                alternative = Recommendation(
                    tensor_parallel_size=option.tensor_parallel_size,
                    max_model_len=length,
                    max_num_seqs=request.concurrency,
                    gpu_memory_utilization=request.gpu_memory_utilization
                    if request.device == "gpu"
                    else None,
                    cpu_kvcache_space_gib=request.cpu_kvcache_space_gib
                    if request.device == "cpu"
                    else None,
                )
                verdict += (
                    f"; at tensor_parallel_size {option.tensor_parallel_size} a max_model_len "
                    f"of {length:,} holds {request.concurrency} sequence(s)"
                )
            util = option.min_gpu_memory_utilization
            if util is not None and request.gpu_memory_utilization < util <= 0.95:
                verdict += f"; or gpu_memory_utilization {util:.2f} holds them at {max_len:,}"
            break
    return CapacityPlan(
        model=model,
        arch=arch,
        request=request,
        weights=weights,
        max_model_len=max_len,
        kv_bytes_per_token_unsharded=unsharded,
        seeds_kv_bytes_per_token=seeds_kv_bytes_per_token(arch),
        options=options,
        fits=best is not None,
        verdict=verdict,
        recommendation=recommendation,
        alternative=alternative,
        notes=notes,
    )
