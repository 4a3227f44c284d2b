"""`llm-release plan` plans at the length the release serves (serving.max_model_len), and
prints the figure at the model's own maximum beside it."""

from __future__ import annotations

import json
import shutil

import pytest

from llm_release.cli import main
from llm_release.config import ServingConfig


@pytest.fixture()
def long_model(tiny_model_dir, tmp_path):
    """The tiny model, declaring 8,192 positions (the release serves 2,048)."""
    folder = tmp_path / "long"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_plan_defaults_to_the_serving_length_and_shows_the_model_maximum(long_model, capsys):
    assert ServingConfig().max_model_len == 2048
    assert main(["plan", str(long_model), "--cpu-kvcache-gib", "1"]) == 0
    out = capsys.readouterr().out
    assert "max_model_len 2,048" in out.splitlines()[2]  # the headline is the serving length
    assert (
        "planned at max_model_len 2,048 (the release's default serving.max_model_len); "
        "at the model's maximum, 8,192: TP 1: 2,097,152 KV tokens"
    ) in out
    assert main(["plan", str(long_model), "--cpu-kvcache-gib", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["max_model_len"] == 2048


def test_plan_takes_the_length_of_a_release_config(long_model, tmp_path, capsys):
    config = tmp_path / "release.json"
    config.write_text(json.dumps({"serving": {"max_model_len": 1024}}))
    assert main(["plan", str(long_model), "--cpu-kvcache-gib", "1", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"planned at max_model_len 1,024 (serving.max_model_len of {config})" in out
    # an explicit length wins, and a model whose maximum it is prints no second figure
    argv = ["plan", str(long_model), "--cpu-kvcache-gib", "1", "--max-model-len", "8192"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "max_model_len 8,192" in out and "at the model's maximum" not in out


def test_the_shipped_demo_config_is_what_plan_reads(long_model, capsys):
    from llm_release.paths import project_root

    demo = project_root() / "configs" / "demo.json"
    length = json.loads(demo.read_text())["serving"]["max_model_len"]
    assert main(["plan", str(long_model), "--cpu-kvcache-gib", "1", "--config", str(demo)]) == 0
    assert f"planned at max_model_len {length:,} (serving.max_model_len of {demo})" in (
        capsys.readouterr().out
    )


def test_a_broken_release_config_is_one_line(long_model, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"serving": {"max_model_len": 1}}))
    assert main(["plan", str(long_model), "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --config") and "max_model_len" in err
    assert len(err.strip().splitlines()) == 1


def test_plan_says_which_gpu_memory_it_assumed(long_model, capsys):
    # no GPU here: the 80 GiB card is assumed and said; an explicit size is used as given
    assert main(["plan", str(long_model), "--gpus", "1"]) == 0
    out = capsys.readouterr().out
    assert "GPU memory: no GPU here, 80 GiB per GPU assumed" in out
    assert (
        main(["plan", str(long_model), "--gpus", "1", "--gpu-memory-gib", "139.8", "--json"]) == 0
    )
    plan = json.loads(capsys.readouterr().out)
    assert plan["request"]["gpu_memory_gib"] == 139.8


def test_plan_sizes_with_the_config_files_serving_settings_and_a_flag_wins(
    long_model, tmp_path, capsys
):
    """issue 35: a plan for 0.5 and fp8 KV came out for 0.9 and bf16 (only the length was
    read from the file)."""
    config = tmp_path / "release.json"
    config.write_text(
        json.dumps(
            {
                "serving": {
                    "max_model_len": 1024,
                    "gpu_memory_utilization": 0.5,
                    "kv_cache_dtype": "fp8",
                    "enable_prefix_caching": False,
                    "extra_args": ["--max-num-batched-tokens", "1024"],
                }
            }
        )
    )
    base = ["plan", str(long_model), "--gpus", "1", "--config", str(config), "--json"]
    assert main(base) == 0
    request = json.loads(capsys.readouterr().out)["request"]
    assert request["gpu_memory_utilization"] == 0.5
    assert request["kv_cache_dtype"] == "fp8"
    assert request["enable_prefix_caching"] is False
    assert request["max_num_batched_tokens"] == 1024
    assert request["max_model_len"] == 1024
    flags = ["--gpu-memory-utilization", "0.8", "--kv-cache-dtype", "auto"]
    flags += ["--enable-prefix-caching", "--max-num-batched-tokens", "4096"]
    assert main(base + flags) == 0
    request = json.loads(capsys.readouterr().out)["request"]
    assert request["gpu_memory_utilization"] == 0.8
    assert request["kv_cache_dtype"] == "auto"
    assert request["enable_prefix_caching"] is True
    assert request["max_num_batched_tokens"] == 4096
    # fp8 KV halves the bytes: the file's setting shows in the figure, not only the request
    assert main(base) == 0
    fp8 = json.loads(capsys.readouterr().out)["options"][0]["kv_bytes_per_token"]
    assert main(base + ["--kv-cache-dtype", "auto"]) == 0
    assert json.loads(capsys.readouterr().out)["options"][0]["kv_bytes_per_token"] == 2 * fp8
    # no file: the defaults as before
    assert main(["plan", str(long_model), "--gpus", "1", "--json"]) == 0
    request = json.loads(capsys.readouterr().out)["request"]
    assert request["gpu_memory_utilization"] == 0.9 and request["kv_cache_dtype"] == "auto"
