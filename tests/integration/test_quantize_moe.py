"""A tiny random-weight Qwen3-MoE (4 experts) through the project's quantize stage: FP8 in
memory, FP8 model-free (shard by shard) and W4A16 AWQ; each artifact is loaded back, the
experts are quantized and the router gates are stored in bf16 (read from the safetensors),
and the candidate's record lists the layers left unquantized with the reason.

Not served by vLLM here: vLLM CPU 0.32 starts neither artifact (measured 2026-11-30 with this
module's model through llm_release.serving.serve.VllmServer, ServingConfig(enforce_eager=True,
max_model_len=256, max_num_seqs=2)): FP8 fails with "Unsupported FP8 MoE backend: NONE" and
W4A16 with "No WNA16 MoE backend supports the deployment configuration". The artifacts are
checked by loading instead: FP8 through transformers' compressed-tensors integration, W4A16
through compressed-tensors' own decompressor (see decompress_experts)."""

import json

import pytest
from safetensors import safe_open

from llm_release.config import CandidateConfig
from llm_release.quantization.quantize import MODEL_FREE, quantize
from llm_release.serving.tiny_models import build_tiny_moe_model

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_moe_dir(tmp_path_factory, tokenizer_dir):
    return build_tiny_moe_model(tmp_path_factory.mktemp("moe") / "tiny-moe", tokenizer_dir)


def tensors(model_dir) -> dict[str, str]:
    found = {}
    for shard in model_dir.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            found |= {k: f.get_slice(k).get_dtype() for k in f.keys()}
    return found


def check_moe_artifact(model_dir, quantized_leaf: str, dtype: str, *, load=True) -> dict:
    config = json.loads((model_dir / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "compressed-tensors"
    found = tensors(model_dir)
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp"
        assert found[f"{prefix}.gate.weight"] == "BF16", "router gate left in bf16"
        assert f"{prefix}.gate.weight_scale" not in found
        for expert in range(4):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                name = f"{prefix}.experts.{expert}.{proj}"
                assert found[f"{name}.{quantized_leaf}"] == dtype, name
                assert f"{name}.weight_scale" in found, name
    assert found["model.embed_tokens.weight"] == "BF16"
    assert found["lm_head.weight"] == "BF16"
    record = json.loads((model_dir / "llm-release-quantization.json").read_text())
    layers = record["layers"]
    assert "model.layers.1.mlp.experts.3.down_proj" in layers["quantized"]
    assert "router gate" in layers["not_quantized"]["model.layers.0.mlp.gate"]
    assert "(BF16)" in layers["not_quantized"]["model.layers.0.mlp.gate"]
    assert record["moe"] is True and record["num_experts"] == 4
    if load:
        # Loaded back by transformers through its compressed-tensors integration.
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        assert model.model.layers[0].mlp.gate.weight.dtype.is_floating_point
    return record


def decompress_experts(model_dir) -> int:
    """W4A16 experts unpacked by compressed-tensors' own decompressor, zero points included.
    transformers 5.17 cannot load this artifact: its fused-expert decompression
    (DecompressExperts) passes no weight_zero_point, and asymmetric W4A16 then fails with
    "Asymmetric quant requires zero-point values" (measured on this test's model)."""
    import torch
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    group = json.loads((model_dir / "config.json").read_text())["quantization_config"]
    group = group["config_groups"]["group_0"]
    scheme = QuantizationScheme(
        targets=group["targets"], weights=QuantizationArgs(**group["weights"])
    )
    count = 0
    (shard,) = model_dir.glob("*.safetensors")
    with safe_open(shard, "pt") as f:
        for key in f.keys():
            if ".experts." not in key or not key.endswith(".weight_packed"):
                continue
            prefix = key.removesuffix("weight_packed")
            local = {
                leaf: f.get_tensor(prefix + leaf)
                for leaf in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")
            }
            weight = PackedQuantizationCompressor.decompress(local, scheme)["weight"]
            assert tuple(weight.shape) == tuple(local["weight_shape"].tolist())
            assert torch.isfinite(weight).all() and weight.abs().sum() > 0
            count += 1
    return count


def test_fp8_in_memory_and_model_free_agree(tiny_moe_dir, tmp_path):
    candidate = CandidateConfig(name="fp8", scheme="FP8_DYNAMIC")
    in_memory = quantize(tiny_moe_dir, candidate, tmp_path)
    record = check_moe_artifact(in_memory.model_dir, "weight", "F8_E4M3")
    assert record["path"] == "in-memory" and "no GPU" in record["path_reason"]
    model_free = quantize(tiny_moe_dir, candidate, tmp_path, path=MODEL_FREE)
    assert model_free.path == MODEL_FREE and model_free.cache_key != in_memory.cache_key
    check_moe_artifact(model_free.model_dir, "weight", "F8_E4M3")
    assert tensors(model_free.model_dir) == tensors(in_memory.model_dir)


def test_w4a16_awq_keeps_the_gates(tiny_moe_dir, tmp_path):
    candidate = CandidateConfig(
        name="w4a16",
        scheme="W4A16_AWQ",
        group_size=32,  # moe_intermediate_size 32: the experts' down_proj input width
        num_calibration_samples=4,
        max_seq_length=32,
    )
    result = quantize(tiny_moe_dir, candidate, tmp_path)
    record = check_moe_artifact(result.model_dir, "weight_packed", "I32", load=False)
    assert decompress_experts(result.model_dir) == 2 * 4 * 3
    assert record["awq_mappings"] == "llm-compressor registry: Qwen3MoeForCausalLM"
