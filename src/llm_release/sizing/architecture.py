"""A model's architecture from its ``config.json``: the widths, layers, attention kinds and
experts the KV and weight math need, every number bounded (config.json comes from a hub).
"""

from __future__ import annotations

import json
import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llm_release.errors import ConfigError

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


LinearKind = Literal["gated_deltanet", "mamba2", "mamba1"]


class LinearAttnDims(Record):
    """A linear-attention layer's sizes, for the per-sequence state vLLM keeps of it
    (mamba_utils.MambaStateShapeCalculator): Gated DeltaNet (Qwen3-Next, Qwen3.5) with its
    key and value heads, or a Mamba2 (Nemotron-H, Granite 4.0-H, Bamba) or Mamba (Jamba)
    mixer with its inner width, groups, heads and state size."""

    kind: LinearKind = "gated_deltanet"
    num_k_heads: int = Field(0, ge=0)
    num_v_heads: int = Field(0, ge=0)
    head_k_dim: int = Field(0, ge=0)
    head_v_dim: int = Field(0, ge=0)
    conv_kernel: int = Field(gt=0)
    ssm_dtype_bytes: int = Field(description="recurrent state dtype (mamba_ssm_dtype, else model)")
    intermediate_size: int = Field(0, ge=0, description="Mamba's inner width")
    n_groups: int = Field(0, ge=0, description="Mamba2's B/C groups")
    num_heads: int = Field(0, ge=0, description="Mamba2's heads")
    head_dim: int = Field(0, ge=0, description="Mamba2's head width")
    state_size: int = Field(0, ge=0, description="Mamba's SSM state size (d_state)")

    def tp_problem(self, tp: int) -> str | None:
        """Why vLLM cannot shard this layer over ``tp`` ranks (its ``divide`` asserts)."""
        if self.kind == "gated_deltanet":
            if self.num_v_heads % tp or self.num_k_heads % tp:
                return f"tensor_parallel_size {tp} does not divide the linear-attention heads"
            return None
        if self.intermediate_size % tp or (self.kind == "mamba2" and self.num_heads % tp):
            return f"tensor_parallel_size {tp} does not divide the Mamba heads or inner width"
        return None


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
    mtp_layers: int = Field(
        0,
        ge=0,
        description="multi-token-prediction layers the checkpoint carries (Qwen3-Next / "
        "Qwen3.5 mtp_num_hidden_layers, DeepSeek-V3 num_nextn_predict_layers): loaded, with "
        "their attention's KV, only under MTP speculation",
    )
    unmodelled: list[str] = Field(
        default_factory=list,
        description="what of this config the planner does not model, and how it plans it "
        "instead (the side of less KV than vLLM's): named in the plan's notes",
    )

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
# (tests/unit/sizing/test_planner_bounds.py).
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
    **dict.fromkeys(("mtp_num_hidden_layers", "num_nextn_predict_layers"), MAX_LAYERS),
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
    **dict.fromkeys(("mamba_num_heads", "mamba_n_heads", "n_groups", "mamba_n_groups"), MAX_HEADS),
    **dict.fromkeys(
        ("mamba_head_dim", "mamba_d_head", "ssm_state_size", "mamba_d_state"), MAX_HEAD_DIM
    ),
    **dict.fromkeys(("conv_kernel", "mamba_d_conv"), 256),
    "mamba_expand": 64,
    "mamba_d_ssm": MAX_INTERMEDIATE,
    **dict.fromkeys(("attn_layer_period", "attn_layer_offset"), MAX_LAYERS),
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
    linear = _mamba(cfg, archs[0], hidden, dtype_name)
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
    kinds = _mamba_layer_kinds(cfg, archs[0], layers) if linear else None
    kinds = kinds or _layer_kinds(cfg, layers, window)
    if "sliding" not in kinds:
        window = None
    unmodelled: list[str] = []
    if "linear" in kinds and linear is None:
        # Mamba / Mamba2 layers (their state is not Gated DeltaNet's): planned as full
        # attention layers, a KV of max_model_len tokens each, not a fixed state
        unmodelled.append(
            f"{kinds.count('linear')} state-space (Mamba) layers: their state is not modelled; "
            "planned as full attention layers (from a few thousand tokens of max_model_len "
            "on, more memory a sequence than a Mamba state)"
        )
        kinds = ["full" if k == "linear" else k for k in kinds]
    types = cfg.get("layer_types") or []
    if "chunked_attention" in types:
        unmodelled.append(
            "chunked local attention layers: planned as full attention (vLLM keeps only a "
            "chunk of them, so it holds more KV tokens than planned)"
        )
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
        mtp_layers=_int(cfg, "mtp_num_hidden_layers", "num_nextn_predict_layers", default=0) or 0,
        unmodelled=unmodelled,
    )


