"""Operator flows' input checks and the run-state helpers, without a Prefect API."""

import re
from pathlib import Path

import pytest

from flows.operate import _markdown, _model_folder
from llm_release.errors import ConfigError
from llm_release.results import EvalResult, MetricScore
from tasks.states import FAILED_CANDIDATES, completed_with_failures, first_line


def test_eval_only_refuses_a_relative_or_non_model_folder(tmp_path):
    with pytest.raises(ConfigError, match="not an absolute path"):
        _model_folder("models/x")
    with pytest.raises(ConfigError, match="no config.json"):
        _model_folder(str(tmp_path))
    # A path that climbs out is judged where it lands, not by its spelling.
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    assert _model_folder(f"{tmp_path}/x/../m") == tmp_path / "m"
    with pytest.raises(ConfigError, match="no config.json"):
        _model_folder(f"{tmp_path}/m/..")


def test_failed_candidates_name_the_final_state():
    assert completed_with_failures("outcome", {}) == "outcome"
    error = (
        "ServeError: vLLM for tiny exited with code 2 before it was healthy\n"
        "  --- server log tail ---\n  [--spec-model SPEC_MODEL]\n"
        "api_server.py: error: unrecognized arguments: --no-such-vllm-flag\n"
    )
    state = completed_with_failures("outcome", {"broken": error, "fp8": "QuantizeError: x"})
    assert state.is_completed() and state.name == FAILED_CANDIDATES
    assert state.message == (
        "failed candidates: broken, fp8 — broken: ServeError: vLLM for tiny exited with code 2 "
        "before it was healthy | log: api_server.py: error: unrecognized arguments: "
        "--no-such-vllm-flag; fp8: QuantizeError: x"
    )
    assert first_line(None) == "failed" and len(first_line("x" * 1000)) == 300


def test_the_eval_only_scores_table_has_a_row_per_metric():
    results = [
        EvalResult(
            eval_set="refusal_kb",
            num_items=12,
            metrics={
                "refusal": MetricScore(value=0.91666, ci_low=0.8, ci_high=1.0),
                "numeric_match": MetricScore(value=1),
            },
        ),
        EvalResult(eval_set="kb", num_items=3, metrics={"exact": MetricScore(value=0.5)}),
    ]
    text = _markdown("stable release r1", results, Path("/runs/eval-report.md"))
    assert text.startswith("# Evaluation of stable release r1\n\nReport: `/runs/eval-report.md`")
    rows = [
        [cell.strip() for cell in line.split("|")[1:-1]]
        for line in text.splitlines()
        if line.startswith("|")
    ]
    assert rows[0] == ["eval set", "metric", "score", "95% CI", "items"]
    assert re.fullmatch(r"[-|]+", text.splitlines()[5])  # the header's separator line
    assert rows[2:] == [
        ["refusal_kb", "refusal", "0.917", "0.800 – 1.000", "12"],
        ["refusal_kb", "numeric_match", "1.000", "–", "12"],
        ["kb", "exact", "0.500", "–", "3"],
    ]
