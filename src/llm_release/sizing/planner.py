"""Size before you serve: weights, KV cache and concurrency, computed the way vLLM 0.32 does.

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
  attention group, ``cdiv(min(window − 1 + max_num_batched_tokens, max_model_len),
  block_size) + 1`` of a sliding-window group, and 1 (2 with prefix caching, "align" mode)
  of a Mamba/GDN group, whose page is padded to the attention page;
* max concurrency = ``num_blocks / blocks_per_request``; the "KV cache size" vLLM logs is
  ``int(max_concurrency × max_model_len)`` tokens.

GPU memory for KV is ``memory × gpu_memory_utilization − weights − non-KV overhead``; the
overhead (activations of one ``max_num_batched_tokens`` step, CUDA graphs, NCCL/cuBLAS
workspaces) is an estimate here, to be corrected from vLLM's own logs. On CPU the KV
memory is exactly ``VLLM_CPU_KVCACHE_SPACE`` GiB and the block size is 128 (16 for MLA).
"""

from __future__ import annotations

import json
import math
from typing import Literal

from llm_release.sizing.errors import ConfigError
from pydantic import BaseModel, ConfigDict, Field

GiB = 1 << 30

DTYPE_BYTES: dict[str, float] = {
    # safetensors dtype names (and the torch spellings configs use)
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "BOOL": 1,
    "F4": 0.5,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
}
TORCH_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

LayerKind = Literal["full", "sliding", "linear"]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MlaDims(Record):
    kv_lora_rank: int = Field(gt=0)
    qk_rope_head_dim: int = Field(ge=0)
    qk_nope_head_dim: int = Field(0, ge=0)
    v_head_dim: int = Field(0, ge=0)
    q_lora_rank: int | None = None


class LinearAttnDims(Record):
    """Gated DeltaNet (Qwen3-Next / Qwen3.5) sizes: the per-sequence state of one layer."""

    num_k_heads: int = Field(gt=0)
    num_v_heads: int = Field(gt=0)
    head_k_dim: int = Field(gt=0)
    head_v_dim: int = Field(gt=0)
    conv_kernel: int = Field(gt=0)
    ssm_dtype_bytes: int = Field(description="recurrent state dtype (mamba_ssm_dtype, else model)")


class MoeDims(Record):
    num_experts: int = Field(gt=0)
    experts_per_token: int = Field(gt=0)
    moe_intermediate_size: int = Field(gt=0)
    shared_intermediate_size: int = Field(0, ge=0)
    dense_layers: int = Field(0, ge=0, description="leading layers with a dense MLP")


class ModelArch(Record):
    """What the planner needs from a model's config.json (text part)."""

    architecture: str
    model_type: str
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(0, ge=0)
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    num_attention_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    dtype_bytes: int = Field(2, description="torch_dtype of the checkpoint (KV 'auto' follows it)")
    dtype_name: str = "bfloat16"
    max_position_embeddings: int | None = None
    layer_kinds: list[LayerKind]
    sliding_window: int | None = None
    mla: MlaDims | None = None
    linear: LinearAttnDims | None = None
    moe: MoeDims | None = None

    def count(self, kind: LayerKind) -> int:
        return sum(1 for k in self.layer_kinds if k == kind)


