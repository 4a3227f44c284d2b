"""`llm-release plan` takes max_num_seqs and enforce_eager like the other serving settings
(issue 35): --config's value, a flag given wins. (gpu_memory_utilization, kv_cache_dtype and
the rest: tests/unit/test_cli_plan.py.)"""

from __future__ import annotations

import json

from llm_release.cli import main


def _request(capsys, argv):
    assert main(argv) in (0, 1)
    return json.loads(capsys.readouterr().out)


def test_plan_reads_max_num_seqs_and_eager_from_the_config_and_a_flag_wins(
    tiny_model_dir, tmp_path, capsys
):
    config = tmp_path / "release.json"
    serving = {"max_model_len": 1024, "max_num_seqs": 22, "enforce_eager": True}
    config.write_text(json.dumps({"serving": serving}))
    base = ["plan", str(tiny_model_dir), "--gpus", "1", "--gpu-memory-gib", "139.8"]
    base += ["--vllm-version", "0.32.0", "--json"]
    result = _request(capsys, base + ["--config", str(config)])
    assert result["request"]["max_num_seqs"] == 22
    assert result["request"]["enforce_eager"] is True
    assert result["options"][0]["cuda_graph_bytes"] == 0
    flags = ["--max-num-seqs", "64", "--no-enforce-eager"]
    result = _request(capsys, base + ["--config", str(config)] + flags)
    assert result["request"]["max_num_seqs"] == 64
    assert result["request"]["enforce_eager"] is False
    assert result["options"][0]["cuda_graph_bytes"] > 0
    # no file, no flag: vLLM's defaults
    result = _request(capsys, base)
    assert result["request"]["max_num_seqs"] is None
    assert result["request"]["enforce_eager"] is False


def test_plan_reads_eager_and_unmodelled_flags_from_extra_args(tiny_model_dir, tmp_path, capsys):
    config = tmp_path / "release.json"
    extra = ["--enforce-eager", "--cpu-offload-gb", "2"]
    config.write_text(json.dumps({"serving": {"max_model_len": 1024, "extra_args": extra}}))
    argv = ["plan", str(tiny_model_dir), "--gpus", "1", "--gpu-memory-gib", "80", "--json"]
    result = _request(capsys, argv + ["--config", str(config)])
    assert result["request"]["enforce_eager"] is True
    assert any(n.startswith("--cpu-offload-gb 2 (") for n in result["notes"])


def test_an_a100_is_planned_with_vllms_smaller_batch_defaults(tiny_model_dir, capsys):
    """vLLM gives a GPU of ≥70 GiB 1,024 sequences and 8,192 tokens a step, but an A100 of
    80 GB 256 and 2,048 (arg_utils.get_batch_defaults reads the device name): fewer graphs."""
    base = ["plan", str(tiny_model_dir), "--gpus", "1", "--gpu-memory-gib", "79.2"]
    base += ["--vllm-version", "0.32.0", "--max-model-len", "1024", "--json"]
    a100 = _request(capsys, [*base, "--gpu-name", "NVIDIA A100-SXM4-80GB"])
    h100 = _request(capsys, [*base, "--gpu-name", "NVIDIA H100 80GB HBM3"])
    assert a100["request"]["gpu_name"] == "NVIDIA A100-SXM4-80GB"
    assert 0 < a100["options"][0]["cuda_graph_bytes"] < h100["options"][0]["cuda_graph_bytes"]
