"""GuideLLM against a real vLLM endpoint: a single-level sweep, and a level cut by its time
limit, which is reported as such and not run again."""

import pytest

from llm_release.config import LoadProfile, ServingConfig
from llm_release.load.loadtest import run_load_test
from llm_release.serving.serve import VllmServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_load_levels_are_measured_and_time_limits_reported(tmp_path, tiny_model_dir):
    serving = ServingConfig(enforce_eager=True, max_model_len=1024, max_num_seqs=4)
    with VllmServer(tiny_model_dir, ["tiny"], serving, tmp_path / "vllm.log") as server:
        full = run_load_test(
            server.base_url,
            "tiny",
            tiny_model_dir,
            LoadProfile(concurrencies=[3], requests_per_level=6, prompt_tokens=16, output_tokens=8),
            tmp_path / "full",
        )
        cut = run_load_test(
            server.base_url,
            "tiny",
            tiny_model_dir,
            LoadProfile(
                concurrencies=[1],
                requests_per_level=100_000,
                prompt_tokens=16,
                output_tokens=64,
                max_seconds_per_level=3,
            ),
            tmp_path / "cut",
        )

    (level,) = full.levels
    assert (level.concurrency, level.requests, level.errors) == (3, 6, 0)
    assert level.ttft_p95_ms > 0 and level.output_tokens_per_s > 0
    assert full.notes == []

    (level,) = cut.levels
    assert level.time_limited and 0 < level.requests < 100_000
    # A level stopped by its time limit is not run again. The one re-run allowed is of a first
    # run GuideLLM closed early, before its time limit (its race: loadtest.short_levels; seen
    # on a loaded 2-core machine, 4 of 8 requests recorded at 2.5 s of 3): the re-run that
    # the time limit stopped is then the last.
    assert cut.attempts == 1 or (cut.attempts == 2 and level.time_limited), cut
    assert cut.notes == [
        f"concurrency 1: {level.requests} of 100000 requests (stopped by max_seconds_per_level)"
    ]
