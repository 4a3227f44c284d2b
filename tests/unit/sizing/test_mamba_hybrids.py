"""Mamba hybrids as vLLM 0.32 sizes them (mamba_utils.MambaStateShapeCalculator and each
model's get_mamba_state_shape_from_config): Nemotron-H (Mamba2 by hybrid_override_pattern,
SSM state float32), Granite 4.0-H (Mamba2 by layer_types), Jamba (Mamba by attention
period), Falcon-H1 (attention and Mamba2 in every layer). The configs are shaped like the
public ones; the expected figures are vLLM's formulas written out by hand."""

from __future__ import annotations

import math

import pytest

from llm_release.errors import ConfigError
from llm_release.sizing import PlanRequest, estimate_weights, parse_config, plan
from llm_release.sizing.kv import Runtime, kv_layout, linear_state_bytes

# Nemotron-Nano-9B-v2's shape: 56 layers, 4 of them attention
PATTERN = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "hidden_size": 4480,
    "intermediate_size": 15680,
    "num_hidden_layers": len(PATTERN),
    "hybrid_override_pattern": PATTERN,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 80,
    "n_groups": 8,
    "ssm_state_size": 128,
    "conv_kernel": 4,
    "vocab_size": 131072,
    "torch_dtype": "bfloat16",
}
GRANITE_H = {
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "hidden_size": 1536,
    "num_hidden_layers": 8,
    "layer_types": ["mamba"] * 3 + ["attention"] + ["mamba"] * 3 + ["attention"],
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "mamba_n_heads": 48,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "vocab_size": 100352,
    "torch_dtype": "bfloat16",
}
JAMBA = {
    "architectures": ["JambaForCausalLM"],
    "model_type": "jamba",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "attn_layer_period": 8,
    "attn_layer_offset": 4,
    "mamba_d_state": 16,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "vocab_size": 65536,
    "torch_dtype": "bfloat16",
}


def test_nemotron_h_mamba2_layers_their_float32_ssm_state_and_no_cache_for_mlp_layers():
    arch = parse_config(NEMOTRON_H)
    assert (arch.count("full"), arch.count("linear")) == (4, 27)  # the 25 MLP layers: none
    assert arch.unmodelled == []
    lin = arch.linear
    assert (lin.kind, lin.intermediate_size, lin.ssm_dtype_bytes) == ("mamba2", 128 * 80, 4)
    conv, recurrent = linear_state_bytes(arch, Runtime())
    assert conv == (128 * 80 + 2 * 8 * 128) * (4 - 1) * 2
    assert recurrent == 128 * 80 * 128 * 4
    conv2, recurrent2 = linear_state_bytes(arch, Runtime(tensor_parallel_size=2))
    assert (conv2, recurrent2) == (conv // 2, recurrent // 2)
    # the config's own mamba_ssm_cache_dtype wins over vLLM's float32
    assert (
        parse_config(NEMOTRON_H | {"mamba_ssm_cache_dtype": "bfloat16"}).linear.ssm_dtype_bytes == 2
    )


def test_the_attention_block_grows_until_its_page_holds_one_mamba_state():
    arch = parse_config(NEMOTRON_H)
    layout = kv_layout(arch, Runtime(block_size=16), 32768)
    attn_tok = 8 * 128 * 2 * 2
    state = sum(linear_state_bytes(arch, Runtime()))
    assert layout.block_size == 16 * math.ceil(state / (16 * attn_tok))
    assert layout.state_bytes_per_sequence == 27 * state
    assert layout.attention_bytes_per_token == 4 * attn_tok
    # groups of 4 layers (the attention's count; 27 Mamba layers < 1.5 × 4 does not hold)
    assert layout.layers_per_group == 4
    assert layout.blocks_per_request == math.ceil(32768 / layout.block_size) + 7 * 2


def test_a_group_count_tp_does_not_divide_is_padded_to_tp():
    one_group = parse_config(NEMOTRON_H | {"n_groups": 1})
    conv, _ = linear_state_bytes(one_group, Runtime(tensor_parallel_size=4))
    # extra_groups_for_head_shards: 1 group becomes 4, so each rank holds one
    assert conv == (128 * 80 + 2 * 4 * 128) // 4 * 3 * 2


def test_granite_4_h_mamba2_by_layer_types_with_its_head_width_from_the_inner_width():
    arch = parse_config(GRANITE_H)
    assert arch.layer_kinds == ["linear"] * 3 + ["full"] + ["linear"] * 3 + ["full"]
    lin = arch.linear
    assert (lin.intermediate_size, lin.head_dim, lin.ssm_dtype_bytes) == (3072, 64, 2)
    conv, recurrent = linear_state_bytes(arch, Runtime())
    assert conv == (3072 + 2 * 1 * 128) * 3 * 2 and recurrent == 48 * 64 * 128 * 2


def test_jamba_mamba_layers_by_its_attention_period():
    arch = parse_config(JAMBA)
    assert [i for i, k in enumerate(arch.layer_kinds) if k == "full"] == [4, 12, 20, 28]
    lin = arch.linear
    assert (lin.kind, lin.intermediate_size, lin.state_size) == ("mamba1", 8192, 16)
    conv, recurrent = linear_state_bytes(arch, Runtime(tensor_parallel_size=2))
    assert (conv, recurrent) == (4096 * 3 * 2, 4096 * 16 * 2)
    assert arch.linear.tp_problem(3) and arch.linear.tp_problem(2) is None


def test_falcon_h1_holds_an_attention_kv_and_a_mamba_state_in_every_layer():
    arch = parse_config(
        GRANITE_H
        | {"architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "mamba_d_ssm": 1536}
        | {"layer_types": None}
    )
    assert (arch.count("full"), arch.count("linear")) == (8, 8)
    assert arch.linear.intermediate_size == 1536


def test_the_plan_of_a_mamba_hybrid_holds_more_sequences_than_as_full_attention():
    """Planned with its states, Nemotron-H holds several times the 32k sequences it held
    when its Mamba layers were planned as full attention (the old, safe fallback)."""
    arch = parse_config(NEMOTRON_H)
    request = PlanRequest(max_model_len=32768, gpu_counts=[1], gpu_memory_gib=80)
    modelled = plan(arch, estimate_weights(arch, "bf16"), request).options[0]
    as_full = arch.model_copy(
        update={"linear": None, "layer_kinds": ["full"] * len(arch.layer_kinds)}
    )
    fallback = plan(as_full, estimate_weights(arch, "bf16"), request).options[0]
    assert modelled.fits and modelled.max_concurrency > 3 * fallback.max_concurrency


@pytest.mark.parametrize("pattern", ["M*", "M*X" + "-" * (len(PATTERN) - 3), 7])
def test_a_damaged_hybrid_override_pattern_is_refused_in_one_line(pattern):
    with pytest.raises(ConfigError, match="hybrid_override_pattern"):
        parse_config(NEMOTRON_H | {"hybrid_override_pattern": pattern})


@pytest.mark.parametrize("field", ["mamba_head_dim", "ssm_state_size"])
def test_a_mamba_config_without_a_size_it_needs_is_refused_in_one_line(field):
    config = {k: v for k, v in NEMOTRON_H.items() if k != field}
    with pytest.raises(ConfigError, match=f"lacks '{field}'"):
        parse_config(config)


def test_a_long_attn_layer_indices_list_is_read_once():
    bamba = GRANITE_H | {"architectures": ["BambaForCausalLM"], "layer_types": None}
    arch = parse_config(bamba | {"attn_layer_indices": [3, 7] * 500_000})
    assert [i for i, k in enumerate(arch.layer_kinds) if k == "full"] == [3, 7]
