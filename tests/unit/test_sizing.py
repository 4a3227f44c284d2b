"""The release is sized before any download: a setting that cannot hold one sequence stops it."""

import pytest

from llm_release.config import ReleaseConfig
from llm_release.errors import ConfigError
from llm_release.hardware import CpuInfo, Hardware
from llm_release.hub_headers import ModelFiles
from llm_release.sizing import plan_release
from tests.unit.test_planner import llama

CPU = Hardware(cpu=CpuInfo(model_name="cpu", cores=2, flags=["avx2"]), machine="x86_64")


def release(max_model_len: int) -> ReleaseConfig:
    return ReleaseConfig.model_validate(
        {
            "source": {"repo_id": "meta/llama-3-8b"},
            "serving": {"dtype": "bfloat16", "max_model_len": max_model_len},
        }
    )


def test_a_serving_config_that_cannot_fit_is_refused_naming_the_number():
    llama3_8b = llama(
        num_hidden_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
    )
    files = ModelFiles(source="hub", config=llama3_8b, tensors={}, shards=[])
    # Llama-3-8B keeps 128 KiB of KV per token in bf16: 1 GiB of CPU KV space holds 8,192.
    ok = plan_release(release(4096), CPU, files)
    assert ok.fits and ok.options[0].kv_cache_tokens == 8192
    with pytest.raises(ConfigError) as caught:
        plan_release(release(16384), CPU, files)
    assert "16,384" in caught.value.message or "16384" in caught.value.message
    assert "max_model_len" in caught.value.hint
