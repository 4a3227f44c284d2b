"""The tuner against real vLLM and GuideLLM on the tiny model, a 2-point grid: the planner's
start (max-num-seqs = the top level) meets the SLO at the top level, so the search stops
without starting the other setting, and the candidate's serving settings are the chosen.
One level only: each costs a GuideLLM run (~20 s on a loaded CI machine)."""

import json

import pytest

from llm_release.config import Gates, LoadProfile, ServingConfig, TuneConfig
from llm_release.hardware import detect
from llm_release.results import TuneResult
from llm_release.serving.tune import tune_candidate

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_tuner_measures_one_server_per_setting_and_stops_at_the_ceiling(tmp_path, tiny_model_dir):
    serving = ServingConfig(enforce_eager=True, max_model_len=512, max_num_seqs=16)
    result, chosen = tune_candidate(
        TuneConfig(enabled=True, max_num_seqs=[1, 2], itl_p95_slo_ms=10_000),
        model_dir=tiny_model_dir,
        tokenizer_dir=tiny_model_dir,
        served_names=["tiny"],
        serving=serving,
        load=LoadProfile(
            concurrencies=[2], requests_per_level=4, prompt_tokens=16, output_tokens=8
        ),
        gates=Gates(ttft_p95_slo_s=60),  # a loaded 2-core CI machine: only a dead server fails
        host=detect(),
        out_dir=tmp_path / "tune",
    )
    # Each trial's setting, levels and why it lost, should the search not stop at the first.
    tried = [
        (t.setting.label(), t.error, t.failures, [lv.model_dump() for lv in t.levels])
        for t in result.trials
    ]
    assert len(result.trials) == 1, tried
    (trial,) = result.trials
    assert trial.error is None, trial.error
    assert [lv.concurrency for lv in trial.levels] == [2]
    assert all(lv.requests == 4 and lv.errors == 0 for lv in trial.levels)
    assert (result.chosen.max_num_seqs, result.chosen_goodput) == (2, 2)
    assert chosen.max_num_seqs == 2 and chosen.enforce_eager
    saved = TuneResult.model_validate_json((tmp_path / "tune" / "tune.json").read_text())
    assert saved.chosen == result.chosen
    (log,) = (tmp_path / "tune").glob("seqs=2*/vllm.log")
    assert "--max-num-seqs 2 " in log.read_text()
    assert json.loads(saved.model_dump_json())["grid_size"] == 2
