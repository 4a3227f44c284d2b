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
    state = completed_with_failures(
        "outcome", {"broken": "ServeError: vLLM exited with code 2\n  --- server log tail ---\nx"}
    )
    assert state.is_completed() and state.name == FAILED_CANDIDATES
    assert (
        state.message == "failed candidates: broken — broken: ServeError: vLLM exited with code 2"
    )
    assert first_line(None) == "failed" and len(first_line("x" * 1000)) == 200
