"""Weight bytes: from a safetensors tensor table, or estimated from the architecture for a
scheme (bf16, FP8, W4A16 with its group scales).
"""

from __future__ import annotations

import json
import math
import re
from typing import Literal

from pydantic import Field

from llm_release.sizing.architecture import DTYPE_BYTES, ModelArch, Record, _text_config

# ---------------------------------------------------------------- weights


class WeightBytes(Record):
    """Weight bytes by dtype, and on one GPU for each tensor-parallel size."""

    source: Literal["safetensors", "estimate"]
    scheme: str = Field("as stored", description="as stored, or the scheme estimated")
    total_bytes: int
    by_dtype: dict[str, int] = Field(default_factory=dict)
    replicated_bytes: int = Field(0, description="1-D tensors (norms, biases): on every rank")
    tensors: int = 0
    rope_cache_bytes: int = Field(
        0, description="vLLM's RoPE cos/sin caches, in total_bytes (on every rank)"
    )
    left_out: dict[str, int] = Field(
        default_factory=dict,
        description="checkpoint tensors vLLM does not load for these serving settings: what "
        "they are -> bytes (not in total_bytes)",
    )
    parameters: list[int] = Field(
        default_factory=list,
        exclude=True,
        description="the sizes of the parameters vLLM allocates (q/k/v, gate/up and experts "
        "fused, vllm_parameters), for load_rounding_bytes; empty for an estimate",
    )

    def per_gpu(self, tp: int) -> int:
        sharded = (self.total_bytes - self.replicated_bytes) // tp + self.replicated_bytes
        return sharded + load_rounding_bytes(self.parameters, tp)


# vLLM loads a model with the caching allocator's max_split_size_mb at 20
# (v1/worker/gpu_worker.py load_model, _scoped_allocator_max_split, 0.26). A parameter of
# 20 MiB or more then gets a block of its own, rounded up to 2 MiB and never split (PyTorch's
# CUDACachingAllocator: get_allocation_size rounds large requests to kRoundLarge, should_split
# keeps blocks of max_split_size or more whole), and the allocated bytes vLLM logs as "Model
# loading took" count the whole block: 2.5 MiB a layer on Gemma-3-12B (a 225 MiB gate_up, a
# 112.5 MiB down projection), none on Llama-3.1-8B (every parameter a multiple of 2 MiB).
LOAD_MAX_SPLIT_BYTES = 20 << 20
LARGE_BLOCK_ROUND_BYTES = 2 << 20
# vLLM's stacked parameters (each model's stacked_params_mapping and FusedMoE's expert
# mapping): q/k/v into qkv_proj, gate/up into gate_up_proj, every expert of a layer into one
FUSED_NAMES = (
    (re.compile(r"\.[qkv]_proj\."), ".qkv_proj."),
    (re.compile(r"\.(gate|up)_proj\."), ".gate_up_proj."),
    (re.compile(r"\.experts\.\d+\."), ".experts."),
    (re.compile(r"\.experts\.w[13]\."), ".experts.w13."),  # Mixtral, PhiMoE
)


def vllm_parameters(tensors: dict[str, TensorInfo]) -> list[int]:
    """The sizes of the parameters vLLM allocates for a checkpoint's tensors (fused)."""
    fused: dict[str, int] = {}
    for name, info in tensors.items():
        for pattern, into in FUSED_NAMES:
            name = pattern.sub(into, name)
        fused[name] = fused.get(name, 0) + info.nbytes
    return sorted(fused.values())


def load_rounding_bytes(parameters: list[int], tp: int) -> int:
    """What the allocator's 2 MiB rounding of whole blocks adds on one rank (rule above)."""
    extra = 0
    for size in parameters:
        shard = size // tp
        if shard >= LOAD_MAX_SPLIT_BYTES:
            extra += -shard % LARGE_BLOCK_ROUND_BYTES
    return extra


class TensorInfo(Record):
    dtype: str
    shape: list[int]

    @property
    def nbytes(self) -> int:
        return int(math.prod(self.shape) * DTYPE_BYTES[self.dtype])


