"""The planner's KV math, checked against worked examples built from the formula's parts.

Every expected number is derived here from the config's fields and vLLM 0.32's rules
(page = block × per-token bytes; blocks per request per group; tokens = concurrency ×
max_model_len), not copied from the planner's output.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from llm_release.errors import AcquireError, ConfigError
from llm_release.hub.hub_headers import parse_header, read_local
from llm_release.sizing import (
    GiB,
    PlanRequest,
    Runtime,
    estimate_weights,
    kv_capacity,
    kv_layout,
    parse_config,
    plan,
    weights_from_tensors,
)

DATA = Path(__file__).parents[1] / "data"
PAPER = json.loads((DATA / "paper_configs.json").read_text())


def llama(**over) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 49152,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 2048,
    }
    cfg.update(over)
    return cfg


def test_full_gqa_matches_the_tiny_models_vllm_log():
    # Real vLLM 0.32 CPU log of the tiny test model (tests/unit/data/vllm_kv_report.log):
    # "CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 1,024 tokens per
    # request: 2048.00x" with VLLM_CPU_KVCACHE_SPACE=1 and --max-model-len 1024.
    arch = parse_config(llama())
    per_token = 2 * 2 * (128 // 4) * 2 * 2  # layers × kv heads × head_dim × (K,V) × bf16
    layout = kv_layout(arch, Runtime(device="cpu"), 1024)
    assert layout.attention_bytes_per_token == per_token == 512
    assert layout.block_size == 128
    assert layout.bytes_per_block == 128 * per_token
    cap = kv_capacity(layout, 1 * GiB, 1024)
    assert cap.kv_cache_tokens == 2_097_152
    assert cap.max_concurrency == 2048.0


def test_llama3_8b_kv_per_token_and_the_seeds_overstatement():
    arch = parse_config(PAPER["meta-llama/Meta-Llama-3-8B"])
    per_token = 32 * 8 * 128 * 2 * 2
    assert kv_layout(arch, Runtime(), 8192).attention_bytes_per_token == per_token == 131_072
    # the seeds' hidden × layers × 4 × bytes is 8x off: ×4 for 32 query heads vs 8 KV
    # heads, ×2 because K and V are 2 tensors, not 4
    p = plan(arch, estimate_weights(arch, "bf16"), PlanRequest(max_model_len=8192))
    assert p.seeds_kv_bytes_per_token == 4096 * 32 * 4 * 2 == 8 * per_token


def test_max_model_len_not_a_multiple_of_the_block_rounds_per_request_blocks_up():
    arch = parse_config(llama())
    layout = kv_layout(arch, Runtime(device="cpu"), 1000)
    blocks = GiB // (128 * 512)
    assert layout.blocks_per_request == math.ceil(1000 / 128) == 8
    cap = kv_capacity(layout, GiB, 1000)
    assert cap.kv_cache_tokens == int(blocks / 8 * 1000)
    assert cap.kv_cache_tokens < blocks * 128  # the partial last block is lost per request


def test_fp8_kv_cache_halves_the_bytes_and_doubles_the_tokens():
    arch = parse_config(llama())
    auto = kv_layout(arch, Runtime(device="cpu"), 1024)
    fp8 = kv_layout(arch, Runtime(device="cpu", kv_cache_dtype="fp8"), 1024)
    assert fp8.attention_bytes_per_token == 2 * 2 * 32 * 2 * 1
    assert (
        kv_capacity(fp8, GiB, 1024).kv_cache_tokens
        == 2 * kv_capacity(auto, GiB, 1024).kv_cache_tokens
    )


def test_float32_serving_doubles_the_kv_bytes():
    # Real log (tests/unit/data/vllm_kv_report.log, case 2): a 2-layer Llama with 2 KV
    # heads × 64, FP8 weights served in float32 at max-model-len 256 reported 524,288
    # tokens: 2 × 2 × 64 × 2 × 4 = 2048 B/token. Weight quantization does not touch KV.
    arch = parse_config(llama(hidden_size=256, head_dim=64, torch_dtype="float32"))
    cap = kv_capacity(kv_layout(arch, Runtime(device="cpu"), 256), GiB, 256)
    assert cap.kv_cache_tokens == GiB // (2 * 2 * 64 * 2 * 4) == 524_288
    assert cap.max_concurrency == 2048.0


def test_sliding_window_caps_blocks_at_window_plus_in_flight_tokens():
    # Mistral-style: every layer has the window (vLLM: cache_config.sliding_window).
    arch = parse_config(llama(sliding_window=256, max_position_embeddings=8192))
    assert arch.layer_kinds == ["sliding", "sliding"]
    runtime = Runtime(device="cpu", max_num_batched_tokens=512)
    layout = kv_layout(arch, runtime, 4096)
    held = min(256 - 1 + 512, 4096)  # window − 1 + max_num_batched_tokens (CPU: 1 batch)
    need = math.ceil(held / 128) + 1  # + 1: the window need not start on a block boundary
    assert layout.blocks_per_request == need == 7
    blocks = GiB // (2 * 128 * 2 * 32 * 2 * 2)
    cap = kv_capacity(layout, GiB, 4096)
    assert cap.num_blocks == blocks
    assert cap.kv_cache_tokens == int(blocks / need * 4096)
    full = kv_capacity(kv_layout(parse_config(llama()), runtime, 4096), GiB, 4096)
    assert cap.max_concurrency == pytest.approx(full.max_concurrency * 32 / 7)
    # the same arithmetic at 2048 tokens is what vLLM CPU logged for a served model of this
    # shape (tests/integration/test_planner_vllm.py, mistral-swa-128): 5,592,405 tokens
    w128 = parse_config(llama(sliding_window=128, max_position_embeddings=4096))
    at_2048 = kv_capacity(kv_layout(w128, runtime, 2048), GiB, 2048)
    assert at_2048.kv_cache_tokens == int(blocks / (math.ceil(639 / 128) + 1) * 2048) == 5_592_405


def test_gemma3_hybrid_matches_its_vllm_log():
    # Real log (tests/unit/data/vllm_kv_report.log, case 3): 12 layers, 5 sliding (128)
    # to 1 global, 2 KV heads × 32, bf16, --max-model-len 2048 --max-num-batched-tokens 512:
    # "CPU KV cache size: 729,444 tokens, Maximum concurrency ... 356.17x".
    kinds = (["sliding_attention"] * 5 + ["full_attention"]) * 2
    arch = parse_config(
        llama(num_hidden_layers=12, head_dim=32, sliding_window=128, layer_types=kinds)
    )
    layout = kv_layout(arch, Runtime(device="cpu", max_num_batched_tokens=512), 2048)
    page = 128 * 2 * 32 * 2 * 2
    assert layout.bytes_per_block == 2 * page  # groups of 2 layers: 1 full + 5 sliding
    need = math.ceil(2048 / 128) + 5 * (math.ceil((128 - 1 + 512) / 128) + 1)
    assert layout.blocks_per_request == need == 46
    cap = kv_capacity(layout, GiB, 2048)
    assert cap.num_blocks == GiB // (2 * page)
    assert cap.kv_cache_tokens == 729_444
    assert round(cap.max_concurrency, 2) == 356.17


def test_sliding_window_longer_than_the_request_saves_nothing():
    arch = parse_config(llama(sliding_window=4096))
    layout = kv_layout(arch, Runtime(device="cpu"), 1024)
    assert layout.blocks_per_request == math.ceil(1024 / 128) + 1


def test_gemma3_style_hybrid_groups_five_sliding_to_one_full():
    cfg = llama(
        num_hidden_layers=12,
        sliding_window=512,
        layer_types=["sliding_attention"] * 5
        + ["full_attention"]
        + ["sliding_attention"] * 5
        + ["full_attention"],
    )
    arch = parse_config(cfg)
    runtime = Runtime(device="gpu", block_size=16, max_num_batched_tokens=2048)
    layout = kv_layout(arch, runtime, 32768)
    # 2 full layers -> group size 2; 10 sliding layers -> 5 groups of 2; 6 groups in all
    assert layout.layers_per_group == 2
    assert [g.kind for g in layout.groups].count("sliding") == 5
    per_layer_token = 2 * 32 * 2 * 2
    assert layout.bytes_per_block == 2 * 16 * per_layer_token
    # on a GPU vLLM schedules asynchronously: two batches of 2048 tokens in flight
    sw_need = math.ceil(min(512 - 1 + 2 * 2048, 32768) / 16) + 1
    assert layout.blocks_per_request == math.ceil(32768 / 16) + 5 * sw_need
    assert any("512) − 1 + 4,096 in flight (2 batch(es)" in n for n in layout.notes)
    # --no-async-scheduling: one batch in flight, as on a CPU
    one = kv_layout(arch, runtime.model_copy(update={"async_scheduling": False}), 32768)
    assert one.blocks_per_request == 2048 + 5 * (math.ceil((511 + 2048) / 16) + 1)


def test_the_sliding_groups_of_a_large_gpu_model_hold_the_window_and_two_batches():
    # A Gemma-3-27B-like shape (62 layers, 5 sliding (1024) to 1 full, 16 KV heads × 128)
    # at 32,768 tokens on a 141 GB GPU (max_num_batched_tokens 8192): each sliding group
    # holds window − 1 + 2 × 8192 tokens a request (vLLM 0.32 max_in_flight_tokens), not
    # window − 1 + 8192 (what the planner reserved before: 1.56× the requests vLLM had).
    kinds = (["sliding_attention"] * 5 + ["full_attention"]) * 10 + ["sliding_attention"] * 2
    arch = parse_config(
        llama(
            num_hidden_layers=62,
            num_key_value_heads=16,
            head_dim=128,
            sliding_window=1024,
            layer_types=kinds,
            max_position_embeddings=131072,
        )
    )
    runtime = Runtime(device="gpu", gpu_memory_gib=139.8)
    layout = kv_layout(arch, runtime, 32768)
    assert layout.layers_per_group == 10  # 10 full layers; 52 sliding: 6 groups, 8 padding
    sliding = [g for g in layout.groups if g.kind == "sliding"]
    assert len(sliding) == 6
    assert {g.blocks_per_request for g in sliding} == {math.ceil((1023 + 16384) / 16) + 1}
    before = 2048 + 6 * (math.ceil((1023 + 8192) / 16) + 1)
    assert layout.blocks_per_request / before == pytest.approx(1.557, abs=0.001)


def test_mla_keeps_one_latent_per_token_and_is_not_split_by_tp():
    arch = parse_config(PAPER["deepseek-ai/DeepSeek-V2-Lite"])
    assert arch.mla is not None
    per_token = 27 * (512 + 64) * 2
    for tp in (1, 2, 8):
        layout = kv_layout(arch, Runtime(tensor_parallel_size=tp), 4096)
        assert layout.attention_bytes_per_token == per_token == 31_104
    assert kv_layout(arch, Runtime(device="cpu"), 4096).block_size == 16  # CPU MLA kernel
    # the seeds' formula: 2048 × 27 × 4 × 2 = 442,368 B, 14x the latent
    assert 2048 * 27 * 4 * 2 / per_token == pytest.approx(14.22, abs=0.01)


def test_hybrid_linear_attention_qwen35_35b():
    arch = parse_config(PAPER["Qwen/Qwen3.5-35B-A3B"])
    assert arch.count("full") == 10 and arch.count("linear") == 30
    assert arch.layer_kinds[:4] == ["linear", "linear", "linear", "full"]
    layout = kv_layout(arch, Runtime(block_size=16), 65536)
    attn_tok = 2 * 256 * 2 * 2  # one full-attention layer: 2 KV heads × 256 × (K,V) × bf16
    assert layout.attention_bytes_per_token == 10 * attn_tok == 20_480
    conv = (2 * 16 * 128 + 32 * 128) * (4 - 1) * 2  # conv state, bf16
    recurrent = 32 * 128 * 128 * 4  # v heads × head_v × head_k, mamba_ssm_dtype float32
    state = conv + recurrent
    assert layout.state_bytes_per_sequence == 30 * state
    # block grows until one attention page holds one GDN state (16-token alignment)
    block = 16 * math.ceil(state / (16 * attn_tok))
    assert layout.block_size == block == 1056
    assert layout.layers_per_group == 10
    assert layout.bytes_per_block == 10 * block * attn_tok
    # 1 attention group + 3 GDN groups of 10 layers; prefix caching: 2 state blocks each
    assert layout.blocks_per_request == math.ceil(65536 / block) + 3 * 2
    no_prefix = kv_layout(arch, Runtime(block_size=16, enable_prefix_caching=False), 65536)
    assert no_prefix.blocks_per_request == math.ceil(65536 / block) + 3 * 1


def test_hybrid_state_is_split_by_tp_but_two_kv_heads_are_replicated():
    arch = parse_config(PAPER["Qwen/Qwen3.5-35B-A3B"])
    one, two, four = (kv_layout(arch, Runtime(tensor_parallel_size=tp), 4096) for tp in (1, 2, 4))
    # vLLM: max(1, num_kv_heads // tp) heads per rank: 2 heads split once, then replicate
    assert two.attention_bytes_per_token == one.attention_bytes_per_token // 2
    assert four.attention_bytes_per_token == two.attention_bytes_per_token
    assert four.state_bytes_per_sequence == one.state_bytes_per_sequence // 4


def test_seeds_formula_overstates_qwen35_kv_by_an_order_of_magnitude():
    arch = parse_config(PAPER["Qwen/Qwen3.5-397B-A17B"])
    p = plan(arch, estimate_weights(arch, "w4a16"), PlanRequest(max_model_len=32768))
    assert p.kv_bytes_per_token_unsharded == 15 * 2 * 256 * 2 * 2 == 30_720
    assert p.seeds_kv_bytes_per_token == 4096 * 60 * 4 * 2
    assert p.seeds_kv_bytes_per_token / p.kv_bytes_per_token_unsharded == 64


def test_plan_verdicts_name_the_number_that_breaks():
    arch = parse_config(PAPER["Qwen/Qwen3.5-397B-A17B"])
    p = plan(
        arch,
        estimate_weights(arch, "bf16"),
        PlanRequest(gpu_memory_gib=80, gpu_counts=[1, 2, 4, 8], max_model_len=32768),
    )
    assert not p.fits and p.recommendation is None
    assert "weights" in p.verdict and "exceed 80 GiB × 0.9" in p.verdict
    fp8 = plan(arch, estimate_weights(arch, "fp8"), PlanRequest(max_model_len=32768))
    assert fp8.fits and fp8.recommendation.tensor_parallel_size == 8
    assert [o.fits for o in fp8.options] == [False, False, False, True]


def test_plan_refuses_a_max_model_len_no_sequence_fits():
    arch = parse_config(llama())
    p = plan(
        arch,
        estimate_weights(arch, "bf16"),
        PlanRequest(device="cpu", cpu_kvcache_space_gib=1, max_model_len=4_000_000),
    )
    assert not p.fits
    assert "not one sequence of max_model_len 4,000,000" in p.verdict


def test_concurrency_target_picks_the_smallest_tp_that_holds_it():
    arch = parse_config(PAPER["meta-llama/Meta-Llama-3-8B"])
    weights = estimate_weights(arch, "bf16")
    one = plan(arch, weights, PlanRequest(max_model_len=8192, concurrency=10))
    assert one.recommendation.tensor_parallel_size == 1
    many = plan(arch, weights, PlanRequest(max_model_len=8192, concurrency=100))
    first = next(o for o in many.options if o.max_concurrency >= 100)
    assert many.recommendation.tensor_parallel_size == first.tensor_parallel_size > 1
    assert "< the 100 requested" in many.options[0].reasons[0]


def test_tp_must_divide_the_heads():
    arch = parse_config(llama(num_attention_heads=6, num_key_value_heads=6, hidden_size=192))
    p = plan(arch, estimate_weights(arch, "bf16"), PlanRequest(max_model_len=1024, gpu_counts=[4]))
    assert "does not divide num_attention_heads 6" in p.verdict


def test_paper_case_parameter_counts_match_the_model_names():
    # the names carry the parameter counts: 35B, 397B, 8B, 16B (V2-Lite: 15.7B)
    from llm_release.sizing import estimate_params

    expected = {
        "Qwen/Qwen3.5-35B-A3B": 35e9,
        "Qwen/Qwen3.5-397B-A17B": 397e9,
        "meta-llama/Meta-Llama-3-8B": 8.03e9,
        "deepseek-ai/DeepSeek-V2-Lite": 15.7e9,
    }
    for name, count in expected.items():
        total = estimate_params(parse_config(PAPER[name])).total
        assert total == pytest.approx(count, rel=0.02), name


# ---------------------------------------------------------------- safetensors headers


def _header(entries: dict) -> bytes:
    return json.dumps(entries).encode()


def test_header_parses_dtype_shape_and_bytes():
    raw = _header(
        {
            "__metadata__": {"format": "pt"},
            "a": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]},
            "b": {"dtype": "F8_E4M3", "shape": [16], "data_offsets": [64, 80]},
        }
    )
    tensors = parse_header(raw, name="x", file_size=8 + len(raw) + 80)
    weights = weights_from_tensors(tensors)
    assert weights.by_dtype == {"BF16": 64, "F8_E4M3": 16}
    assert weights.replicated_bytes == 16  # the 1-D tensor is on every rank
    assert weights.per_gpu(2) == 64 // 2 + 16


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, "unknown dtype"),
        ({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 9]}}, "needs 8"),
        ({"a": {"dtype": "BF16", "shape": [-1], "data_offsets": [0, 2]}}, "malformed"),
        ({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2], "x": 1}}, "exactly"),
        ({"a": {"dtype": "BF16", "shape": [1024], "data_offsets": [0, 2048]}}, "file has"),
    ],
)
def test_hostile_headers_are_refused(entries, message):
    with pytest.raises(AcquireError, match=message):
        parse_header(_header(entries), name="evil.safetensors", file_size=200)


def test_header_length_is_bounded(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(llama()))
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(AcquireError, match="header length"):
        read_local(tmp_path)


def test_read_local_counts_the_tiny_models_weights(tiny_model_dir):
    files = read_local(tiny_model_dir)
    weights = weights_from_tensors(files.tensors)
    on_disk = sum((tiny_model_dir / s).stat().st_size for s in files.shards)
    headers = files.bytes_read
    assert weights.total_bytes == on_disk - headers
    assert set(weights.by_dtype) == {"BF16"}


def test_max_model_len_beyond_the_models_positions_does_not_fit():
    arch = parse_config(PAPER["meta-llama/Meta-Llama-3-8B"])
    p = plan(arch, estimate_weights(arch, "bf16"), PlanRequest(max_model_len=32768))
    assert not p.fits
    assert all("> the model's max_position_embeddings 8,192" in o.reasons[0] for o in p.options)


def test_qwen3_next_hybrid_matches_vllm_cpu():
    # Measured by tests/integration/test_planner_vllm.py (qwen3-next-hybrid-gdn): vLLM CPU
    # logged "CPU KV cache size: 335,462 tokens, Maximum concurrency for 2,048 tokens per
    # request: 163.80x" for this shape with 1 GiB, prefix caching on, float32 GDN state
    # (reset by vLLM on this AVX512_BF16 host).
    cfg = llama(
        architectures=["Qwen3NextForCausalLM"],
        num_hidden_layers=8,
        head_dim=64,
        full_attention_interval=4,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
    )
    arch = parse_config(cfg)
    attn_tok = 2 * 64 * 2 * 2
    state = (2 * 2 * 128 + 4 * 128) * 3 * 2 + 4 * 128 * 128 * 4
    block = 128 * math.ceil(state / (128 * attn_tok))  # CPU: 128-token alignment
    assert block == 640
    p = plan(
        arch,
        estimate_weights(arch, "bf16"),
        PlanRequest(device="cpu", max_model_len=2048, mamba_ssm_dtype="float32"),
    )
    o = p.options[0]
    blocks = GiB // (2 * block * attn_tok)  # groups of 2 layers (2 full, 6 linear)
    need = math.ceil(2048 / block) + 3 * 2  # 1 attention group + 3 GDN groups × 2 (align)
    assert o.block_size == block and o.num_blocks == blocks
    assert o.kv_cache_tokens == int(blocks / need * 2048) == 335_462
    assert o.max_concurrency == 163.8


def test_mla_matches_vllm_cpu():
    # Measured (deepseek-v2-mla): "CPU KV cache size: 466,032 tokens ... 227.55x" for a
    # 2-layer MLA model, latent 512 + rope 64, bf16, 1 GiB; CPU MLA uses 16-token blocks.
    cfg = llama(
        architectures=["DeepseekV2ForCausalLM"],
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=32,
        v_head_dim=32,
    )
    arch = parse_config(cfg)
    o = plan(
        arch, estimate_weights(arch, "bf16"), PlanRequest(device="cpu", max_model_len=2048)
    ).options[0]
    blocks = GiB // (2 * 16 * (512 + 64) * 2)
    assert o.block_size == 16 and o.num_blocks == blocks
    assert o.kv_cache_tokens == int(blocks / (2048 // 16) * 2048) == 466_032


def test_plan_command_on_a_folder(tiny_model_dir, capsys):
    from llm_release.cli import main

    assert (
        main(["plan", str(tiny_model_dir), "--cpu-kvcache-gib", "1", "--max-model-len", "1024"])
        == 0
    )
    out = capsys.readouterr().out
    assert "2,097,152" in out and "recommended: --tensor-parallel-size 1" in out


def test_plan_command_refuses_a_missing_folder(tmp_path, capsys):
    from llm_release.cli import main

    assert main(["plan", str(tmp_path / "nope")]) == 2
    assert "neither a model folder nor an 'owner/name' repo id" in capsys.readouterr().err


def test_request_for_serving_reads_the_flags_vllm_gets():
    from llm_release.config import ServingConfig
    from llm_release.sizing import request_for_serving

    serving = ServingConfig(
        max_model_len=4096,
        dtype="bfloat16",
        gpu_memory_utilization=0.85,
        enable_prefix_caching=False,
        extra_args=[
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--max-num-batched-tokens=1024",
            "--tensor-parallel-size",
            "2",
        ],
    )
    r = request_for_serving(serving, device="gpu")
    assert (r.max_model_len, r.kv_cache_dtype, r.max_num_batched_tokens) == (4096, "fp8", 1024)
    assert (r.gpu_counts, r.gpu_memory_utilization, r.enable_prefix_caching) == ([2], 0.85, False)
    with pytest.raises(Exception, match="not resolved"):
        request_for_serving(ServingConfig(), device="cpu")  # dtype 'fastest'


def test_a_plan_that_does_not_fit_says_which_length_would():
    arch = parse_config(PAPER["Qwen/Qwen3.5-397B-A17B"])
    request = PlanRequest(max_model_len=32768, concurrency=50, gpu_counts=[8])
    p = plan(arch, estimate_weights(arch, "fp8"), request)
    assert not p.fits and p.alternative is not None
    length = p.alternative.max_model_len
    assert p.alternative.tensor_parallel_size == 8 and length < 32768
    assert f"a max_model_len of {length:,} holds 50" in p.verdict
    # the boundary is exact: one token more and 50 sequences no longer fit
    at = plan(
        arch, estimate_weights(arch, "fp8"), request.model_copy(update={"max_model_len": length})
    )
    over = plan(
        arch,
        estimate_weights(arch, "fp8"),
        request.model_copy(update={"max_model_len": length + 1}),
    )
    assert at.fits and not over.fits


@pytest.mark.parametrize("experts", ["lots", [8], -1, True])
def test_a_hostile_expert_count_is_refused_before_the_probe_reads_it(experts):
    # The probe picks its tiny model's kind from num_experts; the plan stage, which runs
    # first, refuses a value that is not a count with a one-line fix.
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 100,
        "num_experts": experts,
    }
    with pytest.raises(ConfigError, match="num_experts"):
        parse_config(config)
