import json
from pathlib import Path

from llm_release.config import CandidateConfig, ServingConfig
from llm_release.hardware import CpuInfo, Hardware
from llm_release.serving.dtype import RuntimeInfo, choose_dtype
from llm_release.serving.probe import (
    HostSupport,
    PromptBound,
    SchemeSupport,
    check_host_support,
    fp8_too_slow,
)

CPU = Hardware(cpu=CpuInfo(model_name="cpu", cores=2, flags=["avx2"]), machine="x86_64")
GPU = Hardware(cpu=CPU.cpu, machine="x86_64", gpus=["NVIDIA H200"])


def runtime(bf16: float, fp32: float) -> RuntimeInfo:
    return RuntimeInfo(
        python="/py",
        vllm="0.32.0",
        torch="2.13.0",
        torch_cpu_capability="AVX2",
        threads=2,
        cuda=False,
        shape=[256, 576, 1536],
        linear_gflops={"bfloat16": bf16, "float32": fp32},
    )


def test_the_faster_dtype_is_served_and_the_measurement_is_the_reason():
    # An AVX2-only CPU emulates bf16: float32 is far faster and is chosen.
    dtype, why = choose_dtype("fastest", CPU, runtime(bf16=2.4, fp32=78.0))
    assert dtype == "float32" and "2.4" in why and "78.0" in why
    # Native bf16 (measured here: 113 vs 49 GFLOP/s): bf16.
    assert choose_dtype("fastest", CPU, runtime(113.0, 48.6))[0] == "bfloat16"
    # A float32 edge within the margin keeps bf16, which halves weights and KV cache.
    assert choose_dtype("fastest", CPU, runtime(100.0, 120.0))[0] == "bfloat16"
    assert choose_dtype("fastest", CPU, runtime(100.0, 130.0))[0] == "float32"


def test_an_explicit_dtype_and_a_gpu_are_not_measured():
    assert choose_dtype("float16", CPU, runtime(1, 100)) == (
        "float16",
        "set in serving.dtype (float16)",
    )
    assert choose_dtype("fastest", GPU, runtime(1, 100))[0] == "bfloat16"


def test_only_an_unsupported_scheme_is_skipped():
    def support(name: str, status: str) -> SchemeSupport:
        return SchemeSupport(
            candidate=name, scheme="W4A16_AWQ", dtype="float32", status=status, reason=f"{name} why"
        )

    support = HostSupport(
        host=CPU,
        runtime=runtime(1, 2),
        served_dtype="float32",
        dtype_reason="",
        calibration_dtype="float32",
        schemes=[support("a", "unsupported"), support("b", "unknown"), support("c", "supported")],
    )
    assert support.skip_reason("a") == "a why"
    assert support.skip_reason("b") is None, "a probe that could not decide must not skip"
    assert support.skip_reason("c") is None and support.skip_reason("zzz") is None


def test_a_missing_moe_kernel_counts_as_unsupported():
    from llm_release.serving.probe import UNSUPPORTED

    # vLLM CPU 0.32's own words on a quantized Qwen3-MoE (2026-11-30)
    assert UNSUPPORTED.search("ValueError: Unsupported FP8 MoE backend: NONE")
    assert UNSUPPORTED.search("No WNA16 MoE backend supports the deployment configuration.")
    assert not UNSUPPORTED.search("ValueError: max_model_len is larger than the KV cache")


SMOLLM2 = json.loads(
    (Path(__file__).parents[1] / "data/gpu/smollm2-135m-instruct.config.json").read_text()
)
FP8 = CandidateConfig(name="fp8-dynamic", scheme="FP8_DYNAMIC")
BOUND = PromptBound(prompt_tokens=128, ttft_slo_s=6.0)


def with_fp8(rate: float | None) -> RuntimeInfo:
    return runtime(113.0, 48.6).model_copy(update={"fp8_gflops": rate})


def test_fp8_at_a_reference_kernels_rate_is_refused_before_it_is_built():
    """The demo's SmolLM2 on a Xeon whose torch multiplies FP8 at 0.129 GFLOP/s (measured
    there, 2026-12-07): 128 prompt tokens x 6 x 576 x 1536 x 30 layers = 20.4 GFLOP, at
    least 79 s on 2 cores, against the CPU demo's 6 s SLO."""
    slow = fp8_too_slow(FP8, SMOLLM2, CPU, with_fp8(0.129), BOUND)
    assert slow is not None and slow.status == "unsupported"
    assert "0.129 GFLOP/s" in slow.reason and "at least 79 s" in slow.reason
    assert "6 s" in slow.reason and "gates.ttft_p95_slo_s" in slow.reason
    # a rate at which the prompt fits the SLO (torch's own dequantizing path): not refused
    assert fp8_too_slow(FP8, SMOLLM2, CPU, with_fp8(30.0), BOUND) is None
    # a looser SLO lets the same rate through: the bound decides, not the rate alone
    loose = PromptBound(prompt_tokens=128, ttft_slo_s=100.0)
    assert fp8_too_slow(FP8, SMOLLM2, CPU, with_fp8(0.129), loose) is None


def test_only_fp8_on_a_cpu_with_a_measured_rate_is_judged():
    awq = CandidateConfig(name="w4a16-awq", scheme="W4A16_AWQ")
    assert fp8_too_slow(awq, SMOLLM2, CPU, with_fp8(0.129), BOUND) is None
    assert fp8_too_slow(FP8, SMOLLM2, GPU, with_fp8(0.129), BOUND) is None
    assert fp8_too_slow(FP8, SMOLLM2, CPU, with_fp8(None), BOUND) is None


def test_a_refused_fp8_candidate_is_never_probed(monkeypatch, tmp_path):
    from llm_release.serving import probe

    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    probed: list[str] = []
    monkeypatch.setattr(probe, "runtime_info", lambda *args, **kwargs: with_fp8(0.129))

    def probe_scheme(candidate, *args, **kwargs):
        probed.append(candidate.name)
        return SchemeSupport(
            candidate=candidate.name,
            scheme=candidate.scheme,
            dtype="bfloat16",
            status="supported",
            reason="served",
        )

    monkeypatch.setattr(probe, "probe_scheme", probe_scheme)
    awq = CandidateConfig(name="w4a16-awq", scheme="W4A16_AWQ")
    serving = ServingConfig(dtype="fastest")
    host = check_host_support(tmp_path, [FP8, awq], serving, CPU, bound=BOUND)
    assert probed == ["w4a16-awq"]
    assert host.skip_reason("fp8-dynamic") and "GFLOP/s" in host.skip_reason("fp8-dynamic")
    # without the bound (a measure-only flow), the FP8 candidate is probed as before
    probed.clear()
    check_host_support(tmp_path, [FP8, awq], serving, CPU)
    assert probed == ["fp8-dynamic", "w4a16-awq"]
