"""The weights vLLM loads from a checkpoint: MTP layers only with MTP speculation, a vision
tower not under --language-model-only (sizing/weights.py served_tensors)."""

from __future__ import annotations

from llm_release.config import ServingConfig
from llm_release.sizing import (
    PlanRequest,
    TensorInfo,
    parse_config,
    plan,
    request_for_serving,
    served_weights,
    weights_from_tensors,
)

GiB = 2**30
QWEN35 = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "text_config": {
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 4096,
        "mtp_num_hidden_layers": 1,
    },
    "vision_config": {"depth": 2},
}


def _t(rows: int, cols: int) -> TensorInfo:
    return TensorInfo(dtype="BF16", shape=[rows, cols])


def _qwen35_tensors() -> dict[str, TensorInfo]:
    return {
        "model.language_model.embed_tokens.weight": _t(4096, 1024),
        "model.language_model.layers.0.mlp.down_proj.weight": _t(1024, 4096),
        "model.language_model.layers.1.mlp.down_proj.weight": _t(1024, 4096),
        "lm_head.weight": _t(4096, 1024),
        "mtp.layers.0.mlp.down_proj.weight": _t(1024, 4096),
        "mtp.fc.weight": _t(1024, 2048),
        "model.visual.blocks.0.attn.qkv.weight": _t(3072, 1024),
        "model.visual.merger.linear_fc1.weight": _t(4096, 4096),
    }


def test_mtp_layers_are_left_out_unless_mtp_speculation_loads_them():
    tensors = _qwen35_tensors()
    everything = weights_from_tensors(tensors)
    served = weights_from_tensors(tensors, QWEN35)
    mtp = (1024 * 4096 + 1024 * 2048) * 2
    assert served.total_bytes == everything.total_bytes - mtp
    assert served.left_out == {"MTP layers (no MTP speculation)": mtp}
    drafted = weights_from_tensors(tensors, QWEN35, speculative_mtp=True)
    assert drafted.total_bytes == everything.total_bytes and not drafted.left_out


def test_the_vision_tower_is_left_out_only_for_the_language_model():
    tensors = _qwen35_tensors()
    vision = (3072 * 1024 + 4096 * 4096) * 2
    served = weights_from_tensors(tensors, QWEN35)
    language = weights_from_tensors(tensors, QWEN35, language_model_only=True)
    assert served.total_bytes - language.total_bytes == vision
    assert language.left_out["vision tower (--language-model-only)"] == vision


def test_deepseek_mtp_layers_are_the_layers_after_the_last():
    """DeepSeek-V3 and its kin store the MTP layer as layer num_hidden_layers; layer 20 of a
    deeper model shares its digits' start and stays."""
    config = {"num_hidden_layers": 2, "num_nextn_predict_layers": 1}
    tensors = {
        "model.layers.1.mlp.down_proj.weight": _t(8, 8),
        "model.layers.2.eh_proj.weight": _t(8, 16),
        "model.layers.2.mlp.down_proj.weight": _t(8, 8),
        "model.layers.20.mlp.down_proj.weight": _t(8, 8),
    }
    served = weights_from_tensors(tensors, config)
    assert served.total_bytes == 2 * 64 * 2
    assert served.left_out == {"MTP layers (no MTP speculation)": (128 + 64) * 2}
    assert (
        weights_from_tensors(tensors, {"num_hidden_layers": 2}).total_bytes == 4 * 64 * 2 + 64 * 2
    )


def test_the_plan_says_what_it_left_out_and_the_serving_flags_decide():
    tensors = _qwen35_tensors()
    plain = request_for_serving(ServingConfig(max_model_len=1024), device="gpu", dtype="bfloat16")
    language = request_for_serving(
        ServingConfig(max_model_len=1024, extra_args=["--language-model-only"]),
        device="gpu",
        dtype="bfloat16",
    )
    assert not plain.language_model_only and language.language_model_only
    arch = parse_config(QWEN35)
    with_tower = plan(arch, served_weights(tensors, QWEN35, plain), plain)
    without = plan(arch, served_weights(tensors, QWEN35, language), language)
    assert without.weights.total_bytes < with_tower.weights.total_bytes
    assert any("vision tower" in n and "not loaded by vLLM" in n for n in without.notes)
    assert any("MTP layers" in n for n in with_tower.notes)
    assert not any("vision tower" in n for n in with_tower.notes)
    # the KV cache gets what the unloaded weights would have taken
    kv = [o.kv_memory_per_gpu_bytes for o in (with_tower.options[0], without.options[0])]
    assert kv[1] - kv[0] == with_tower.weights.total_bytes - without.weights.total_bytes
    assert isinstance(plain, PlanRequest)