# ---------------------------------------------------------------- bounds on config.json
#
# config.json comes from a hub, which is not trusted: every number the planner reads must be
# a JSON integer within a bound, checked before any list or loop is sized by it
# (num_hidden_layers 1e9 with a sliding-window pattern used to take 34 s of CPU, then
# gigabytes). The bounds are 4-8x the largest public models of 2025: Llama 3.1 405B
# (126 layers, 128 heads, hidden 16,384, intermediate 53,248), DeepSeek-V3 / Kimi K2
# (61 layers, 256 / 384 experts, MLA latent 512), Qwen3.5-397B-A17B (60 layers, 512
# experts, vocab 248,320), Gemma 3 (vocab 262,144) and Llama 4 Scout
# (max_position_embeddings 10,485,760, which is why positions go to 2**24, not 10M).
# Within them the worst config plans in well under a second and a few MB
# (tests/unit/test_planner_bounds.py).
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_EXPERTS = 4096
MAX_HIDDEN = 65_536
MAX_INTERMEDIATE = 1 << 20  # 1,048,576: 20x Llama 405B's 53,248
MAX_HEAD_DIM = 8192  # real: 64..512
MAX_VOCAB = 1 << 21  # 2,097,152: 8x Gemma 3's 262,144
MAX_POSITIONS = 1 << 24  # 16,777,216: Llama 4 Scout's 10,485,760 with room
# A real config.json is 1-100 KB (a quantization_config listing every ignored layer of a
# 397B MoE stays far below 1 MB); nesting is 3-5 levels (quantization_config groups).
MAX_CONFIG_BYTES = 4 << 20
MAX_CONFIG_DEPTH = 32
CONFIG_LIMITS: dict[str, int] = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers"), MAX_LAYERS),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model"), MAX_HIDDEN),
    **dict.fromkeys(("num_attention_heads", "n_head"), MAX_HEADS),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads"), MAX_HEADS),
    **dict.fromkeys(("linear_num_key_heads", "linear_num_value_heads"), MAX_HEADS),
    "vocab_size": MAX_VOCAB,
    **dict.fromkeys(
        ("head_dim", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"), MAX_HEAD_DIM
    ),
    **dict.fromkeys(("linear_key_head_dim", "linear_value_head_dim"), MAX_HEAD_DIM),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), MAX_HIDDEN),
    **dict.fromkeys(
        ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size"),
        MAX_INTERMEDIATE,
    ),
    **dict.fromkeys(
        (
            "num_experts",
            "n_routed_experts",
            "num_local_experts",
            "num_experts_per_tok",
            "moe_topk",
            "n_shared_experts",
        ),
        MAX_EXPERTS,
    ),
    **dict.fromkeys(
        ("first_k_dense_replace", "full_attention_interval", "sliding_window_pattern"),
        MAX_LAYERS,
    ),
    "linear_conv_kernel_dim": 256,
    **dict.fromkeys(("sliding_window", "max_position_embeddings"), MAX_POSITIONS),
}
_LIMIT_HINT = (
    "the config is damaged or hostile: no public model comes near the planner's limits "
    "(llm_release.sizing.CONFIG_LIMITS)"
)


class _NonFinite:
    """A placeholder for NaN / Infinity / a float that overflows, so the error names its field."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _float(text: str) -> float | _NonFinite:
    value = float(text)
    return value if math.isfinite(value) else _NonFinite(text[:40])


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def load_config_json(raw: bytes, name: str = "config.json") -> dict:
    """Parse a ``config.json`` from a hub or folder, bounded before and after parsing: at
    most MAX_CONFIG_BYTES, nesting at most MAX_CONFIG_DEPTH, only finite numbers (JSON has
    no NaN or Infinity; Python's parser accepts them, and 1e400 overflows to inf)."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"{name} is {len(raw):,} bytes, over the planner's limit of {MAX_CONFIG_BYTES:,}",
            hint="a transformers config.json is a few KB; the repo is damaged or hostile",
        )
    try:
        data = json.loads(raw, parse_constant=_NonFinite, parse_float=_float)
    except RecursionError:
        raise ConfigError(
            f"{name} is nested deeper than the planner's limit of {MAX_CONFIG_DEPTH} levels",
            hint=_LIMIT_HINT,
        ) from None
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, over-long integers
        raise ConfigError(
            f"{name} is not valid JSON ({' '.join(str(exc).split())[:120]})",
            hint="the repo is damaged, or the file is not a transformers config",
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name} is not a JSON object")
    _check_tree(data, name)
    return data


def _check_tree(data: dict, name: str) -> None:
    """Nesting depth and non-finite numbers, depth-first with one iterator per level (no
    recursion to exhaust, memory of the depth only)."""
    stack = [iter(data.items())]
    path: list[str] = []  # the keys of the containers entered below the top
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            if path:
                path.pop()
            continue
        key, value = entry
        if isinstance(value, _NonFinite):
            field = ".".join([*path, str(key)])
            raise ConfigError(
                f"{name} field {field[:80]!r} is {value.text}, not a finite number",
                hint="JSON has no NaN or Infinity; the config is damaged or hostile",
            )
        if isinstance(value, dict | list):
            if len(stack) + 1 > MAX_CONFIG_DEPTH:
                field = ".".join([*path, str(key)])
                raise ConfigError(
                    f"{name} field {field[:80]!r} is nested deeper than the planner's limit "
                    f"of {MAX_CONFIG_DEPTH} levels",
                    hint=_LIMIT_HINT,
                )
            path.append(str(key))
            stack.append(iter(value.items() if isinstance(value, dict) else enumerate(value)))