def _need(cfg: dict, key: str) -> int:
    """A Mamba size the config must give: a positive integer (``_int``'s limits)."""
    value = _int(cfg, key)
    if not value:
        raise ConfigError(
            f"config.json lacks {key!r} (a positive integer) that its Mamba layers need",
            hint="the config is damaged or not one of a Mamba hybrid",
        )
    return value


def _mamba(cfg: dict, architecture: str, hidden: int, dtype_name: str) -> LinearAttnDims | None:
    """The Mamba2 / Mamba mixer of a Nemotron-H, Granite 4.0-H, Bamba, Falcon-H1 or Jamba
    config as vLLM 0.32 reads it (each model's ``get_mamba_state_shape_from_config``); None
    for any other config. The states' dtype is the model's (mamba_cache_dtype and
    mamba_ssm_cache_dtype 'auto'), but Nemotron-H's SSM state: the config's
    ``mamba_ssm_cache_dtype``, else float32 (models/config.py NemotronHForCausalLMConfig)."""
    model_bytes = _dtype_bytes(dtype_name)
    if cfg.get("hybrid_override_pattern") is not None and cfg.get("mamba_num_heads"):
        heads, head_dim = _need(cfg, "mamba_num_heads"), _need(cfg, "mamba_head_dim")
        return LinearAttnDims(
            kind="mamba2",
            intermediate_size=heads * head_dim,
            n_groups=_int(cfg, "n_groups", default=1),
            num_heads=heads,
            head_dim=head_dim,
            state_size=_need(cfg, "ssm_state_size"),
            conv_kernel=_int(cfg, "conv_kernel", default=4),
            ssm_dtype_bytes=_dtype_bytes(cfg.get("mamba_ssm_cache_dtype") or "float32", 4),
        )
    if cfg.get("mamba_n_heads"):
        heads = _need(cfg, "mamba_n_heads")
        inner = (
            _int(cfg, "mamba_d_ssm", default=None) or _int(cfg, "mamba_expand", default=2) * hidden
        )
        # Granite's transformers config leaves mamba_d_head "auto": the inner width per head
        d_head = cfg.get("mamba_d_head")
        head_dim = _int(cfg, "mamba_d_head") if isinstance(d_head, int) else inner // heads
        return LinearAttnDims(
            kind="mamba2",
            intermediate_size=inner,
            n_groups=_int(cfg, "mamba_n_groups", default=1),
            num_heads=heads,
            head_dim=head_dim,
            state_size=_need(cfg, "mamba_d_state"),
            conv_kernel=_int(cfg, "mamba_d_conv", default=4),
            ssm_dtype_bytes=model_bytes,
        )
    if architecture.startswith("Jamba") and cfg.get("mamba_d_state"):
        return LinearAttnDims(
            kind="mamba1",
            intermediate_size=_int(cfg, "mamba_expand", default=2) * hidden,
            state_size=_int(cfg, "mamba_d_state"),
            conv_kernel=_int(cfg, "mamba_d_conv", default=4),
            ssm_dtype_bytes=model_bytes,
        )
    return None


def _mamba_layer_kinds(cfg: dict, architecture: str, layers: int) -> list[LayerKind] | None:
    """The cache-holding layers of a Mamba hybrid, one entry each: Nemotron-H's
    ``hybrid_override_pattern`` (M a Mamba2 layer, * attention, - and E an MLP or MoE layer
    that holds no cache), Bamba's ``attn_layer_indices``, Jamba's attention period and
    offset, Falcon-H1's attention and Mamba2 mixer side by side in every layer; None where
    ``layer_types`` says it (Granite 4.0-H) or nothing does."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is not None:
        if not isinstance(pattern, str) or len(pattern) != layers or set(pattern) - set("M*-E"):
            raise ConfigError(
                f"config.json hybrid_override_pattern is {_show(pattern)}: not one of M, *, - "
                f"or E for each of its {layers} layers",
                hint="the config is damaged or not a Nemotron-H config",
            )
        return ["linear" if c == "M" else "full" for c in pattern if c in "M*"]
    indices = cfg.get("attn_layer_indices")
    if isinstance(indices, list) and not cfg.get("layer_types"):
        if not all(isinstance(i, int) and 0 <= i < layers for i in indices):
            raise ConfigError(
                f"config.json attn_layer_indices is {_show(indices)}: not layer indices",
                hint="the config is damaged or not a Bamba config",
            )
        attention = set(indices)
        return ["full" if i in attention else "linear" for i in range(layers)]
    period = _int(cfg, "attn_layer_period", default=None)
    if architecture.startswith("Jamba") and period:
        offset = _int(cfg, "attn_layer_offset", default=0)
        return ["full" if i % period == offset else "linear" for i in range(layers)]
    if architecture.startswith("FalconH1"):
        return ["full"] * layers + ["linear"] * layers
    return None


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
