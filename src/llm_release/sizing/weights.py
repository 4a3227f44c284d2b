"""Weight bytes: from a safetensors tensor table, or estimated from the architecture for a
scheme (bf16, FP8, W4A16 with its group scales).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from llm_release.sizing.architecture import DTYPE_BYTES, ModelArch, Record

# ---------------------------------------------------------------- weights


class WeightBytes(Record):
    """Weight bytes by dtype, and on one GPU for each tensor-parallel size."""

    source: Literal["safetensors", "estimate"]
    scheme: str = Field("as stored", description="as stored, or the scheme estimated")
    total_bytes: int
    by_dtype: dict[str, int] = Field(default_factory=dict)
    replicated_bytes: int = Field(0, description="1-D tensors (norms, biases): on every rank")
    tensors: int = 0

    def per_gpu(self, tp: int) -> int:
        return (self.total_bytes - self.replicated_bytes) // tp + self.replicated_bytes


class TensorInfo(Record):
    dtype: str
    shape: list[int]

    @property
    def nbytes(self) -> int:
        return int(math.prod(self.shape) * DTYPE_BYTES[self.dtype])


def weights_from_tensors(tensors: dict[str, TensorInfo]) -> WeightBytes:
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


def estimate_params(arch: ModelArch) -> ParamCounts:
    """Parameter counts by role for the architectures the planner knows (an estimate)."""
    h, v = arch.hidden_size, arch.vocab_size
    full = arch.count("full") + arch.count("sliding")
    nh, nkv, hd = arch.num_attention_heads, arch.num_kv_heads, arch.head_dim
    if arch.mla:
        m = arch.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = (h * m.q_lora_rank + m.q_lora_rank * nh * qk) if m.q_lora_rank else h * nh * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * nh * (
            m.qk_nope_head_dim + m.v_head_dim
        )
        attn_layer = q + kv + nh * m.v_head_dim * h
    else:
        # q (twice as wide with Qwen3.5's output gate), k, v, o
        gate = 2 if arch.linear else 1
        attn_layer = h * nh * hd * gate + 2 * h * nkv * hd + nh * hd * h
    lin_layer = 0
    if arch.linear:
        lin = arch.linear
        key, value = lin.num_k_heads * lin.head_k_dim, lin.num_v_heads * lin.head_v_dim
        # in_proj qkvz + ba, out_proj (Qwen3-Next GatedDeltaNet)
        lin_layer = h * (2 * key + 2 * value) + h * 2 * lin.num_v_heads + value * h
    mlp = experts = router = 0
    layers = arch.num_layers
    if arch.moe:
        moe = arch.moe
        moe_layers = layers - moe.dense_layers
        experts = moe_layers * moe.num_experts * 3 * h * moe.moe_intermediate_size
        mlp = moe.dense_layers * 3 * h * arch.intermediate_size
        mlp += moe_layers * 3 * h * moe.shared_intermediate_size
        router = moe_layers * h * moe.num_experts
    else:
        mlp = layers * 3 * h * arch.intermediate_size
    small = layers * 2 * h + h
    if arch.linear:
        lin = arch.linear
        conv_dim = 2 * lin.num_k_heads * lin.head_k_dim + lin.num_v_heads * lin.head_v_dim
        small += arch.count("linear") * (conv_dim * lin.conv_kernel + 2 * lin.num_v_heads)
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


def estimate_weights(arch: ModelArch, scheme: WeightScheme, group_size: int = 128) -> WeightBytes:
    """Weight bytes for a scheme from parameter counts: bf16 everywhere, or the linear
    layers at 1 byte (FP8, per-channel scales ignored: < 0.1%) or 4 bits plus one bf16
    scale per ``group_size`` weights (W4A16); embeddings, lm_head, router and norms bf16."""
    p = estimate_params(arch)
    rest = p.total - p.quantizable
    if scheme == "bf16":
        by = {"BF16": p.total * 2}
    elif scheme == "fp8":
        by = {"BF16": rest * 2, "F8_E4M3": p.quantizable}
    else:
        by = {"BF16": rest * 2 + p.quantizable * 2 // group_size, "I4": p.quantizable // 2}
    return WeightBytes(
        source="estimate",
        scheme=scheme,
        total_bytes=sum(by.values()),
        by_dtype=by,
        replicated_bytes=p.norms_and_small * 2,
    )