def _text_config(config: dict) -> dict:
    text = config.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" in text:
        merged = {k: v for k, v in config.items() if k != "text_config"}
        merged.update(text)
        merged.setdefault("architectures", config.get("architectures"))
        return merged
    return config


def _int(cfg: dict, *keys: str, default: int | None = None) -> int | None:
    """The first of ``keys`` present: a JSON integer in 0..its limit (CONFIG_LIMITS)."""
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        limit = CONFIG_LIMITS.get(key, MAX_POSITIONS)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(
                f"config.json field {key!r} is {_show(value)}, not an integer (0..{limit:,})",
                hint="the config is damaged or not a transformers config",
            )
        if not 0 <= value <= limit:
            raise ConfigError(
                f"config.json field {key!r} is {_show(value)}, outside 0..{limit:,} "
                "(the planner's limit)",
                hint=_LIMIT_HINT,
            )
        return value
    return default


def _text(cfg: dict, *keys: str, default: str) -> str:
    """The first of ``keys`` present and not empty: a string of at most 200 characters."""
    for key in keys:
        value = cfg.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str) or len(value) > 200:
            raise ConfigError(
                f"config.json field {key!r} is {_show(value)}, not a name of up to 200 characters",
                hint="the config is damaged or not a transformers config",
            )
        return value
    return default


def _dtype_bytes(name: object, default: int = 2) -> int:
    if not isinstance(name, str):
        return default
    return int(TORCH_DTYPE_BYTES.get(name.replace("torch.", ""), default))


