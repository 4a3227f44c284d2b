"""bench/tune_goodput.py's GPU run without a GPU: the grids each strategy searches, the
settings they share, and the ratios of a results file filled by separate calls."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from llm_release.hardware import detect

BENCH = Path(__file__).resolve().parents[3] / "bench" / "tune_goodput.py"


def _bench():
    spec = importlib.util.spec_from_file_location("tune_goodput", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GPU_ARGS = [
    "--gpu",
    "--seqs",
    "64,256,1024",
    "--batched",
    "2048,default",
    "--gmu",
    "0.85,0.9",
    "--levels",
    "10,50,100",
    "--requests",
    "100",
    "--extra-args",
    "--load-format dummy",
    "--strategies",
    "defaults,coordinate",
]


def test_a_gpu_run_is_compiled_and_shares_one_serving_setup(monkeypatch):
    bench = _bench()
    args = bench.parse_args(GPU_ARGS)
    monkeypatch.delenv("LLM_RELEASE_ALLOW_SERVING_FLAGS", raising=False)
    with pytest.raises(ValueError, match="--load-format"):
        bench.setup(args, detect())  # the operator's allow-list, as for any release
    monkeypatch.setenv("LLM_RELEASE_ALLOW_SERVING_FLAGS", "--load-format")
    serving, load, gates = bench.setup(args, detect())
    assert serving.enforce_eager is False and serving.dtype == "bfloat16"
    assert serving.extra_args == ["--load-format", "dummy"]
    assert load.concurrencies == [10, 50, 100] and load.requests_per_level == 100
    cpu = bench.setup(bench.parse_args([]), detect())[0]
    assert cpu.enforce_eager is True


def test_each_strategy_searches_its_grid_and_defaults_are_vllms_own():
    bench = _bench()
    args = bench.parse_args(GPU_ARGS)
    tuner = bench.tune_config(args, "coordinate")
    assert tuner.strategy == "coordinate"
    assert tuner.max_num_seqs == [64, 256, 1024]
    assert tuner.max_num_batched_tokens == [2048, None]  # "default": vLLM's own value
    assert tuner.gpu_memory_utilization == [0.85, 0.9]
    defaults = bench.tune_config(args, "defaults")
    # one point, every level measured: what serving with no tuning at all gives
    assert defaults.strategy == "exhaustive"
    assert (defaults.max_num_seqs, defaults.max_num_batched_tokens) == ([1024], [None])
    assert defaults.gpu_memory_utilization == [0.9]


def test_an_unknown_strategy_is_refused():
    bench = _bench()
    with pytest.raises(SystemExit):
        bench.parse_args(["--strategies", "coordinate,grid"])


def _trial(seqs: int, goodput: int, tok_s: float) -> dict:
    return {"setting": {"max_num_seqs": seqs}, "goodput": goodput, "goodput_tok_s": tok_s}


def test_ratios_wait_for_both_strategies_and_compare_like_with_like():
    bench = _bench()
    tuned = {"result": {"chosen": {"max_num_seqs": 256}, "seconds": 300.0, "trials": []}}
    assert bench.ratios({"coordinate": tuned}) == {}
    full = {
        "result": {
            "chosen": {"max_num_seqs": 1024},
            "seconds": 1000.0,
            # the tuner's choice as the exhaustive sweep measured it: 50 streams, 9,000 tok/s
            "trials": [_trial(256, 50, 9000.0), _trial(1024, 100, 11000.0), _trial(64, 10, 1.0)],
        }
    }
    assert bench.ratios({"coordinate": tuned, "exhaustive": full}) == {
        "ratio_goodput_concurrency": 0.5,
        "ratio_goodput_tok_s": round(9000 / 11000, 3),
        "ratio_time": 0.3,
    }
