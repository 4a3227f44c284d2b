"""A family the planner does not model is named in the plan and planned on the side of less
KV: Mamba layers (no Gated DeltaNet dims) as full attention, chunked attention as full."""

from __future__ import annotations

from llm_release.sizing import PlanRequest, WeightBytes, parse_config, plan

BASE = {
    "architectures": ["X"],
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}
WEIGHTS = WeightBytes(source="estimate", total_bytes=2**30)


def test_mamba_layers_without_gated_deltanet_dims_are_planned_as_full_attention():
    arch = parse_config(BASE | {"layer_types": ["mamba", "full_attention"] * 2})
    assert arch.layer_kinds == ["full"] * 4
    assert arch.linear is None
    (what,) = arch.unmodelled
    assert what.startswith("2 state-space (Mamba) layers")
    dense = parse_config(BASE)
    request = PlanRequest(max_model_len=8192, gpu_counts=[1])
    planned = plan(arch, WEIGHTS, request)
    assert any(n.startswith("not modelled: 2 state-space") for n in planned.notes)
    # as much KV a token as four full layers: never the two-layer figure that ignores them
    assert (
        planned.options[0].kv_cache_tokens
        == plan(dense, WEIGHTS, request).options[0].kv_cache_tokens
    )


def test_gated_deltanet_layers_stay_modelled():
    arch = parse_config(
        BASE
        | {
            "layer_types": ["linear_attention", "full_attention"] * 2,
            "linear_num_value_heads": 8,
            "linear_num_key_heads": 4,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
        }
    )
    assert arch.count("linear") == 2 and not arch.unmodelled


def test_chunked_attention_is_named():
    arch = parse_config(BASE | {"layer_types": ["chunked_attention", "full_attention"] * 2})
    assert arch.layer_kinds == ["full"] * 4
    assert "chunked local attention" in arch.unmodelled[0]
