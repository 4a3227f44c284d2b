"""Operator flows' input checks and the run-state helpers, without a Prefect API."""

import pytest

from flows.operate import _model_folder
from llm_release.errors import ConfigError
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
