"""scripts/gpu/release_proof.py without a GPU: its refusals, and the record it writes."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from llm_release.results import CandidateResult, EvalResult, LoadLevel, LoadResult, MetricScore
from llm_release.sizing.vllm_report import KvCheck

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu" / "release_proof.py"


def _load():
    spec = importlib.util.spec_from_file_location("release_proof", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, vllm_python: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LLM_RELEASE_VLLM_PYTHON=vllm_python, CUDA_VISIBLE_DEVICES="")
    return subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "smollm2",
            "--work",
            str(tmp_path),
            "--jsonl",
            str(tmp_path / "out.jsonl"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_refuses_in_one_line_without_a_serving_python(tmp_path):
    proc = _run(tmp_path, str(tmp_path / "no-such-python"))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"release_proof: no serving python at {tmp_path / 'no-such-python'}; "
        "set LLM_RELEASE_VLLM_PYTHON"
    ]
    assert not (tmp_path / "out.jsonl").exists()


def test_refuses_a_python_without_vllm(tmp_path):
    proc = _run(tmp_path, sys.executable)  # the pipeline's venv has no vLLM
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot import vllm" in lines[0]
    assert "ModuleNotFoundError" in lines[0]


def test_refuses_without_a_gpu_even_with_vllm(tmp_path):
    vllm_python = ROOT / ".venv-vllm" / "bin" / "python"
    assert vllm_python.exists(), "make setup creates .venv-vllm (vLLM CPU)"
    proc = _run(tmp_path, str(vllm_python))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "release_proof: no CUDA GPU is visible (torch.cuda.is_available() is False)"
    ]


def test_record_has_the_keys_the_issue_names():
    proof = _load()
    level = LoadLevel(
        concurrency=10,
        requests=200,
        errors=1,
        error_rate=0.005,
        ttft_p50_ms=20.0,
        ttft_p95_ms=45.5,
        itl_p50_ms=3.0,
        itl_p95_ms=4.25,
        output_tokens_per_s=9000.0,
        requests_per_s=70.0,
    )
    result = CandidateResult(
        name="smollm2-fp8-dynamic",
        scheme="FP8_DYNAMIC",
        model_dir="/tmp/m",
        size_bytes=123,
        status="measured",
        kv_check=KvCheck(
            planner_kv_cache_tokens=990,
            vllm_kv_cache_tokens=1000,
            tokens_error=-0.01,
            planner_max_concurrency=0.99,
            vllm_max_concurrency=1.0,
            concurrency_error=-0.01,
            max_model_len=1000,
            device="gpu",
            planner_overhead_bytes=2**30,
        ),
        evals=[
            EvalResult(
                eval_set="refusal_kb",
                num_items=20,
                metrics={"exact_match": MetricScore(value=0.75)},
            )
        ],
        load=LoadResult(levels=[level]),
        stage_seconds={"serve_start": 80.0},
    )
    from llm_release.config import ServingConfig

    line = proof.record(
        model="SmolLM2",
        scheme="FP8_DYNAMIC",
        source="project-quantize",
        result=result,
        serving=ServingConfig(max_model_len=4096),
        env={"vllm_version": "0.26.0", "gpu": "H200"},
    )
    for key in (
        "model",
        "scheme",
        "source",
        "healthy",
        "vllm_version",
        "gpu_memory_utilization",
        "kv_tokens_vllm",
        "kv_tokens_planner",
        "eval",
        "load",
    ):
        assert key in line
    assert line["healthy"] is True and line["source"] == "project-quantize"
    assert (line["kv_tokens_vllm"], line["kv_tokens_planner"]) == (1000, 990)
    assert line["eval"] == {"refusal_kb": 0.75}
    assert line["load"] == [
        {
            "concurrency": 10,
            "requests": 200,
            "ttft_p95_s": 0.0455,
            "itl_p95_ms": 4.25,
            "output_tok_s": 9000.0,
            "errors": 1,
        }
    ]


def test_a_server_that_never_started_is_not_healthy():
    proof = _load()
    from llm_release.config import ServingConfig

    failed = CandidateResult(
        name="x",
        scheme="bf16",
        model_dir="/tmp/m",
        size_bytes=1,
        status="failed",
        error="ServeError: died",
    )
    line = proof.record(
        model="m",
        scheme="bf16",
        source="baseline",
        result=failed,
        serving=ServingConfig(),
        env={"vllm_version": "0.26.0", "gpu": "H200"},
    )
    assert line["healthy"] is False and line["kv_tokens_vllm"] is None and line["load"] == []


def test_served_seqs_reads_the_servers_argv(tmp_path):
    proof = _load()
    log = tmp_path / "vllm.log"
    log.write_text(
        "$ /tmp/vpy -m vllm.entrypoints.openai.api_server --max-num-seqs 973 --x\nINFO\n"
    )
    assert proof.served_seqs(log) == 973
    log.write_text("garbage\n")
    assert proof.served_seqs(log) is None


def test_the_random_shapes_are_what_their_names_say():
    import transformers

    from llm_release.sizing import estimate_params, parse_config

    proof = _load()
    sizes = {}
    for step, (_folder, description, config_class, fields) in proof.RANDOM_MODELS.items():
        config = getattr(transformers, config_class)(vocab_size=49152, **fields)
        arch = parse_config(config.to_dict())
        sizes[step] = estimate_params(arch)
        assert step in ("dense", "moe") and description.startswith("random")
    assert 2.3e9 < sizes["dense"].total < 2.6e9  # "2.45B" (untied: 2.58B)
    assert (
        sizes["moe"].total > sizes["dense"].total
        and parse_config(
            transformers.Qwen3MoeConfig(**proof.RANDOM_MODELS["moe"][3]).to_dict()
        ).moe.experts_per_token
        == 8
    )


def test_the_full_size_shapes_are_config_only_folders_with_their_flags(tmp_path, monkeypatch):
    from llm_release.serving.serving_flags import check_serving_args
    from llm_release.sizing import estimate_params, parse_config

    proof = _load()
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text("{}")
    (tok / "tokenizer_config.json").write_text("{}")
    params = {}
    for step in ("moe-full", "hybrid"):
        _name, folder, _tok = proof.models_for(step, tmp_path / "work", tok)
        # config and tokenizer only: vLLM's --load-format dummy fills the weights
        assert sorted(p.name for p in folder.iterdir()) == [
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
        arch = parse_config(__import__("json").loads((folder / "config.json").read_text()))
        params[step] = estimate_params(arch).total
        assert proof.schemes_for(step, ["bf16", "FP8_DYNAMIC"]) == ["bf16"]
        flags = proof.serving_flags_for(step)
        # --load-format is the operator's to allow, not a run's
        monkeypatch.delenv("LLM_RELEASE_ALLOW_SERVING_FLAGS", raising=False)
        try:
            check_serving_args(flags, "serving.extra_args")
        except ValueError as exc:
            assert "--load-format" in str(exc)
        else:
            raise AssertionError("--load-format passed without the operator's allow-list")
        monkeypatch.setenv("LLM_RELEASE_ALLOW_SERVING_FLAGS", "--load-format")
        assert ("--load-format", "dummy") in check_serving_args(flags, "serving.extra_args")
    assert 29e9 < params["moe-full"] < 32e9  # Qwen3-30B-A3B
    assert 33e9 < params["hybrid"] < 37e9  # Qwen3.5-35B-A3B
    assert "--gdn-prefill-backend" in proof.serving_flags_for("hybrid")
    assert proof.serving_flags_for("dense") == []
