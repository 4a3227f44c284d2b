"""The disk preflight: bytes needed from metadata against an injected free-space figure."""

from __future__ import annotations

import math

import pytest

from llm_release.config import CandidateConfig
from llm_release.errors import DiskSpaceError
from llm_release.hub import disk
from llm_release.hub.hub_headers import read_local
from llm_release.quantization import recipes
from llm_release.sizing import TensorInfo

MiB = 2**20


def test_a_download_that_cannot_fit_is_refused_in_one_line(tmp_path):
    target = tmp_path / "models" / "org--m" / "abc"
    files = [("model-1.safetensors", 600 * MiB), ("model-2.safetensors", 400 * MiB)]
    with pytest.raises(DiskSpaceError) as caught:
        disk.check_download("org/m@abc", target, files, free=900 * MiB)
    line = caught.value.one_line()
    assert "downloading org/m@abc needs 1000.0 MiB (+50.0 MiB margin)" in line
    assert f"in {target}" in line and f"({tmp_path})" in line  # the folder that exists
    assert "900.0 MiB free" in line and "free 150.0 MiB or more there" in line
    assert "LLM_RELEASE_HOME" in line and "\n" not in line
    assert not target.exists()
    # with the margin's room it passes, and says how much it needs
    assert disk.check_download("org/m@abc", target, files, free=1050 * MiB) == 1000 * MiB


def test_the_margin_is_at_least_16_mib():
    assert disk.required(1 * MiB) == 17 * MiB
    assert disk.required(1000 * MiB) == 1050 * MiB
    assert disk.required(0) == 0


def test_bytes_already_on_disk_are_not_needed_again(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "done.json").write_bytes(b"x" * 100)  # a finished file (verified later)
    (tmp_path / "sub" / "w.safetensors.part").write_bytes(b"x" * 300)  # a resumed transfer
    (tmp_path / "big.bin").write_bytes(b"x" * 50)  # a shorter, wrong copy: replaced
    files = [("done.json", 100), ("sub/w.safetensors", 1000), ("big.bin", 80), ("new", 7)]
    assert disk.download_need(tmp_path, files) == 0 + 700 + 30 + 7


def test_the_real_free_space_is_read_from_the_nearest_existing_folder(tmp_path):
    deep = tmp_path / "a" / "b" / "c"
    assert disk.existing_parent(deep) == tmp_path
    assert disk.free_bytes(deep) > 0
    with pytest.raises(DiskSpaceError):
        disk.check_space("writing", disk.free_bytes(tmp_path) + 1, deep)


def _table():
    bf16 = "BF16"
    return {
        "model.embed_tokens.weight": TensorInfo(dtype=bf16, shape=[1000, 256]),
        "lm_head.weight": TensorInfo(dtype=bf16, shape=[1000, 256]),
        "model.layers.0.self_attn.q_proj.weight": TensorInfo(dtype=bf16, shape=[256, 256]),
        "model.layers.0.mlp.down_proj.weight": TensorInfo(dtype=bf16, shape=[256, 512]),
        "model.layers.0.input_layernorm.weight": TensorInfo(dtype=bf16, shape=[256]),
    }


def test_fp8_halves_and_w4a16_quarters_the_quantized_linear_weights():
    tensors = _table()
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512}
    choice = recipes.choose_recipe(config, ["lm_head"])
    kept = 2 * 1000 * 256 * 2 + 256 * 2  # embeddings, lm_head, the norm: bf16 as they were
    linear = 256 * 256 + 256 * 512  # parameters of the two projections
    fp8 = disk.quantized_bytes(tensors, "FP8_DYNAMIC", choice.reason_for)
    assert fp8 == kept + linear * 1 + (256 + 256) * 4  # 1 byte each, a scale per row
    w4 = disk.quantized_bytes(tensors, "W4A16_AWQ", choice.reason_for, group_size=64)
    groups = 256 * (256 // 64) + 256 * (512 // 64)
    assert w4 == kept + linear // 2 + groups * 4 * 2  # half a byte, a scale and a zero point
    sym = disk.quantized_bytes(tensors, "W4A16_AWQ", choice.reason_for, symmetric=True)
    assert sym == kept + linear // 2 + (256 * 2 + 256 * 4) * 4
    # the linear part alone: half (FP8) and about a quarter (W4A16) of its bf16 bytes
    assert math.isclose((fp8 - kept) / (linear * 2), 0.5, rel_tol=0.02)
    assert 0.25 < (w4 - kept) / (linear * 2) < 0.32


def test_a_quantization_preflight_refuses_before_anything_is_written(tiny_model_dir, tmp_path):
    candidate = CandidateConfig(name="fp8", scheme="FP8_DYNAMIC")
    choice = recipes.choose_recipe_for_model(tiny_model_dir, candidate.ignore)
    source = sum(i.nbytes for i in read_local(tiny_model_dir).tensors.values())
    need = disk.quantize_need(tiny_model_dir, candidate, choice)
    # the tiny model is mostly embeddings and lm_head, which stay bf16
    assert source * 0.5 < need < source * 1.2
    out_root = tmp_path / "candidates"
    with pytest.raises(DiskSpaceError, match=r"quantizing fp8 \(FP8_DYNAMIC"):
        disk.check_quantize(tiny_model_dir, candidate, choice, out_root, free=need)
    assert not out_root.exists()
    assert disk.check_quantize(tiny_model_dir, candidate, choice, out_root, free=2 * need) == need