# Checkpoint tensors a vLLM server does not load (vLLM 0.26 and 0.32 alike):
# - the multi-token-prediction layers, unless speculative decoding with method "mtp" serves
#   them (then its drafter loads them): Qwen3-Next / Qwen3.5 skip "mtp." (models/qwen3_next.py
#   and qwen3_5.py load_weights, skip_prefixes=["mtp."]); LongCat-Flash's "model.mtp";
#   DeepSeek-V3, GLM-4.5 and their kin store them as the layers after the last,
#   "model.layers.{num_hidden_layers + i}." for i < num_nextn_predict_layers
#   (models/utils.py get_spec_layer_idx_from_weight_name);
# - a multimodal model's vision tower and projector under --language-model-only: its
#   modalities' limits are 0, and interfaces.py _mark_tower_model builds the tower modules
#   as placeholders with no weights.
MTP_PREFIXES = ("mtp.", "model.mtp.")
VISION_PREFIXES = tuple(
    p + name
    for p in ("", "model.")
    for name in ("visual.", "vision_tower.", "vision_model.", "multi_modal_projector.")
)


def _mtp_layer_prefixes(config: dict) -> tuple[str, ...]:
    text = _text_config(config)
    layers, extra = text.get("num_hidden_layers"), text.get("num_nextn_predict_layers")
    if not (isinstance(layers, int) and isinstance(extra, int)) or extra <= 0 or extra > 64:
        return ()
    return tuple(f"{root}layers.{layers + i}." for i in range(extra) for root in ("model.", ""))


def served_tensors(
    tensors: dict[str, TensorInfo],
    config: dict,
    *,
    language_model_only: bool = False,
    speculative_mtp: bool = False,
) -> tuple[dict[str, TensorInfo], dict[str, int]]:
    """The tensors vLLM loads for these settings, and the bytes of those it leaves out by
    kind ('MTP layers', 'vision tower'). Rules above (MTP_PREFIXES, VISION_PREFIXES)."""
    skip: dict[str, tuple[str, ...]] = {}
    if not speculative_mtp:
        skip["MTP layers (no MTP speculation)"] = MTP_PREFIXES + _mtp_layer_prefixes(config)
    if language_model_only:
        skip["vision tower (--language-model-only)"] = VISION_PREFIXES
    kept: dict[str, TensorInfo] = {}
    left: dict[str, int] = {}
    for name, info in tensors.items():
        what = next((k for k, prefixes in skip.items() if name.startswith(prefixes)), None)
        if what is None:
            kept[name] = info
        else:
            left[what] = left.get(what, 0) + info.nbytes
    return kept, left


# RoPE: vLLM keeps one cos/sin cache per distinct rotary configuration of a model (get_rope's
# _ROPE_DICT, model_executor/layers/rotary_embedding/__init__.py, 0.26 and 0.32), a buffer of
# [positions, rotary_dim] in the model's dtype allocated with the weights ("Model loading
# took" counts it). positions: max_position_embeddings; × factor for linear and dynamic
# scaling (LinearScalingRotaryEmbedding, DynamicNTKScalingRotaryEmbedding);
# original_max_position_embeddings × factor for yarn and deepseek_yarn. rotary_dim:
# head_dim × partial_rotary_factor, or MLA's qk_rope_head_dim. Gemma 3's local layers have a
# rotary configuration of their own (rope_local_base_freq).
_SCALED_FROM_MAX = ("linear", "dynamic")
_SCALED_FROM_ORIGINAL = ("yarn", "deepseek_yarn")
_MAX_ROPE_FACTOR = 1024


def _number(value: object, default: float) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok and 0 < value <= 2**40 else default