def test_rope_caches_follow_vllm_get_rope():
    """One cos/sin cache per rotary configuration, [positions, rotary_dim] in the served
    dtype: Gemma 3's global (linear x8) and local caches, Llama 3's one, DeepSeek's yarn
    over original x factor positions of its rope head dim."""
    from llm_release.sizing.weights import rope_cache_bytes

    gemma = {
        "head_dim": 128,
        "num_attention_heads": 32,
        "hidden_size": 5376,
        "max_position_embeddings": 131072,
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    }
    assert rope_cache_bytes(gemma) == (131072 * 8 + 131072) * 128 * 2
    per_type = {  # transformers 5 spells the same per layer type
        k: v for k, v in gemma.items() if k not in ("rope_scaling", "rope_local_base_freq")
    }
    per_type["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    }
    assert rope_cache_bytes(per_type) == rope_cache_bytes(gemma)
    llama = {"hidden_size": 4096, "num_attention_heads": 32, "max_position_embeddings": 131072}
    llama["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    assert rope_cache_bytes(llama, dtype_bytes=4) == 131072 * 128 * 4
    deepseek = {
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "num_attention_heads": 16,
        "hidden_size": 2048,
        "max_position_embeddings": 163840,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
    }
    assert rope_cache_bytes(deepseek) == 4096 * 40 * 64 * 2
    hostile = dict(llama, rope_scaling={"rope_type": "linear", "factor": "x"})
    assert rope_cache_bytes(hostile) == 131072 * 128 * 2  # a factor that is no number: 1
    assert rope_cache_bytes({"hidden_size": 64, "num_attention_heads": 1}) == 0


def test_the_weights_carry_the_rope_caches_on_every_rank():
    config = {"hidden_size": 1024, "num_attention_heads": 8, "max_position_embeddings": 4096}
    tensors = {"model.layers.0.mlp.down_proj.weight": _t(1024, 4096)}
    weights = weights_from_tensors(tensors, config)
    rope = 4096 * 128 * 2
    assert weights.rope_cache_bytes == rope
    assert weights.total_bytes == 1024 * 4096 * 2 + rope
    assert weights.per_gpu(4) == 1024 * 4096 * 2 // 4 + rope


def _shape_weights(shape: str):
    import json
    from pathlib import Path

    from llm_release.sizing.weights import TensorInfo, weights_from_tensors

    root = Path(__file__).resolve().parents[3]
    config = json.loads((root / "scripts" / "gpu" / "shapes" / shape / "config.json").read_text())
    table = json.loads(
        (root / "tests" / "unit" / "data" / "gpu" / "shapes" / f"{shape}.tensors.json").read_text()
    )
    tensors = {name: TensorInfo(dtype=d, shape=s) for name, (d, s) in table.items()}
    return weights_from_tensors(tensors, config)


def test_vllm_loads_each_large_parameter_in_a_whole_2_mib_block():
    """vLLM loads under max_split_size_mb 20: a parameter of 20 MiB or more takes its size
    rounded up to 2 MiB. Gemma-3-12B: the fused gate_up (225 MiB) and down (112.5 MiB) of 48
    layers add 2.5 MiB each, its 1,920.47 MiB embedding 1.53 MiB (vLLM logged 22.62 GiB
    where the parameters and RoPE caches are 22.48); Llama-3.1-8B's are all whole."""
    mib = 1 << 20
    gemma = _shape_weights("gemma3-12b-text")
    embed = 262_208 * 3840 * 2
    assert gemma.per_gpu(1) - gemma.total_bytes == 48 * 5 * mib // 2 + (-embed % (2 * mib))
    assert round(gemma.per_gpu(1) / 2**30, 2) == 22.60
    llama = _shape_weights("llama3.1-8b")
    assert llama.per_gpu(1) == llama.total_bytes
    # over two ranks each shard is rounded on its own: 112.5 -> 114 and 56.25 -> 58 MiB
    from llm_release.sizing.weights import load_rounding_bytes

    half = -(embed // 2) % (2 * mib)
    assert load_rounding_bytes(gemma.parameters, 2) == 48 * 13 * mib // 4 + half


def test_vllm_parameters_fuse_as_vllm_stacks_them():
    from llm_release.sizing.weights import TensorInfo, vllm_parameters

    def t(*shape):
        return TensorInfo(dtype="BF16", shape=list(shape))

    tensors = {
        "model.layers.0.self_attn.q_proj.weight": t(4096, 4096),
        "model.layers.0.self_attn.k_proj.weight": t(1024, 4096),
        "model.layers.0.self_attn.v_proj.weight": t(1024, 4096),
        "model.layers.0.mlp.gate_proj.weight": t(14336, 4096),
        "model.layers.0.mlp.up_proj.weight": t(14336, 4096),
        "model.layers.1.block_sparse_moe.experts.0.w1.weight": t(100, 4096),
        "model.layers.1.block_sparse_moe.experts.1.w3.weight": t(100, 4096),
        "model.layers.1.block_sparse_moe.experts.0.w2.weight": t(4096, 100),
    }
    mb = 2 * 4096
    assert vllm_parameters(tensors) == sorted(
        [6144 * mb, 2 * 14336 * mb, 200 * mb, 100 * mb]  # qkv, gate_up, Mixtral w13, w2
    )
