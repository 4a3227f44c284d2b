"""The planner's per-vLLM-version correction of its non-KV estimate, learned from the
recorded planner-vs-vLLM checks, applied to later plans and shown in their output."""

from __future__ import annotations

from llm_release.sizing import (
    GiB,
    PlanRequest,
    corrections,
    estimate_weights,
    format_plan,
    parse_config,
    plan,
)
from llm_release.sizing.vllm_report import VllmKvReport, check_plan

ARCH = parse_config(
    {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "torch_dtype": "bfloat16",
        "max_position_embeddings": 8192,
    }
)
WEIGHTS = estimate_weights(ARCH, "bf16")
REQUEST = PlanRequest(device="gpu", gpu_memory_gib=80, gpu_counts=[1], max_model_len=8192)


def gpu_check(extra_overhead_gib: float, version: str = "0.32.0"):
    """What a start of vLLM ``version`` looks like when its non-KV memory is
    ``extra_overhead_gib`` more than the planner estimated."""
    option = plan(ARCH, WEIGHTS, REQUEST).options[0]
    vllm_kv = option.kv_memory_per_gpu_bytes - int(extra_overhead_gib * GiB)
    tokens = option.kv_cache_tokens * vllm_kv // option.kv_memory_per_gpu_bytes
    report = VllmKvReport(
        device="GPU",
        kv_cache_tokens=tokens,
        max_model_len=8192,
        max_concurrency=tokens / 8192,
        kv_memory_gib=vllm_kv / GiB,
        vllm_version=version,
    )
    check = check_plan(
        option.kv_cache_tokens,
        option.max_concurrency,
        report,
        overhead_bytes=option.overhead_per_gpu_bytes,
        kv_memory_bytes=option.kv_memory_per_gpu_bytes,
    )
    return option, check


def test_learned_factor_moves_the_plan_onto_vllms_figure(tmp_path) -> None:
    store = tmp_path / "corrections.json"
    option, check = gpu_check(1.0)
    estimate = option.overhead_per_gpu_bytes
    for _ in range(3):
        corrections.record(check, "llama-8b", store)
    learned = corrections.learned("v0.32.0+cu130", store)  # same version, other spelling
    assert learned is not None and learned.records == 3
    assert abs(learned.factor - (estimate + GiB) / estimate) < 1e-3

    corrected = corrections.apply(REQUEST, "0.32.0", store)
    result = plan(ARCH, WEIGHTS, corrected)
    new = result.options[0]
    assert abs(new.overhead_per_gpu_bytes - (estimate + GiB)) < 0.001 * GiB
    # uncorrected the planner promised too many tokens; corrected it lands on vLLM's figure
    assert check.tokens_error > 0.01
    assert abs(new.kv_cache_tokens - check.vllm_kv_cache_tokens) / check.vllm_kv_cache_tokens < 0.01
    text = format_plan(result)
    assert "learned from 3 recorded vLLM 0.32.0 start(s)" in text


def test_other_versions_cpu_and_damaged_stores_get_no_correction(tmp_path) -> None:
    store = tmp_path / "corrections.json"
    _, check = gpu_check(2.0, version="0.31.1")
    corrections.record(check, "llama-8b", store)
    other = corrections.apply(REQUEST, "0.32.0", store)
    assert other.non_kv_overhead_factor == 1.0
    assert "no learned correction for vLLM 0.32.0" in format_plan(plan(ARCH, WEIGHTS, other))
    cpu = PlanRequest(device="cpu", max_model_len=2048)
    assert corrections.apply(cpu, "0.31.1", store) == cpu
    cpu_report = VllmKvReport(
        device="CPU",
        kv_cache_tokens=1000,
        max_model_len=100,
        max_concurrency=10.0,
        vllm_version="0.31.1",
    )
    cpu_check = check_plan(1000, 10.0, cpu_report, overhead_bytes=0, kv_memory_bytes=GiB)
    assert corrections.record(cpu_check, "tiny", store).observed_bytes is None
    assert corrections.learned("0.31.1", store).records == 1  # the GPU start only
    store.write_text("{not json")
    assert corrections.learned("0.31.1", store) is None


def test_records_against_an_older_estimate_correct_nothing(tmp_path) -> None:
    """A ratio learned against the fitted estimate of before sizing/profile.py would scale
    a different formula: records without today's ESTIMATOR are kept but not learned from."""
    store = tmp_path / "corrections.json"
    _, check = gpu_check(1.0)
    corrections.record(check, "llama-8b", store)
    data = corrections.load(store)
    old = data.versions["0.32.0"][0].model_dump(exclude={"estimator"})  # as written before
    store.write_text(
        corrections.Store.model_validate({"versions": {"0.32.0": [old]}}).model_dump_json()
    )
    assert corrections.load(store).versions["0.32.0"][0].estimator == 1
    assert corrections.learned("0.32.0", store) is None
    corrections.record(check, "llama-8b", store)
    assert corrections.learned("0.32.0", store).records == 1
