import pytest

from llm_release.hardware import CpuInfo, Hardware, compute_dtype, detect, parse_cpuinfo

# Abridged /proc/cpuinfo of the two CPUs this machine kind comes with.
AVX2_ONLY = """processor\t: 0
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 fma avx avx2 bmi2
processor\t: 1
model name\t: AMD EPYC 7B12
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 fma avx avx2 bmi2
"""
AVX512_BF16 = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 fma avx avx2 avx512f avx512bw avx512_vnni avx512_bf16 avx512vl
"""


def test_an_avx2_only_cpu_has_no_native_bf16():
    cpu = parse_cpuinfo(AVX2_ONLY, cores=2)
    assert cpu.model_name == "AMD EPYC 7B12"
    assert cpu.flags == ["avx2", "fma"]
    assert cpu.isa == "AVX2" and not cpu.native_bf16
    assert "no native bf16" in cpu.describe()


def test_avx512_bf16_and_amx_are_native_bf16():
    cpu = parse_cpuinfo(AVX512_BF16, cores=2)
    assert cpu.isa == "AVX512_BF16" and cpu.native_bf16
    amx = CpuInfo(model_name="Xeon", cores=2, flags=["amx_bf16", "amx_tile", "avx512f"])
    assert amx.isa == "AMX" and amx.native_bf16
    plain = CpuInfo(model_name="x", cores=2, flags=["avx512f"])
    assert plain.isa == "AVX512" and not plain.native_bf16


def test_calibration_runs_in_float32_only_where_bf16_is_emulated():
    def host(text: str, gpus: list[str] | None = None) -> Hardware:
        return Hardware(cpu=parse_cpuinfo(text, 2), machine="x86_64", gpus=gpus or [])

    assert compute_dtype(host(AVX2_ONLY)) == "float32"
    assert compute_dtype(host(AVX512_BF16)) == "auto"
    # On a GPU the CPU's bf16 does not matter: nothing changes there.
    assert compute_dtype(host(AVX2_ONLY, ["NVIDIA H200"])) == "auto"


def test_flags_can_be_set_to_plan_for_the_other_kind(monkeypatch):
    detect.cache_clear()
    monkeypatch.setenv("LLM_RELEASE_CPU_FLAGS", "avx2, FMA")
    try:
        host = detect()
        assert host.cpu.flags == ["avx2", "fma"] and host.cpu.isa == "AVX2"
        assert "LLM_RELEASE_CPU_FLAGS" in host.cpu.model_name
        monkeypatch.setenv("LLM_RELEASE_CPU_FLAGS", "avx2,avx9000")
        detect.cache_clear()
        with pytest.raises(ValueError, match="avx9000"):
            detect()
    finally:
        detect.cache_clear()
