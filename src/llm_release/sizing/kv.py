"""KV-cache math the way vLLM 0.32 does it: bytes per token and layer, block layout per
attention kind (full, sliding window, MLA, linear state), and the capacity of a budget.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from llm_release.errors import ConfigError
from llm_release.sizing.architecture import LayerKind, ModelArch, Record
from llm_release.sizing.cudagraphs import large_gpu

# ---------------------------------------------------------------- KV math (vLLM 0.32)


class Runtime(Record):
    """The serving settings that change the KV arithmetic."""

    device: Literal["gpu", "cpu"] = "gpu"
    tensor_parallel_size: int = Field(1, ge=1)
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    block_size: int | None = Field(None, description="None: vLLM's default (GPU 16, CPU 128)")
    max_num_batched_tokens: int | None = Field(
        None,
        description="None: vLLM's API-server default (GPU ≥160 GiB: 16384, ≥70 GiB and not "
        "an A100: 8192, else 2048; CPU: 2048 × TP)",
    )
    enable_prefix_caching: bool = True
    gpu_memory_gib: float = 80.0
    gpu_name: str = Field("", description="the GPU's name: vLLM gives an A100 smaller defaults")
    async_scheduling: bool | None = Field(
        None,
        description="vLLM's scheduler overlapping two steps (None: its default, on for a "
        "GPU and off on a CPU, as vLLM 0.32 decides it for the models planned here)",
    )
    speculative_tokens: int = Field(
        0,
        ge=0,
        description="tokens drafted a step (any speculation method): each linear-attention "
        "layer keeps one more state block a request per drafted token (vLLM's "
        "MambaSpec.num_speculative_blocks)",
    )
    drafter_attention_layers: int = Field(
        0,
        ge=0,
        description="attention layers of an MTP drafter: their KV sits beside the model's "
        "full-attention layers, with the same page (vLLM registers the drafter's layers "
        "in the same KV-cache spec)",
    )


def kv_dtype_bytes(arch: ModelArch, runtime: Runtime) -> int:
    return 1 if runtime.kv_cache_dtype == "fp8" else arch.dtype_bytes


def default_block_size(arch: ModelArch, runtime: Runtime) -> int:
    if runtime.block_size:
        return runtime.block_size
    if runtime.device == "cpu":
        return 16 if arch.mla else 128  # vllm/platforms/cpu.py check_and_update_config
    return 16


def default_batched_tokens(runtime: Runtime) -> int:
    if runtime.max_num_batched_tokens:
        return runtime.max_num_batched_tokens
    if runtime.device == "cpu":
        return 2048 * runtime.tensor_parallel_size  # arg_utils.get_batch_defaults, CPU
    if runtime.gpu_memory_gib >= 160:  # B200-class: arg_utils.get_batch_defaults
        return 16384
    return 8192 if large_gpu(runtime.gpu_memory_gib, runtime.gpu_name) else 2048


def in_flight_tokens(runtime: Runtime) -> int:
    """vLLM's ``max_in_flight_tokens`` (config/vllm.py, 0.32): the tokens scheduled but not
    yet settled, ``max_concurrent_batches × max_num_batched_tokens``; two batches when the
    scheduler runs asynchronously (its default on a GPU with one pipeline stage: the V1
    runner 2, the V2 runner pipeline stages + 1), one otherwise (vLLM CPU, whose logs the
    planner matches with one). A sliding-window layer keeps the blocks of these tokens
    beside its window, so a GPU request holds twice the batch there."""
    asynchronous = runtime.async_scheduling
    if asynchronous is None:
        asynchronous = runtime.device == "gpu"
    return (2 if asynchronous else 1) * default_batched_tokens(runtime)


def attn_bytes_per_token_layer(arch: ModelArch, runtime: Runtime) -> int:
    """One attention layer's KV bytes per token on one tensor-parallel rank."""
    nbytes = kv_dtype_bytes(arch, runtime)
    if arch.mla:
        # MLA stores one latent per token, replicated on every TP rank (num_kv_heads = 1).
        return (arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim) * nbytes
    heads = max(1, arch.num_kv_heads // runtime.tensor_parallel_size)  # replicated when < TP
    return heads * arch.head_dim * 2 * nbytes


def linear_state_bytes(arch: ModelArch, runtime: Runtime) -> tuple[int, int]:
    """(conv, recurrent) state bytes of one linear-attention layer for one sequence, one
    rank, as vllm/model_executor/layers/mamba/mamba_utils.py shapes them:

    - gated_delta_net_state_shape: conv = (2·k_heads·head_k + v_heads·head_v)/TP ×
      (kernel − 1), recurrent = v_heads/TP × head_v × head_k;
    - mamba2_state_shape: groups padded up to TP when TP does not divide them
      (extra_groups_for_head_shards), conv = (inner + 2·groups·state)/TP × (kernel − 1),
      recurrent = heads/TP × head_dim × state;
    - mamba1_state_shape: conv = inner/TP × (kernel − 1), recurrent = inner/TP × state.

    The conv state in the model dtype, the recurrent one in the SSM dtype.
    """
    lin = arch.linear
    assert lin is not None
    tp = runtime.tensor_parallel_size
    if lin.kind == "mamba2":
        groups = lin.n_groups if lin.n_groups % tp == 0 else tp  # vLLM: + (tp − groups)
        conv_dim = lin.intermediate_size + 2 * groups * lin.state_size
        recurrent_elems = lin.num_heads // tp * lin.head_dim * lin.state_size
    elif lin.kind == "mamba1":
        conv_dim = lin.intermediate_size
        recurrent_elems = lin.intermediate_size // tp * lin.state_size
    else:
        conv_dim = lin.head_k_dim * lin.num_k_heads * 2 + lin.head_v_dim * lin.num_v_heads
        recurrent_elems = lin.num_v_heads // tp * lin.head_v_dim * lin.head_k_dim
    conv = conv_dim // tp * (lin.conv_kernel - 1) * arch.dtype_bytes
    return conv, recurrent_elems * lin.ssm_dtype_bytes


class KvGroup(Record):
    kind: LayerKind
    layers: int = Field(description="layers of the model in this group (before padding)")
    blocks_per_request: int


class KvLayout(Record):
    """vLLM's KV-cache layout for one TP rank: groups, page, block."""

    block_size: int
    page_bytes: int = Field(description="one layer's page (block_size tokens)")
    layers_per_group: int
    bytes_per_block: int = Field(description="one block of the shared pool, all groups")
    groups: list[KvGroup]
    attention_bytes_per_token: int = Field(
        description="KV bytes per token summed over attention layers (one rank)"
    )
    state_bytes_per_sequence: int = Field(0, description="linear-attention state per sequence")
    blocks_per_request: int = Field(description="at max_model_len, summed over groups")
    notes: list[str] = Field(default_factory=list)


def kv_layout(
    arch: ModelArch, runtime: Runtime, max_model_len: int, running: bool = False
) -> KvLayout:
    """The KV cache's layout for requests of ``max_model_len`` tokens: what vLLM reserves a
    request (its admission and concurrency figures), or with ``running`` what one request of
    that length holds while it runs (a linear-attention group's second state block, in
    prefix caching's align mode, only once the request crosses a block boundary)."""
    if max_model_len < 1:
        raise ConfigError("max_model_len must be at least 1")
    notes: list[str] = []
    per_tok = attn_bytes_per_token_layer(arch, runtime)
    block = default_block_size(arch, runtime)
    state = 0
    if arch.linear and arch.count("linear"):
        conv, recurrent = linear_state_bytes(arch, runtime)
        state = conv + recurrent
        # platforms/interface.py _align_hybrid_block_size: the attention block grows until
        # its page holds one GDN state; the GDN page is padded up to the attention page.
        align = max(32 if runtime.device == "cpu" else 16, block)
        needed = align * math.ceil(state / (align * per_tok))
        if needed > block:
            notes.append(
                f"attention block size raised from {block} tokens until one page holds one "
                "linear-attention state, as vLLM does (the state page is padded to it): see "
                "the block column"
            )
            block = needed
    page = block * per_tok
    counts = {k: arch.count(k) for k in ("full", "sliding", "linear") if arch.count(k)}
    if runtime.drafter_attention_layers:
        # an MTP layer's attention is the model's own full attention (MLA for DeepSeek)
        counts["full"] = counts.get("full", 0) + runtime.drafter_attention_layers
        notes.append(
            f"{runtime.drafter_attention_layers} MTP drafter attention layer(s) in the KV "
            "cache beside the model's full-attention layers"
        )
    # kv_cache_utils._get_kv_cache_groups_uniform_page_size: group size is the smallest
    # kind's layer count, unless the largest is < 1.5× it (then the largest).
    if len(counts) == 1:
        group_size = next(iter(counts.values()))
    else:
        group_size = min(counts.values())
        if max(counts.values()) < group_size * 1.5:
            group_size = max(counts.values())
    in_flight = in_flight_tokens(runtime)
    groups: list[KvGroup] = []
    for kind, n in counts.items():
        if kind == "full":
            need = math.ceil(max_model_len / block)
        elif kind == "sliding":
            assert arch.sliding_window
            # kv_cache_interface.py SlidingWindowSpec.max_admission_blocks_per_request: the
            # window's last tokens and the in-flight ones, + 1 (the window need not start
            # on a block boundary)
            tokens = min(arch.sliding_window - 1 + in_flight, max_model_len)
            need = math.ceil(tokens / block) + 1
        else:
            # mamba_cache_mode align / none, and one more state a drafted token
            # (kv_cache_interface.MambaSpec.max_memory_usage_bytes: align reserves 2). A
            # running request holds one state block a group and takes the second only while
            # it crosses a block boundary (single_type_kv_cache_manager.MambaManager, vLLM
            # 0.26: allocate_new_blocks, remove_skipped_blocks frees the old one)
            crosses = runtime.enable_prefix_caching and (not running or max_model_len > block)
            need = (2 if crosses else 1) + runtime.speculative_tokens
        if kind == "sliding" and tokens < max_model_len:
            notes.append(
                f"sliding-window layers hold {tokens:,} tokens a request: the window "
                f"({arch.sliding_window:,}) − 1 + {in_flight:,} in flight "
                f"({in_flight // default_batched_tokens(runtime)} batch(es) of "
                f"max_num_batched_tokens, as vLLM 0.32 reserves them)"
            )
        if kind == "linear" and runtime.speculative_tokens:
            notes.append(
                f"speculative decoding: each linear-attention group keeps {need} state "
                f"blocks a request ({runtime.speculative_tokens} for the drafted tokens)"
            )
        for _ in range(math.ceil(n / group_size)):
            groups.append(KvGroup(kind=kind, layers=n, blocks_per_request=need))
    padded = sum(group_size * math.ceil(n / group_size) - n for n in counts.values())
    if padded:
        notes.append(f"{padded} padding layer(s) in the KV groups, as vLLM adds them")
    attn_layers = counts.get("full", 0) + counts.get("sliding", 0)
    return KvLayout(
        block_size=block,
        page_bytes=page,
        layers_per_group=group_size,
        bytes_per_block=group_size * page,
        groups=groups,
        attention_bytes_per_token=attn_layers * per_tok,
        state_bytes_per_sequence=counts.get("linear", 0) * state,
        blocks_per_request=sum(g.blocks_per_request for g in groups),
        notes=notes,
    )


class KvCapacity(Record):
    kv_memory_bytes: int
    num_blocks: int
    max_concurrency: float = Field(description="requests of max_model_len tokens at once")
    kv_cache_tokens: int = Field(
        description="as vLLM logs it: int(max_concurrency × max_model_len)"
    )


def kv_capacity(layout: KvLayout, kv_memory_bytes: int, max_model_len: int) -> KvCapacity:
    blocks = max(0, kv_memory_bytes) // layout.bytes_per_block
    concurrency = blocks / layout.blocks_per_request
    return KvCapacity(
        kv_memory_bytes=max(0, kv_memory_bytes),
        num_blocks=blocks,
        max_concurrency=concurrency,
        kv_cache_tokens=int(concurrency * max_model_len),
    )


def seeds_kv_bytes_per_token(arch: ModelArch) -> int:
    """The seeds' formula, kept to show how far off it is: hidden × layers × 4 × bytes."""
    return arch.hidden_size * arch.num_layers * 4 * arch.dtype_bytes
