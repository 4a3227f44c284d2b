"""The host probe against the real serving runtime: the dtype measurement, and a scheme the
runtime cannot serve on an AVX2-only CPU (emulated here through scripts/avx2-emulation, which
loads vLLM's real AVX2 kernel library; on an AVX2-only machine it is the native one)."""

from pathlib import Path

import pytest

from llm_release import paths
from llm_release.config import CandidateConfig
from llm_release.hardware import CpuInfo, Hardware, detect
from llm_release.serving.dtype import runtime_info
from llm_release.serving.probe import probe_scheme

pytestmark = [pytest.mark.integration]

AVX2_HOST = Hardware(
    cpu=CpuInfo(model_name="emulated AVX2-only CPU", cores=2, flags=["avx2", "fma"]),
    machine="x86_64",
)


def test_the_runtime_reports_its_versions_and_both_matmul_rates():
    info = runtime_info(detect(), 576, 1536)
    assert info.vllm.startswith("0.") and info.torch.startswith("2.")
    assert info.shape == [256, 576, 1536]
    assert info.linear_gflops["bfloat16"] > 0 and info.linear_gflops["float32"] > 0
    assert info.threads == 1  # per-core rates: one thread, see runtime_info.compare
    # FP8 as vLLM CPU's FP8 linear layers multiply it (torch._scaled_mm)
    assert info.fp8_gflops is not None and info.fp8_gflops > 0
    # Cached per host and runtime: the second call measures nothing.
    assert runtime_info(detect(), 576, 1536) == info


@pytest.mark.slow
def test_w4a16_on_an_avx2_only_cpu_is_found_unservable_before_anything_is_built(
    monkeypatch, tokenizer_dir, tmp_path
):
    monkeypatch.setenv("LLM_RELEASE_PROBES", str(tmp_path / "probes"))
    emulated = paths.project_root() / "scripts" / "avx2-emulation" / "python"
    monkeypatch.setenv("LLM_RELEASE_VLLM_PYTHON", str(emulated))
    monkeypatch.setenv(
        "LLM_RELEASE_EMULATED_PYTHON", str(paths.project_root() / ".venv-vllm/bin/python")
    )
    runtime = runtime_info(AVX2_HOST, 576, 1536)
    assert runtime.torch_cpu_capability == "AVX2"
    candidate = CandidateConfig(name="w4a16-awq", scheme="W4A16_AWQ")
    support = probe_scheme(candidate, "float32", tokenizer_dir, AVX2_HOST, runtime)
    assert support.status == "unsupported", support.reason
    assert "no kernel for this quantization scheme" in support.reason
    assert "cpu_gemm_wna16" in support.reason and "W4A16_AWQ" in support.reason
    # the probe server's log stays beside the cached answer, the missing kernel in it
    assert support.log is not None and "cpu_gemm_wna16" in Path(support.log).read_text()
    assert Path(support.log).parent == (tmp_path / "probes").resolve()
    # Cached per host and runtime: the next release asks nothing of vLLM.
    again = probe_scheme(
        candidate.model_copy(update={"name": "other"}), "float32", tokenizer_dir, AVX2_HOST, runtime
    )
    assert again.cached and again.status == "unsupported" and again.candidate == "other"