def rope_cache_bytes(config: dict, dtype_bytes: int = 2) -> int:
    """The bytes of vLLM's RoPE cos/sin caches for ``config`` (rule above); 0 when the
    config names no positions."""
    text = _text_config(config)
    max_pos = _number(text.get("max_position_embeddings"), 0)
    heads = _number(text.get("num_attention_heads"), 1)
    head_dim = _number(text.get("head_dim"), _number(text.get("hidden_size"), 0) / heads)
    if text.get("kv_lora_rank"):
        head_dim = _number(text.get("qk_rope_head_dim"), head_dim)
    if not max_pos or not head_dim:
        return 0
    params = text.get("rope_parameters")
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        sets = list(params.values())  # one per layer type (transformers 5)
    elif isinstance(params, dict):
        sets = [params]
    else:
        scaling = text.get("rope_scaling")
        sets = [dict(scaling) if isinstance(scaling, dict) else {}]
        sets[0].setdefault("rope_theta", text.get("rope_theta"))
        if "rope_local_base_freq" in text:
            sets.append({"rope_type": "default", "rope_theta": text["rope_local_base_freq"]})
    seen: set[str] = set()
    total = 0
    for p in sets:
        key = json.dumps(p, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        kind = p.get("rope_type") or p.get("type") or "default"
        factor = min(_number(p.get("factor"), 1.0), _MAX_ROPE_FACTOR)
        partial = _number(p.get("partial_rotary_factor", text.get("partial_rotary_factor")), 1.0)
        positions = max_pos
        if kind in _SCALED_FROM_MAX:
            positions = max_pos * factor
        elif kind in _SCALED_FROM_ORIGINAL:
            positions = _number(p.get("original_max_position_embeddings"), max_pos) * factor
        total += int(positions) * int(head_dim * min(partial, 1.0)) * dtype_bytes
    return total


def weights_from_tensors(
    tensors: dict[str, TensorInfo],
    config: dict | None = None,
    *,
    language_model_only: bool = False,
    speculative_mtp: bool = False,
    dtype_bytes: int = 2,
) -> WeightBytes:
    """The weights vLLM holds for a checkpoint's tensor table; with the checkpoint's
    ``config``, only the tensors it loads for these settings (served_tensors) and its RoPE
    caches in the served dtype (rope_cache_bytes), on every tensor-parallel rank."""
    if config is None:
        return _sum_tensors(tensors)
    tensors, left = served_tensors(
        tensors, config, language_model_only=language_model_only, speculative_mtp=speculative_mtp
    )
    weights = _sum_tensors(tensors)
    rope = rope_cache_bytes(config, dtype_bytes)
    return weights.model_copy(
        update={
            "left_out": left,
            "rope_cache_bytes": rope,
            "total_bytes": weights.total_bytes + rope,
            "replicated_bytes": weights.replicated_bytes + rope,
        }
    )


def _sum_tensors(tensors: dict[str, TensorInfo]) -> WeightBytes:
    by_dtype: dict[str, int] = {}
    replicated = 0
    for info in tensors.values():
        by_dtype[info.dtype] = by_dtype.get(info.dtype, 0) + info.nbytes
        if len(info.shape) <= 1:
            replicated += info.nbytes
    return WeightBytes(
        source="safetensors",
        total_bytes=sum(by_dtype.values()),
        by_dtype=dict(sorted(by_dtype.items())),
        replicated_bytes=replicated,
        tensors=len(tensors),
        parameters=vllm_parameters(tensors),
    )


WeightScheme = Literal["bf16", "fp8", "w4a16"]


class ParamCounts(Record):
    """Parameters by role, from the config (no checkpoint at hand)."""

    embedding: int
    lm_head: int
    attention: int
    linear_attention: int
    mlp: int
    experts: int
    router: int
    norms_and_small: int

    @property
    def total(self) -> int:
        return sum(self.model_dump().values())

    @property
    def quantizable(self) -> int:
        """Linear layers llm-compressor quantizes (not embeddings, lm_head, router, norms)."""
        return self.attention + self.linear_attention + self.mlp + self.experts


def attention_layer_params(arch: ModelArch) -> int:
    """One full-attention layer's projections (MLA's low-rank ones for DeepSeek)."""
    h = arch.hidden_size
    nh, nkv, hd = arch.num_attention_heads, arch.num_kv_heads, arch.head_dim
    if arch.mla:
        m = arch.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * nh * qk) if m.q_lora_rank else h * nh * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * nh * (
            m.qk_nope_head_dim + m.v_head_dim
        )
        return q + kv + nh * m.v_head_dim * h
    # q (twice as wide with Qwen3.5's output gate), k, v, o
    gate = 2 if arch.linear and arch.linear.kind == "gated_deltanet" else 1
    return h * nh * hd * gate + 2 * h * nkv * hd + nh * hd * h


def moe_layer_params(arch: ModelArch) -> tuple[int, int, int]:
    """One MoE layer's parameters: its routed experts, its shared expert, its router."""
    moe, h = arch.moe, arch.hidden_size
    assert moe is not None
    experts = moe.num_experts * 3 * h * moe.moe_intermediate_size
    return experts, 3 * h * moe.shared_intermediate_size, h * moe.num_experts


