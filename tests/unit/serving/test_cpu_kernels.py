"""vLLM CPU's fp8 KV cache needs AVX-512 or AMX (and a head size divisible by 32): the rule,
asked before a server starts, a release runs or a CPU plan is printed."""

from __future__ import annotations

import json
import sys

import pytest

from llm_release import hardware
from llm_release.cli import main
from llm_release.errors import ConfigError
from llm_release.hardware import CpuInfo, Hardware
from llm_release.serving import cpu_kernels
from llm_release.serving.cpu_kernels import CpuFeatures

AVX2 = CpuFeatures(machine="x86_64", avx512=False, amx=False, source="the CPU flags")
AVX512 = CpuFeatures(machine="x86_64", avx512=True, amx=False, source="the CPU flags")
AMX = CpuFeatures(machine="x86_64", avx512=False, amx=True, source="the CPU flags")
ARM = CpuFeatures(machine="aarch64", avx512=False, amx=False, source="the CPU flags")


def host(*flags: str, gpus: list[str] | None = None) -> Hardware:
    cpu = CpuInfo(model_name="AMD EPYC", cores=2, flags=list(flags))
    return Hardware(cpu=cpu, machine="x86_64", gpus=gpus or [])


def test_fp8_kv_is_refused_on_x86_without_avx512_or_amx_naming_what_is_missing():
    why = cpu_kernels.fp8_kv_refusal("fp8", AVX2, 64, "AMD EPYC")
    assert why is not None
    assert "needs x86 with AVX-512 or AMX" in why and "AMD EPYC lacks AVX-512 and AMX" in why
    assert "set serving.kv_cache_dtype to auto" in why and "\n" not in why
    for variant in ("fp8_e4m3", "fp8_e5m2"):
        assert cpu_kernels.fp8_kv_refusal(variant, AVX2, 64, "cpu") is not None


def test_fp8_kv_is_held_with_avx512_or_amx_and_auto_is_never_refused():
    assert cpu_kernels.fp8_kv_refusal("fp8", AVX512, 64, "cpu") is None
    assert cpu_kernels.fp8_kv_refusal("fp8", AMX, 128, "cpu") is None
    assert cpu_kernels.fp8_kv_refusal("auto", AVX2, 64, "cpu") is None


def test_a_head_size_of_16_times_odd_is_refused_on_any_cpu_and_arm_lacks_x86():
    why = cpu_kernels.fp8_kv_refusal("fp8", AVX512, 80, "cpu")
    assert why is not None and "head size divisible by 32" in why and "80" in why
    assert cpu_kernels.fp8_kv_refusal("fp8", AVX512, 96, "cpu") is None  # 96 = 3 × 32
    arm = cpu_kernels.fp8_kv_refusal("fp8", ARM, 64, "Neoverse")
    assert arm is not None and "an x86 CPU (aarch64)" in arm


def test_the_kv_dtype_asked_for_comes_from_the_field_or_the_extra_args():
    assert cpu_kernels.effective_kv_cache_dtype("auto", []) == "auto"
    assert cpu_kernels.effective_kv_cache_dtype("fp8", []) == "fp8"
    assert cpu_kernels.effective_kv_cache_dtype("auto", ["--kv-cache-dtype", "fp8"]) == "fp8"
    assert cpu_kernels.effective_kv_cache_dtype("auto", ["--kv-cache-dtype=fp8_e5m2"]) == "fp8_e5m2"


def test_head_size_from_head_dim_or_the_widths_and_the_text_config():
    assert cpu_kernels.head_size({"head_dim": 80, "hidden_size": 4096}) == 80
    assert cpu_kernels.head_size({"hidden_size": 576, "num_attention_heads": 9}) == 64
    assert cpu_kernels.head_size({"text_config": {"head_dim": 256}}) == 256
    assert cpu_kernels.head_size({}) is None


def test_check_kv_cache_raises_on_a_cpu_host_and_never_on_a_gpu_host():
    with pytest.raises(ConfigError, match="lacks AVX-512 and AMX"):
        cpu_kernels.check_kv_cache("fp8", [], {"head_dim": 64}, host("avx2"), AVX2)
    cpu_kernels.check_kv_cache("fp8", [], {"head_dim": 64}, host("avx2", gpus=["H200"]), AVX2)
    cpu_kernels.check_kv_cache("auto", [], {"head_dim": 64}, host("avx2"), AVX2)
    cpu_kernels.check_kv_cache("fp8", [], {"head_dim": 64}, host("avx512f"), AVX512)


def test_features_from_the_cpu_flags():
    assert cpu_kernels.from_host(host("avx2", "fma")) == AVX2
    assert cpu_kernels.from_host(host("avx512f", "avx2")).avx512
    assert cpu_kernels.from_host(host("amx_tile")).amx


def test_features_from_a_runtime_that_answers_and_one_that_cannot(tmp_path, monkeypatch):
    """The serving interpreter is asked (and cached); one that fails leaves the flags to decide."""
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    fake = tmp_path / "python"
    fake.write_text(
        '#!/bin/sh\necho \'noise\'\necho \'{"machine": "x86_64", "avx512": false, "amx": true}\'\n'
    )
    fake.chmod(0o755)
    answered = cpu_kernels.from_runtime(host("avx2"), fake)
    assert answered.amx and not answered.avx512
    assert answered.source == "the serving runtime's torch"
    fake.write_text("#!/bin/sh\nexit 3\n")  # cached: the first answer stands
    assert cpu_kernels.from_runtime(host("avx2"), fake) == answered
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'Traceback: no torch' >&2\nexit 1\n")
    broken.chmod(0o755)
    assert cpu_kernels.from_runtime(host("avx2"), broken) == AVX2


def test_the_real_interpreter_answers_what_torch_says():
    """This interpreter's torch, asked the way the serving runtime is (true on any CPU)."""
    import torch.cpu

    features = cpu_kernels.from_runtime(
        hardware.detect(), __import__("pathlib").Path(sys.executable)
    )
    assert features.avx512 == bool(torch.cpu._is_avx512_supported())
    assert features.amx == bool(torch.cpu._is_amx_tile_supported())


def test_a_cpu_plan_for_fp8_kv_on_a_cpu_without_avx512_is_refused(
    tiny_model_dir, monkeypatch, capsys
):
    monkeypatch.setenv("LLM_RELEASE_CPU_FLAGS", "avx2,fma")
    hardware.detect.cache_clear()
    try:
        args = ["plan", str(tiny_model_dir), "--cpu-kvcache-gib", "1", "--kv-cache-dtype", "fp8"]
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "lacks AVX-512 and AMX" in err, err
        monkeypatch.setenv("LLM_RELEASE_CPU_FLAGS", "avx512f,avx2,fma")
        hardware.detect.cache_clear()
        assert main(
            [
                "plan",
                str(tiny_model_dir),
                "--cpu-kvcache-gib",
                "1",
                "--kv-cache-dtype",
                "fp8",
                "--json",
            ]
        ) in (0, 1)
        assert json.loads(capsys.readouterr().out)["request"]["kv_cache_dtype"] == "fp8"
    finally:
        hardware.detect.cache_clear()
