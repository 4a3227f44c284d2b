"""Calibration math in float32 on a CPU without native bf16; the artifact as a bf16 run
saves it (same dtypes, same size), under its own cache key."""

import json

import pytest
from safetensors import safe_open

from llm_release.config import CandidateConfig
from llm_release.hardware import CpuInfo, Hardware
from llm_release.quantization.quantize import quantize

pytestmark = [pytest.mark.integration]


def host(flags: list[str]) -> Hardware:
    return Hardware(cpu=CpuInfo(model_name="cpu", cores=2, flags=flags), machine="x86_64")


def dtypes(model_dir) -> dict[str, str]:
    (shard,) = model_dir.glob("*.safetensors")
    with safe_open(shard, "pt") as f:
        return {k: str(f.get_tensor(k).dtype) for k in f.keys()}


def test_float32_calibration_saves_the_checkpoints_dtype(tiny_model_dir, tmp_path):
    candidate = CandidateConfig(name="fp8", scheme="FP8_DYNAMIC")
    native = quantize(tiny_model_dir, candidate, tmp_path, host=host(["avx512_bf16", "avx512f"]))
    avx2 = quantize(tiny_model_dir, candidate, tmp_path, host=host(["avx2", "fma"]))
    assert (native.compute_dtype, avx2.compute_dtype) == ("auto", "float32")
    assert native.cache_key != avx2.cache_key, "float32 scales differ: their own cache entry"
    record = json.loads((avx2.model_dir / "llm-release-quantization.json").read_text())
    assert record["compute_dtype"] == "float32" and "AVX2" in record["host"]
    assert json.loads((avx2.model_dir / "config.json").read_text())["dtype"] == "bfloat16"
    assert dtypes(avx2.model_dir) == dtypes(native.model_dir)
    assert dtypes(avx2.model_dir)["model.layers.0.mlp.up_proj.weight"] == "torch.float8_e4m3fn"
    assert dtypes(avx2.model_dir)["model.embed_tokens.weight"] == "torch.bfloat16"
