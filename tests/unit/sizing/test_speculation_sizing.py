"""Speculative decoding in the plan, as vLLM sizes it: an MTP drafter's layers are loaded
(their weights) and their attention holds KV beside the model's full-attention layers (the
drafter registers its layers in the same KV-cache spec); every drafted token costs each
linear-attention layer one more state block a request (vLLM 0.32
``model_executor/layers/mamba/abstract.py``: ``MambaSpec.num_speculative_blocks`` =
``num_speculative_tokens``; ``max_memory_usage_bytes`` = page × (2 + that) under prefix
caching's align mode, (1 + that) without).

The measured figures are one H100's (2026-12-06, vLLM 0.26.0, raw rows in
docs/levers-2026-12-06/gpu/mtp-memory.jsonl): the Qwen3.5 MoE shape at 16 layers with one
MTP layer, --load-format dummy, eager, max_model_len 32,768, prefix caching on. From the KV
memory vLLM logged, the layout must give the tokens vLLM logged; the weights estimate of
the config-only folder must give the weights vLLM loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_release.config import ServingConfig, Speculation
from llm_release.errors import ConfigError
from llm_release.sizing import estimate_weights, parse_config, request_for_serving
from llm_release.sizing.kv import kv_capacity, kv_layout
from llm_release.sizing.planner import request_runtime

GiB = 2**30
SHAPE = Path(__file__).resolve().parents[3] / "scripts/gpu/shapes/qwen3.5-a3b-16layer"


def shape_with_mtp(layers: int = 1) -> dict:
    config = json.loads((SHAPE / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = layers
    return config


def serving(spec: Speculation | None, *, eager: bool = True, caching: bool = True):
    return ServingConfig(
        max_model_len=32768,
        dtype="bfloat16",
        enforce_eager=eager,
        gpu_memory_utilization=0.5,
        max_num_seqs=64,
        enable_prefix_caching=caching,
        speculation=spec,
        extra_args=["--language-model-only"],
    )


MTP = Speculation(method="mtp", num_speculative_tokens=1)


@pytest.mark.parametrize(
    "spec,kv_memory_gib,vllm_tokens",
    [(None, 11.24, 1_202_068), (MTP, 9.67, 766_451)],
    ids=["none", "mtp1"],
)
def test_the_layout_gives_vllms_tokens_from_vllms_kv_memory(spec, kv_memory_gib, vllm_tokens):
    arch = parse_config(shape_with_mtp())
    request = request_for_serving(serving(spec), device="gpu", gpu_memory_gib=79.18)
    layout = kv_layout(arch, request_runtime(arch, request, 1), 32768)
    tokens = kv_capacity(layout, int(kv_memory_gib * GiB), 32768).kv_cache_tokens
    # the KV memory is logged to 0.01 GiB: 0.1% of 9.67 GiB
    assert tokens == pytest.approx(vllm_tokens, rel=0.002)
    if spec is not None:
        # 4 + 1 attention layers make groups of 5 (12 GDN layers: 3 groups, padded);
        # each GDN group needs 2 + 1 blocks a request
        assert layout.layers_per_group == 5
        assert layout.blocks_per_request == 32 + 3 * 3
        assert any("MTP drafter attention" in note for note in layout.notes)


def test_without_mtp_speculation_the_mtp_layers_hold_no_kv():
    arch = parse_config(shape_with_mtp())
    request = request_for_serving(serving(None), device="gpu", gpu_memory_gib=79.18)
    layout = kv_layout(arch, request_runtime(arch, request, 1), 32768)
    assert layout.layers_per_group == 4 and layout.blocks_per_request == 32 + 3 * 2


def test_the_estimate_of_a_config_only_folder_counts_the_mtp_layer_only_when_served():
    arch = parse_config(shape_with_mtp())
    without = estimate_weights(arch, "bf16").total_bytes / GiB
    with_mtp = estimate_weights(arch, "bf16", with_mtp=True).total_bytes / GiB
    # vLLM loaded 27.01 GiB without MTP and 28.58 GiB with it
    assert without == pytest.approx(27.01, rel=0.01)
    assert with_mtp == pytest.approx(28.58, rel=0.01)
    assert with_mtp - without == pytest.approx(1.57, rel=0.02)
    # two MTP layers cost twice the one
    two = parse_config(shape_with_mtp(2))
    assert estimate_weights(two, "bf16", with_mtp=True).total_bytes / GiB == pytest.approx(
        without + 2 * (with_mtp - without), rel=1e-6
    )


@pytest.mark.parametrize("caching,base", [(True, 2), (False, 1)])
def test_every_drafted_token_costs_each_linear_group_a_state_block(caching, base):
    """ngram drafts with no second model: no layer is added, the state blocks grow."""
    arch = parse_config(shape_with_mtp())
    for k in (0, 3):
        spec = Speculation(method="ngram", num_speculative_tokens=k) if k else None
        request = request_for_serving(
            serving(spec, caching=caching), device="gpu", gpu_memory_gib=79.18
        )
        layout = kv_layout(arch, request_runtime(arch, request, 1), 32768)
        assert layout.layers_per_group == 4
        assert layout.blocks_per_request == 32 + 3 * (base + k)


def test_a_dense_model_with_ngram_keeps_its_layout():
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    }
    arch = parse_config(config)
    plain = request_for_serving(serving(None), device="gpu", gpu_memory_gib=80)
    spec = Speculation(method="ngram", num_speculative_tokens=3)
    drafted = request_for_serving(serving(spec), device="gpu", gpu_memory_gib=80)
    assert drafted.speculative_tokens == 3 and not drafted.speculative_mtp
    assert kv_layout(arch, request_runtime(arch, drafted, 1), 4096) == kv_layout(
        arch, request_runtime(arch, plain, 1), 4096
    )


def test_with_cuda_graphs_the_plan_names_the_drafted_batches_it_does_not_model():
    eager = request_for_serving(serving(MTP), device="gpu", gpu_memory_gib=80)
    graphs = request_for_serving(serving(MTP, eager=False), device="gpu", gpu_memory_gib=80)
    assert eager.unmodelled == []
    assert graphs.unmodelled == [
        "speculative decoding mtp:1's CUDA graphs (decode batches of 2 query tokens)"
    ]


@pytest.mark.parametrize("value", [-1, "1", 1.5, 10**9])
def test_a_hostile_mtp_layer_count_is_refused_in_one_line(value):
    config = shape_with_mtp()
    config["text_config"]["mtp_num_hidden_layers"] = value
    with pytest.raises(ConfigError, match="mtp_num_hidden_layers"):
        parse_config(config)


def test_deepseeks_nextn_layers_are_its_mtp_layers():
    config = shape_with_mtp(0)
    del config["text_config"]["mtp_num_hidden_layers"]
    config["text_config"]["num_nextn_predict_layers"] = 1
    assert parse_config(config).mtp_layers == 1