def mtp_params(arch: ModelArch) -> int:
    """The multi-token-prediction layers vLLM loads for MTP speculation: each a decoder
    layer (full attention, the model's MoE or MLP), the projection of [embedding; hidden]
    back to hidden and its norms. The drafter shares the model's embedding and lm_head
    (vLLM's proposer takes the target's), so neither is counted again."""
    h = arch.hidden_size
    mlp = sum(moe_layer_params(arch)) if arch.moe else 3 * h * arch.intermediate_size
    return arch.mtp_layers * (attention_layer_params(arch) + mlp + 2 * h * h + 5 * h)


def estimate_params(arch: ModelArch) -> ParamCounts:
    """Parameter counts by role for the architectures the planner knows (an estimate)."""
    h, v = arch.hidden_size, arch.vocab_size
    full = arch.count("full") + arch.count("sliding")
    attn_layer = attention_layer_params(arch)
    lin_layer = 0
    if arch.linear and arch.linear.kind != "gated_deltanet":
        lin = arch.linear
        inner, groups = lin.intermediate_size, lin.n_groups
        if lin.kind == "mamba2":  # in_proj (z, x, B, C, dt), out_proj
            lin_layer = h * (2 * inner + 2 * groups * lin.state_size + lin.num_heads) + inner * h
        else:  # in_proj (x, z), x_proj (dt rank ~ h/16, B, C), dt_proj, out_proj
            rank = -(-h // 16)
            lin_layer = h * 2 * inner + inner * (rank + 2 * lin.state_size) + rank * inner
            lin_layer += inner * h
    elif arch.linear:
        lin = arch.linear
        key, value = lin.num_k_heads * lin.head_k_dim, lin.num_v_heads * lin.head_v_dim
        # in_proj qkvz + ba, out_proj (Qwen3-Next GatedDeltaNet)
        lin_layer = h * (2 * key + 2 * value) + h * 2 * lin.num_v_heads + value * h
    mlp = experts = router = 0
    layers = arch.num_layers
    if arch.moe:
        moe_layers = layers - arch.moe.dense_layers
        per_experts, per_shared, per_router = moe_layer_params(arch)
        experts, router = moe_layers * per_experts, moe_layers * per_router
        mlp = arch.moe.dense_layers * 3 * h * arch.intermediate_size + moe_layers * per_shared
    else:
        mlp = layers * 3 * h * arch.intermediate_size
    small = layers * 2 * h + h
    if arch.linear:
        lin = arch.linear
        if lin.kind == "gated_deltanet":
            conv_dim = 2 * lin.num_k_heads * lin.head_k_dim + lin.num_v_heads * lin.head_v_dim
            heads = lin.num_v_heads
        else:  # the conv over x (and B, C), A, D and dt_bias
            conv_dim = lin.intermediate_size + 2 * lin.n_groups * lin.state_size
            heads = lin.num_heads or lin.intermediate_size * lin.state_size
        small += arch.count("linear") * (conv_dim * lin.conv_kernel + 2 * heads)
    return ParamCounts(
        embedding=v * h,
        lm_head=0 if arch.tie_word_embeddings else v * h,
        attention=full * attn_layer,
        linear_attention=arch.count("linear") * lin_layer,
        mlp=mlp,
        experts=experts,
        router=router,
        norms_and_small=small,
    )


def estimate_weights(
    arch: ModelArch, scheme: WeightScheme, group_size: int = 128, *, with_mtp: bool = False
) -> WeightBytes:
    """Weight bytes for a scheme from parameter counts: bf16 everywhere, or the linear
    layers at 1 byte (FP8, per-channel scales ignored: < 0.1%) or 4 bits plus one bf16
    scale per ``group_size`` weights (W4A16); embeddings, lm_head, router and norms bf16.
    ``with_mtp``: the MTP layers too (MTP speculation loads them), in bf16."""
    p = estimate_params(arch)
    rest = p.total - p.quantizable
    if scheme == "bf16":
        by = {"BF16": p.total * 2}
    elif scheme == "fp8":
        by = {"BF16": rest * 2, "F8_E4M3": p.quantizable}
    else:
        by = {"BF16": rest * 2 + p.quantizable * 2 // group_size, "I4": p.quantizable // 2}
    if with_mtp and arch.mtp_layers:
        by["BF16"] += mtp_params(arch) * 2
    return WeightBytes(
        source="estimate",
        scheme=scheme,
        total_bytes=sum(by.values()),
        by_dtype=by,
        replicated_bytes=p.norms_and_small * 2,
    )
