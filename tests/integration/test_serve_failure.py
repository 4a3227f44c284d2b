"""A candidate whose vLLM server cannot start fails alone, with the log tail, leaving no process."""

import pytest

from llm_release.candidate import measure
from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from tests.helpers import vllm_processes

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_bad_arguments_fail_the_candidate_with_the_log_tail(home, tiny_model_dir, tmp_path):
    before = vllm_processes()
    serving = ServingConfig(enforce_eager=True, extra_args=["--no-such-vllm-flag"])
    result = measure(
        name="broken",
        scheme="FP8_DYNAMIC",
        model_dir=tiny_model_dir,
        tokenizer_dir=tiny_model_dir,
        serving=serving,
        evaluation=EvalConfig(),
        load=LoadProfile(),
        out_dir=tmp_path / "broken",
        public_name="tiny",
    )
    assert result.status == "failed"
    assert "ServeError" in result.error
    assert "bad vLLM arguments" in result.error
    assert "--no-such-vllm-flag" in result.error, "the server's log tail is not in the error"
    assert vllm_processes() == before
