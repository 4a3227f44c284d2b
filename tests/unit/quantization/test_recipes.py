"""Recipes from config.json alone: the gates and the hybrid models' b/a projections are left
in full precision, the experts are quantized, and the W4A16 group size is checked against
every Linear input width (the experts' too); the quantization path follows the model's size
against the GPU's memory."""

import pytest

from llm_release.errors import ConfigError
from llm_release.quantization.quantize import (
    IN_MEMORY,
    MODEL_FREE,
    SEQUENTIAL_OFFLOAD,
    choose_path,
    model_bytes,
)
from llm_release.quantization.recipes import check_group_size, choose_recipe

# Field names as Qwen/Qwen3-30B-A3B's config.json spells them (sizes shrunk).
QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_attention_heads": 32,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}
# Qwen3-Next-80B-A3B's fields: hybrid Gated DeltaNet / full attention every 4th layer.
QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "hidden_size": 2048,
    "intermediate_size": 5120,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "num_attention_heads": 16,
    "head_dim": 256,
    "num_experts": 512,
    "full_attention_interval": 4,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
}
# Qwen3.5 MoE nests the language model under text_config and lists layer_types.
QWEN35_MOE = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "text_config": {
        **{
            k: v
            for k, v in QWEN3_NEXT.items()
            if k not in ("architectures", "full_attention_interval")
        },
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
    },
}

GATE = "model.layers.0.mlp.gate"
EXPERT = "model.layers.0.mlp.experts.17.down_proj"


def test_qwen3_moe_leaves_the_router_and_quantizes_the_experts():
    choice = choose_recipe(QWEN3_MOE, ["lm_head"])
    assert choice.moe and not choice.hybrid and choice.num_experts == 128
    assert "router" in choice.reason_for(GATE)
    assert choice.reason_for(EXPERT) is None
    assert choice.reason_for("model.layers.3.mlp.experts.0.gate_proj") is None, "not the router"
    assert choice.reason_for("model.embed_tokens") and choice.reason_for("lm_head")
    assert choice.reason_for("model.layers.0.self_attn.q_proj") is None
    assert choice.ignore_patterns.count("lm_head") == 1


@pytest.mark.parametrize("config", [QWEN3_NEXT, QWEN35_MOE], ids=["qwen3-next", "qwen3.5-moe"])
def test_hybrid_leaves_gates_and_linear_attention_ba(config):
    choice = choose_recipe(config)
    assert choice.moe and choice.hybrid
    for kept in (
        GATE,
        "model.layers.0.mlp.shared_expert_gate",
        "model.layers.0.linear_attn.in_proj_ba",
        "model.language_model.layers.0.linear_attn.in_proj_b",
        "model.language_model.layers.0.linear_attn.in_proj_a",
    ):
        assert choice.reason_for(kept), kept
    for quantized in (
        EXPERT,
        "model.layers.0.mlp.shared_expert.up_proj",
        "model.layers.0.linear_attn.in_proj_qkvz",
        "model.layers.0.linear_attn.out_proj",
        "model.layers.3.self_attn.o_proj",
    ):
        assert choice.reason_for(quantized) is None, quantized


def test_dense_model_has_no_moe_or_hybrid_ignores():
    choice = choose_recipe(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_attention_heads": 9,
        }
    )
    assert not choice.moe and not choice.hybrid
    assert choice.reason_for(GATE) is None
    assert choice.input_widths == {
        "hidden_size (q/k/v, gate/up, experts' gate/up)": 576,
        "num_attention_heads x head_dim (o_proj)": 576,
        "intermediate_size (dense down_proj)": 1536,
    }


def test_group_size_is_checked_against_the_experts_width():
    config = {**QWEN3_MOE, "moe_intermediate_size": 96}
    check_group_size(choose_recipe(QWEN3_MOE), 128)
    with pytest.raises(ConfigError, match="moe_intermediate_size.*= 96"):
        check_group_size(choose_recipe(config), 64)
    # All MoE layers: the dense intermediate_size (not divisible) is not a layer width.
    check_group_size(choose_recipe({**config, "intermediate_size": 100}), 32)
    with pytest.raises(ConfigError, match="shared_expert_intermediate_size"):
        check_group_size(choose_recipe({**QWEN3_NEXT, "shared_expert_intermediate_size": 80}), 64)