def parse_config(config: dict) -> ModelArch:
    """The sizing-relevant part of a transformers ``config.json`` (dict)."""
    if not isinstance(config, dict):
        raise ConfigError("config.json is not a JSON object")
    cfg = _text_config(config)
    archs = cfg.get("architectures") or ["?"]
    if not isinstance(archs, list) or not isinstance(archs[0], str):
        raise ConfigError(
            f"config.json field 'architectures' is {_show(archs)}, not a list of class names",
            hint="the config is damaged or not a transformers config",
        )
    layers = _int(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _int(cfg, "hidden_size", "n_embd", "d_model")
    heads = _int(cfg, "num_attention_heads", "n_head")
    vocab = _int(cfg, "vocab_size")
    if not (layers and hidden and heads and vocab):
        raise ConfigError(
            "config.json lacks num_hidden_layers / hidden_size / num_attention_heads / vocab_size",
            hint="point the planner at a decoder-only transformers model",
        )
    kv_heads = _int(cfg, "num_key_value_heads", "num_kv_heads", default=heads) or heads
    head_dim = _int(cfg, "head_dim", default=None) or hidden // heads
    if head_dim < 1:
        raise ConfigError(
            f"config.json has num_attention_heads {heads:,} > hidden_size {hidden:,} and no "
            "head_dim",
            hint="the config is damaged or not a transformers config",
        )
    dtype_name = _text(cfg, "torch_dtype", "dtype", default="bfloat16").replace("torch.", "")
    mla = None
    if cfg.get("kv_lora_rank"):
        mla = MlaDims(
            kv_lora_rank=_int(cfg, "kv_lora_rank"),
            qk_rope_head_dim=_int(cfg, "qk_rope_head_dim", default=0),
            qk_nope_head_dim=_int(cfg, "qk_nope_head_dim", default=0),
            v_head_dim=_int(cfg, "v_head_dim", default=0),
            q_lora_rank=_int(cfg, "q_lora_rank", default=None),
        )
    linear = None
    if cfg.get("linear_num_value_heads"):
        ssm = cfg.get("mamba_ssm_dtype")
        linear = LinearAttnDims(
            num_k_heads=_int(cfg, "linear_num_key_heads"),
            num_v_heads=_int(cfg, "linear_num_value_heads"),
            head_k_dim=_int(cfg, "linear_key_head_dim"),
            head_v_dim=_int(cfg, "linear_value_head_dim"),
            conv_kernel=_int(cfg, "linear_conv_kernel_dim", default=4),
            # vLLM 0.32 applies mamba_ssm_dtype for Qwen3.5 (Qwen3_5*Config.verify_and_update_config);
            # Qwen3-Next has no such field and keeps the model dtype.
            ssm_dtype_bytes=_dtype_bytes(ssm, _dtype_bytes(dtype_name)),
        )
    window = _int(cfg, "sliding_window", default=None) or None
    if cfg.get("use_sliding_window") is False:  # Qwen2-style: the window is off
        window = None
    kinds = _layer_kinds(cfg, layers, window)
    if "sliding" not in kinds:
        window = None
    moe = None
    experts = _int(cfg, "num_experts", "n_routed_experts", "num_local_experts", default=0)
    if experts:
        per_token = _int(cfg, "num_experts_per_tok", "moe_topk", default=1) or 1
        dense = _int(cfg, "first_k_dense_replace", default=0) or 0
        if per_token > experts or dense > layers:
            raise ConfigError(
                f"config.json routes {per_token:,} of {experts:,} experts per token, with "
                f"{dense:,} dense layers of {layers:,}: more than there are",
                hint="the config is damaged or not a transformers config",
            )
        moe = MoeDims(
            num_experts=experts,
            experts_per_token=per_token,
            moe_intermediate_size=_int(
                cfg, "moe_intermediate_size", "intermediate_size", default=hidden * 4
            ),
            shared_intermediate_size=(
                _int(cfg, "shared_expert_intermediate_size", default=0)
                or (_int(cfg, "n_shared_experts", default=0) or 0)
                * (_int(cfg, "moe_intermediate_size", default=0) or 0)
            ),
            dense_layers=dense,
        )
    return ModelArch(
        architecture=archs[0][:200],
        model_type=_text(cfg, "model_type", default="?"),
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=_int(cfg, "intermediate_size", default=0) or 0,
        vocab_size=vocab,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        dtype_bytes=_dtype_bytes(dtype_name),
        dtype_name=dtype_name,
        max_position_embeddings=_int(cfg, "max_position_embeddings", default=None),
        layer_kinds=kinds,
        sliding_window=window,
        mla=mla,
        linear=linear,
        moe=moe,
    )


def _layer_kinds(cfg: dict, layers: int, window: int | None) -> list[LayerKind]:
    types = cfg.get("layer_types")
    if types is not None and not isinstance(types, list):
        raise ConfigError(
            f"config.json field 'layer_types' is {_show(types)}, not a list",
            hint="the config is damaged or not a transformers config",
        )
    if types and len(types) > MAX_LAYERS:
        raise ConfigError(
            f"config.json field 'layer_types' has {len(types):,} entries, over the planner's "
            f"limit of {MAX_LAYERS:,} layers",
            hint=_LIMIT_HINT,
        )
    if types:
        if len(types) < layers:
            raise ConfigError(
                f"config.json layer_types has {len(types)} entries for {layers} layers"
            )
        kinds: list[LayerKind] = []
        for t in types[:layers]:
            if t in ("full_attention", "attention", "global", "chunked_attention"):
                kinds.append("full")
            elif t in ("sliding_attention", "sliding_window", "local"):
                kinds.append("sliding" if window else "full")
            elif t in ("linear_attention", "mamba", "gdn"):
                kinds.append("linear")
            else:
                raise ConfigError(
                    f"config.json layer_types has {_show(t)}, which the planner does not know",
                    hint="known: full_attention, sliding_attention, linear_attention",
                )
        return kinds
    interval = _int(cfg, "full_attention_interval", default=None)
    if interval and cfg.get("linear_num_value_heads"):
        # Qwen3-Next / Qwen3.5: layer i is full attention when (i + 1) % interval == 0.
        return ["full" if (i + 1) % interval == 0 else "linear" for i in range(layers)]
    pattern = _int(cfg, "sliding_window_pattern", default=None)
    if window and pattern:
        # Gemma 3 before layer_types: every pattern-th layer is global.
        return ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(layers)]
    if window:
        # Mistral-style: vLLM gives every layer the config's window (cache_config.sliding_window).
        return ["sliding"] * layers
    return ["full"] * layers


# ---------------------------------------------------------------- KV math (vLLM 0.32)


