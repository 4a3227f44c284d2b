"""Sizing: weights, KV cache and concurrency of a model before it is served.

Size before you serve: weights, KV cache and concurrency, computed the way vLLM 0.32 does.

The seeds sized models with ``hidden × layers × 4 × bytes`` per token. That ignores
grouped-query attention (K and V are ``num_key_value_heads × head_dim`` wide, not
``hidden``), sliding windows (vLLM frees blocks that fell out of the window), MLA (one
latent of ``kv_lora_rank + qk_rope_head_dim`` per token) and hybrid linear attention
(Qwen3.5 / Qwen3-Next keep KV only in every 4th layer; the Gated DeltaNet layers hold a
fixed state per sequence). This module follows vLLM 0.32's own sizing
(``vllm/v1/kv_cache_interface.py``, ``vllm/v1/core/kv_cache_utils.py``,
``vllm/platforms/interface.py::_align_hybrid_block_size``, ``vllm/platforms/cpu.py``):

* a layer's page is ``block_size × num_kv_heads × (head_size + head_size_v) × bytes``
  (MLA: ``block_size × (kv_lora_rank + qk_rope_head_dim) × bytes``, V is 0);
* layers are grouped by spec; groups hold the same number of layers (the smallest kind's
  count, padded) and one block of the shared pool is ``layers_per_group × page``;
* ``num_blocks = kv_memory // bytes_per_block``;
* a request at ``max_model_len`` needs ``cdiv(max_model_len, block_size)`` blocks of a full
  attention group, ``cdiv(min(window − 1 + max_in_flight_tokens, max_model_len),
  block_size) + 1`` of a sliding-window group (``max_in_flight_tokens``: two
  ``max_num_batched_tokens`` batches with the GPU's asynchronous scheduling, one on a CPU), and 1 (2 with prefix caching, "align" mode)
  of a Mamba/GDN group, whose page is padded to the attention page;
* max concurrency = ``num_blocks / blocks_per_request``; the "KV cache size" vLLM logs is
  ``int(max_concurrency × max_model_len)`` tokens.

GPU memory for KV is ``memory × gpu_memory_utilization − weights − non-KV overhead``; the
overhead (activations of one ``max_num_batched_tokens`` step, CUDA graphs, NCCL/cuBLAS
workspaces) is an estimate here, to be corrected from vLLM's own logs. On CPU the KV
memory is exactly ``VLLM_CPU_KVCACHE_SPACE`` GiB and the block size is 128 (16 for MLA).

The room: ``architecture`` (config.json, bounded), ``kv`` (vLLM's KV math), ``weights``,
``cudagraphs`` (vLLM's CUDA-graph capture sizes and their memory), ``planner`` (the plan
for a request), ``formatting`` (the table); ``corrections`` (what
earlier starts taught about vLLM's non-KV memory) and ``vllm_report`` (vLLM's own figures
from its log). Imports only the package's base modules (errors, paths, fileio, config,
hardware); every other stage may import it. The planner's public names are importable from
here.
"""

from __future__ import annotations

from llm_release.sizing.architecture import (
    CONFIG_LIMITS,
    DTYPE_BYTES,
    MAX_CONFIG_BYTES,
    MAX_CONFIG_DEPTH,
    MAX_EXPERTS,
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_POSITIONS,
    MAX_VOCAB,
    TORCH_DTYPE_BYTES,
    GiB,
    LayerKind,
    LinearAttnDims,
    MlaDims,
    ModelArch,
    MoeDims,
    Record,
    load_config_json,
    parse_config,
)
from llm_release.sizing.cudagraphs import (
    CudaGraphs,
    capture_sizes,
    cuda_graphs,
)
from llm_release.sizing.formatting import (
    format_plan,
)
from llm_release.sizing.kv import (
    KvCapacity,
    KvGroup,
    KvLayout,
    Runtime,
    attn_bytes_per_token_layer,
    default_batched_tokens,
    default_block_size,
    kv_capacity,
    kv_dtype_bytes,
    kv_layout,
    linear_state_bytes,
    seeds_kv_bytes_per_token,
)
from llm_release.sizing.planner import (
    GPU_NON_TORCH_GIB,
    GPU_NON_TORCH_MOE_GIB,
    CapacityPlan,
    PlanRequest,
    Recommendation,
    TpOption,
    cpu_ssm_dtype_for_host,
    estimate_overhead_bytes,
    longest_fitting_len,
    online_fp8_weights,
    plan,
    request_for_serving,
    served_weights,
)
from llm_release.sizing.weights import (
    ParamCounts,
    TensorInfo,
    WeightBytes,
    WeightScheme,
    estimate_params,
    estimate_weights,
    weights_from_tensors,
)

__all__ = [
    "CONFIG_LIMITS",
    "DTYPE_BYTES",
    "GiB",
    "LayerKind",
    "LinearAttnDims",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_EXPERTS",
    "MAX_HEADS",
    "MAX_HEAD_DIM",
    "MAX_HIDDEN",
    "MAX_INTERMEDIATE",
    "MAX_LAYERS",
    "MAX_POSITIONS",
    "MAX_VOCAB",
    "MlaDims",
    "ModelArch",
    "MoeDims",
    "Record",
    "TORCH_DTYPE_BYTES",
    "load_config_json",
    "parse_config",
    "CudaGraphs",
    "capture_sizes",
    "cuda_graphs",
    "format_plan",
    "KvCapacity",
    "KvGroup",
    "KvLayout",
    "Runtime",
    "attn_bytes_per_token_layer",
    "default_batched_tokens",
    "default_block_size",
    "kv_capacity",
    "kv_dtype_bytes",
    "kv_layout",
    "linear_state_bytes",
    "seeds_kv_bytes_per_token",
    "GPU_NON_TORCH_GIB",
    "GPU_NON_TORCH_MOE_GIB",
    "CapacityPlan",
    "PlanRequest",
    "Recommendation",
    "TpOption",
    "cpu_ssm_dtype_for_host",
    "estimate_overhead_bytes",
    "longest_fitting_len",
    "online_fp8_weights",
    "plan",
    "request_for_serving",
    "served_weights",
    "ParamCounts",
    "TensorInfo",
    "WeightBytes",
    "WeightScheme",
    "estimate_params",
    "estimate_weights",
    "weights_from_tensors",
]