@pytest.mark.parametrize("size", [0, -1, -64])
def test_a_group_size_of_zero_or_below_is_refused(size):
    from pydantic import ValidationError

    from llm_release.config import CandidateConfig

    with pytest.raises(ValidationError, match="group_size"):
        CandidateConfig(name="awq", scheme="W4A16_AWQ", group_size=size)
    # The recipe refuses it too (0 divided nothing, -64 divided every width).
    with pytest.raises(ConfigError, match=f"group size {size} is not a positive"):
        check_group_size(choose_recipe(QWEN3_MOE), size)


def test_a_group_size_that_divides_no_width_names_it_and_suggests_one():
    config = {**QWEN3_MOE, "hidden_size": 2592, "moe_intermediate_size": 96}
    with pytest.raises(ConfigError) as caught:
        check_group_size(choose_recipe(config), 128)
    assert "= 2592" in caught.value.message and "= 96" in caught.value.message
    assert "e.g. 32 for this model's widths" in caught.value.hint
    # Widths no usual group size divides: their greatest common divisor is suggested.
    with pytest.raises(ConfigError) as caught:
        check_group_size(choose_recipe({**config, "moe_intermediate_size": 100}), 64)
    assert "e.g. 4 " in caught.value.hint


def test_the_release_plan_refuses_a_group_size_before_the_download():
    from llm_release.config import ReleaseConfig
    from llm_release.hardware import CpuInfo, Hardware
    from llm_release.hub.hub_headers import ModelFiles
    from llm_release.quantization.recipes import check_candidates
    from llm_release.serving.capacity import plan_release
    from tests.unit.sizing.test_planner import llama

    def release(group_size: int) -> ReleaseConfig:
        return ReleaseConfig.model_validate(
            {
                "source": {"repo_id": "acme/tiny"},
                "serving": {"dtype": "bfloat16"},
                "candidates": [
                    {"name": "fp8", "scheme": "FP8_DYNAMIC"},
                    {"name": "awq", "scheme": "W4A16_AWQ", "group_size": group_size},
                ],
            }
        )

    files = ModelFiles(source="hub", config=llama(), tensors={}, shards=[])
    cpu = Hardware(cpu=CpuInfo(model_name="cpu", cores=2, flags=["avx2"]), machine="x86_64")
    assert plan_release(release(64), cpu, files).fits
    with pytest.raises(ConfigError, match="candidate 'awq': W4A16 group size 96 does not divide"):
        plan_release(release(96), cpu, files)
    with pytest.raises(ConfigError, match="does not give the layer widths"):
        check_candidates(release(64).candidates, {"num_attention_heads": 4})


GIB = 2**30


@pytest.mark.parametrize(
    ("scheme", "size", "gpu", "path"),
    [
        ("FP8_DYNAMIC", 10 * GIB, None, IN_MEMORY),
        ("FP8_DYNAMIC", 10 * GIB, 140 * GIB, IN_MEMORY),
        ("FP8_DYNAMIC", 38 * GIB, 9.5 * GIB, MODEL_FREE),
        ("W4A16_AWQ", 38 * GIB, 140 * GIB, IN_MEMORY),
        ("W4A16_AWQ", 38 * GIB, 9.5 * GIB, SEQUENTIAL_OFFLOAD),
        # 80 GiB of AWQ needs ~122 GiB at 1.53x: over 0.9 x 130.
        ("W4A16_AWQ", 80 * GIB, 130 * GIB, SEQUENTIAL_OFFLOAD),
        ("FP8_DYNAMIC", 80 * GIB, 130 * GIB, IN_MEMORY),
    ],
)
def test_path_follows_size_against_gpu_memory(scheme, size, gpu, path):
    chosen, reason = choose_path(scheme, int(size), None if gpu is None else int(gpu))
    assert chosen == path
    assert ("GiB" in reason) == (gpu is not None)


def test_model_bytes_reads_the_index_not_the_tensors(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"metadata": {"total_size": 40970731520}, "weight_map": {}}'
    )
    assert model_bytes(tmp_path) == 40970731520