class Runtime(Record):
    """The serving settings that change the KV arithmetic."""

    device: Literal["gpu", "cpu"] = "gpu"
    tensor_parallel_size: int = Field(1, ge=1)
    kv_cache_dtype: Literal["auto", "fp8"] = "auto"
    block_size: int | None = Field(None, description="None: vLLM's default (GPU 16, CPU 128)")
    max_num_batched_tokens: int | None = Field(
        None,
        description="None: vLLM's API-server default (GPU ≥160 GiB: 16384, ≥70 GiB: 8192, "
        "else 2048; CPU: 2048 × TP)",
    )
    enable_prefix_caching: bool = True
    gpu_memory_gib: float = 80.0


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
    return 8192 if runtime.gpu_memory_gib >= 70 else 2048  # (an A100-80GB gets 2048)


def attn_bytes_per_token_layer(arch: ModelArch, runtime: Runtime) -> int:
    """One attention layer's KV bytes per token on one tensor-parallel rank."""
    nbytes = kv_dtype_bytes(arch, runtime)
    if arch.mla:
        # MLA stores one latent per token, replicated on every TP rank (num_kv_heads = 1).
        return (arch.mla.kv_lora_rank + arch.mla.qk_rope_head_dim) * nbytes
    heads = max(1, arch.num_kv_heads // runtime.tensor_parallel_size)  # replicated when < TP
    return heads * arch.head_dim * 2 * nbytes


def linear_state_bytes(arch: ModelArch, runtime: Runtime) -> tuple[int, int]:
    """(conv, recurrent) state bytes of one Gated DeltaNet layer for one sequence, one rank.

    vllm/model_executor/layers/mamba/mamba_utils.py gated_delta_net_state_shape:
    conv = (2·k_heads·head_k + v_heads·head_v)/TP × (kernel − 1), model dtype;
    recurrent = v_heads/TP × head_v × head_k, mamba_ssm dtype.
    """
    lin = arch.linear
    assert lin is not None
    tp = runtime.tensor_parallel_size
    conv_dim = lin.head_k_dim * lin.num_k_heads * 2 + lin.head_v_dim * lin.num_v_heads
    conv = conv_dim // tp * (lin.conv_kernel - 1) * arch.dtype_bytes
    recurrent = lin.num_v_heads // tp * lin.head_v_dim * lin.head_k_dim * lin.ssm_dtype_bytes
    return conv, recurrent


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


def kv_layout(arch: ModelArch, runtime: Runtime, max_model_len: int) -> KvLayout:
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
    # kv_cache_utils._get_kv_cache_groups_uniform_page_size: group size is the smallest
    # kind's layer count, unless the largest is < 1.5× it (then the largest).
    if len(counts) == 1:
        group_size = next(iter(counts.values()))
    else:
        group_size = min(counts.values())
        if max(counts.values()) < group_size * 1.5:
            group_size = max(counts.values())
    batched = default_batched_tokens(runtime)
    groups: list[KvGroup] = []
    for kind, n in counts.items():
        if kind == "full":
            need = math.ceil(max_model_len / block)
        elif kind == "sliding":
            assert arch.sliding_window
            tokens = min(arch.sliding_window - 1 + batched, max_model_len)
            need = math.ceil(tokens / block) + 1
        else:
            need = 2 if runtime.enable_prefix_caching else 1  # mamba_cache_mode align / none
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


# ---------------------------------------------------------------- the plan


class PlanRequest(Record):
    device: Literal["gpu", "cpu"] = "gpu"
    gpu_memory_gib: float = Field(80.0, gt=0)
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
    block_size: int | None = None
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


class TpPlan(Record):
    tensor_parallel_size: int
    weights_per_gpu_bytes: int
    overhead_per_gpu_bytes: int
    kv_memory_per_gpu_bytes: int
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


class Plan(Record):
    model: str
    arch: ModelArch
    request: PlanRequest
    weights: WeightBytes
    max_model_len: int
    kv_bytes_per_token_unsharded: int
    seeds_kv_bytes_per_token: int
    options: list[TpPlan]
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
    from llm_release.sizing.hardware import detect

    return "float32" if "avx512_bf16" in detect().cpu.flags else "auto"


# vLLM's non-KV GPU memory beyond the weights has two terms (gpu_worker.determine_available_
# memory): the torch peak of its profile run and the non-torch memory that grew meanwhile
# (cuBLAS/NCCL workspaces). Measured through the project's servers on the H200 with vLLM 0.26
# at DEBUG (docs/gpu-serving-2026-12-01.jsonl): non-torch 0.22 GiB for each of SmolLM2's bf16,
# FP8 and W4A16 folders; torch peak 0.14 GiB, which the activation + logits terms below give
# (0.13). The shared 1.17B Llama figures (non-KV 0.72-0.78 GiB) fit within 0.15 GiB. CUDA
# graphs are captured after the KV cache is sized: vLLM 0.26 did not subtract them.
GPU_NON_TORCH_GIB = 0.22
# MoE and hybrid models keep the older, larger reserve until they are measured the same way:
# their fused-MoE workspaces grow with top-k (issue 21), so the dense figure would promise
# KV memory that is not there.
GPU_NON_TORCH_MOE_GIB = 1.5


def estimate_overhead_bytes(arch: ModelArch, tp: int, batched_tokens: int) -> int:
    """Non-KV GPU memory of one rank beyond its weights: vLLM's profiling peak of one
    ``batched_tokens`` step (hidden states and the widest MLP/expert activation in bf16, fp32
    logits of up to 256 sampled rows) plus the non-torch reserve (GPU_NON_TORCH_GIB for a
    dense model, GPU_NON_TORCH_MOE_GIB for a MoE or hybrid one)."""
    width = arch.intermediate_size
    if arch.moe:
        width = max(arch.moe.moe_intermediate_size * arch.moe.experts_per_token, width)
    act = batched_tokens * (4 * arch.hidden_size + 2 * width // tp) * 2
    logits = 256 * arch.vocab_size // tp * 4
    reserve = GPU_NON_TORCH_MOE_GIB if (arch.moe or arch.linear) else GPU_NON_TORCH_GIB
    return int(act + logits + reserve * GiB)


def _tp_problem(arch: ModelArch, tp: int) -> str | None:
    if arch.num_attention_heads % tp:
        return f"tensor_parallel_size {tp} does not divide num_attention_heads {arch.num_attention_heads}"
    if arch.num_kv_heads >= tp and arch.num_kv_heads % tp:
        return f"tensor_parallel_size {tp} does not divide num_key_value_heads {arch.num_kv_heads}"
    if arch.linear and (arch.linear.num_v_heads % tp or arch.linear.num_k_heads % tp):
        return f"tensor_parallel_size {tp} does not divide the linear-attention heads"
    return None


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


def request_for_serving(
    serving,
    *,
    device: Literal["gpu", "cpu"],
    gpu_memory_gib: float = 80.0,
    dtype: str | None = None,
    concurrency: int | None = None,
    extra_args: list[str] | None = None,
) -> PlanRequest:
    """The PlanRequest for a ``config.ServingConfig`` as serve.build_command passes it to vLLM:
    max-model-len, KV space or memory utilization, prefix caching, and the flags in
    ``extra_args`` that change the KV arithmetic (--kv-cache-dtype, --max-num-batched-tokens,
    --block-size, --tensor-parallel-size). ``dtype`` is the served dtype once resolved
    (serving.dtype 'fastest' is resolved per host by serve.resolve_dtype)."""
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
    try:
        return PlanRequest(
            device=device,
            gpu_memory_gib=gpu_memory_gib,
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
            block_size=int(block) if block else None,
        )
    except ValueError as exc:
        raise ConfigError(f"serving arguments the planner cannot read: {exc}") from exc


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


def plan(arch: ModelArch, weights: WeightBytes, request: PlanRequest, model: str = "model") -> Plan:
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
    options: list[TpPlan] = []
    tried: list[tuple[TpPlan, Runtime, int, bool]] = []
    for tp in counts:
        runtime = Runtime(
            device=request.device,
            tensor_parallel_size=tp,
            kv_cache_dtype=request.kv_cache_dtype,
            block_size=request.block_size,
            max_num_batched_tokens=request.max_num_batched_tokens,
            enable_prefix_caching=request.enable_prefix_caching,
            gpu_memory_gib=request.gpu_memory_gib,
        )
        layout = kv_layout(arch, runtime, max_len)
        reasons: list[str] = [too_long] if too_long else []
        problem = _tp_problem(arch, tp)
        if problem:
            reasons.append(problem)
        w = weights.per_gpu(tp)
        if request.device == "cpu":
            overhead = 0
            kv_mem = request.cpu_kvcache_space_gib * GiB
            budget = None
        else:
            overhead = (
                int(request.non_kv_overhead_gib * GiB)
                if request.non_kv_overhead_gib is not None
                else int(
                    estimate_overhead_bytes(arch, tp, default_batched_tokens(runtime))
                    * request.non_kv_overhead_factor
                )
            )
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
        min_util = None
        if budget:
            need = (
                w
                + overhead
                + request.concurrency * layout.blocks_per_request * layout.bytes_per_block
            )
            min_util = math.ceil(need / budget * 100) / 100
        options.append(
            TpPlan(
                tensor_parallel_size=tp,
                weights_per_gpu_bytes=w,
                overhead_per_gpu_bytes=overhead,
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
    if request.device == "gpu" and request.overhead_note and request.non_kv_overhead_gib is None:
        notes.append(request.overhead_note)
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
    return Plan(
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


# ---------------------------------------------------------------- output


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f}"


def format_plan(p: Plan) -> str:
    try:
        from tabulate import tabulate
    except ImportError:  # plain columns when tabulate is absent
        tabulate = None
    a = p.arch
    kinds = ", ".join(f"{a.count(k)} {k}" for k in ("full", "sliding", "linear") if a.count(k))
    lines = [
        f"{p.model}: {a.architecture}, {a.num_layers} layers ({kinds}), "
        f"{a.num_kv_heads} KV heads × {a.head_dim}"
        + (f", MLA latent {a.mla.kv_lora_rank}+{a.mla.qk_rope_head_dim}" if a.mla else "")
        + (f", window {a.sliding_window}" if a.sliding_window else ""),
        f"weights ({p.weights.source}, {p.weights.scheme}): {_gib(p.weights.total_bytes)} GiB — "
        + ", ".join(f"{k} {_gib(v)} GiB" for k, v in p.weights.by_dtype.items()),
        f"KV per token: {p.kv_bytes_per_token_unsharded:,} B (vLLM) vs "
        f"{p.seeds_kv_bytes_per_token:,} B (seeds' hidden×layers×4×bytes); "
        f"max_model_len {p.max_model_len:,}",
    ]
    headers = [
        "TP",
        "weights/GPU GiB",
        "overhead GiB",
        "KV mem GiB",
        "KV B/token",
        "state B/seq",
        "block",
        "KV tokens",
        "max conc.",
        "min util",
        "fits",
    ]
    rows = [
        [
            o.tensor_parallel_size,
            _gib(o.weights_per_gpu_bytes),
            _gib(o.overhead_per_gpu_bytes),
            _gib(o.kv_memory_per_gpu_bytes),
            f"{o.kv_bytes_per_token:,}",
            f"{o.state_bytes_per_sequence:,}",
            o.block_size,
            f"{o.kv_cache_tokens:,}",
            f"{o.max_concurrency:,.2f}",
            "-" if o.min_gpu_memory_utilization is None else f"{o.min_gpu_memory_utilization:.2f}",
            "yes" if o.fits else "no: " + "; ".join(o.reasons),
        ]
        for o in p.options
    ]
    if tabulate:
        lines.append(tabulate(rows, headers=headers, tablefmt="github"))
    else:
        lines.append(" | ".join(headers))
        lines.extend(" | ".join(str(c) for c in row) for row in rows)
    lines.append(("FITS " if p.fits else "DOES NOT FIT ") + p.verdict.split(": ", 1)[-1])
    if p.recommendation:
        r = p.recommendation
        extra = (
            f" --gpu-memory-utilization {r.gpu_memory_utilization}"
            if r.gpu_memory_utilization is not None
            else f" (VLLM_CPU_KVCACHE_SPACE={r.cpu_kvcache_space_gib})"
        )
        lines.append(
            f"recommended: --tensor-parallel-size {r.tensor_parallel_size} --max-model-len "
            f"{r.max_model_len} --max-num-seqs {r.max_num_seqs}{extra}"
        )
    if p.alternative:
        r = p.alternative
        lines.append(
            f"would fit: --tensor-parallel-size {r.tensor_parallel_size} --max-model-len "
            f"{r.max_model_len} --max-num-seqs {r.max_num_seqs}"
        )
    lines.extend(f"note: {n}" for n in p.notes)
    return "\n".join(lines)
