"""The layer-by-layer path a model larger than the GPU takes gives the same AWQ artifact as
the in-memory path (on the H200 the 41 GB model's outputs were equal too:
docs/gpu-scale-2026-11-30.jsonl)."""

import json
import os

import pytest
from safetensors.torch import load_file

from llm_release.config import CandidateConfig
from llm_release.quantization.quantize import IN_MEMORY, MODEL_FREE, SEQUENTIAL_OFFLOAD, quantize
from llm_release.settings import NVLINK_MULTICAST_OFF

pytestmark = [pytest.mark.integration]


def tensors(model_dir) -> dict:
    (shard,) = model_dir.glob("*.safetensors")
    return load_file(shard)


def test_awq_layer_by_layer_equals_in_memory(tiny_model_dir, tmp_path):
    candidate = CandidateConfig(
        name="w4a16",
        scheme="W4A16_AWQ",
        group_size=32,
        num_calibration_samples=4,
        max_seq_length=32,
    )
    sequential = quantize(tiny_model_dir, candidate, tmp_path, path=SEQUENTIAL_OFFLOAD)
    in_memory = quantize(tiny_model_dir, candidate, tmp_path, path=IN_MEMORY)
    assert (sequential.path, in_memory.path) == (SEQUENTIAL_OFFLOAD, IN_MEMORY)
    assert sequential.cache_key != in_memory.cache_key
    record = json.loads((sequential.model_dir / "llm-release-quantization.json").read_text())
    assert record["path"] == SEQUENTIAL_OFFLOAD and record["path_reason"] == "chosen by the caller"
    assert record["host_copy"] == "pageable", "pinned only with a GPU to copy to"
    in_memory_record = json.loads(
        (in_memory.model_dir / "llm-release-quantization.json").read_text()
    )
    assert in_memory_record["host_copy"] is None
    a, b = tensors(sequential.model_dir), tensors(in_memory.model_dir)
    assert sorted(a) == sorted(b)
    assert any(k.endswith("weight_packed") for k in a)
    different = [k for k in a if not (a[k] == b[k]).all()]
    assert different == []


def test_quantizing_turns_nvlink_multicast_off_in_its_own_process(
    tiny_model_dir, tmp_path, monkeypatch
):
    """Quantizing runs in the pipeline's process: NVLink multicast is off there too, whatever
    the operator's environment said (the GPU hosts' NCCL init hangs with it on)."""
    for name in NVLINK_MULTICAST_OFF:
        monkeypatch.setenv(name, "1" if name == "NCCL_NVLS_ENABLE" else "0")
    candidate = CandidateConfig(name="fp8", scheme="FP8_DYNAMIC")
    quantize(tiny_model_dir, candidate, tmp_path, path=MODEL_FREE)
    assert {name: os.environ[name] for name in NVLINK_MULTICAST_OFF} == NVLINK_MULTICAST_OFF
