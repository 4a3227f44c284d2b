from llm_release.hardware import CpuInfo, Hardware
from llm_release.serving.dtype import RuntimeInfo, choose_dtype
from llm_release.serving.probe import HostSupport, SchemeSupport

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
