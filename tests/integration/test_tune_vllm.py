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


def test_speculation_is_served_and_its_greedy_answers_compared(tmp_path, tiny_model_dir):
    """Prompt-lookup speculation on vLLM's CPU runtime: the setting without it is measured
    first and answers the domain prompts greedily, the one with it too; the tuner compares
    them before it may choose speculation."""
    from llm_release.config import Speculation

    ngram = Speculation(method="ngram", num_speculative_tokens=2, prompt_lookup_max=3)
    serving = ServingConfig(enforce_eager=True, max_model_len=512, max_num_seqs=2)
    result, chosen = tune_candidate(
        TuneConfig(
            enabled=True,
            strategy="exhaustive",
            max_num_seqs=[2],
            speculation=[ngram],
            itl_p95_slo_ms=10_000,
        ),
        model_dir=tiny_model_dir,
        tokenizer_dir=tiny_model_dir,
        served_names=["tiny"],
        serving=serving,
        load=LoadProfile(
            concurrencies=[2], requests_per_level=4, prompt_tokens=16, output_tokens=8
        ),
        gates=Gates(ttft_p95_slo_s=60),
        host=detect(),
        out_dir=tmp_path / "tune",
    )
    plain, speculative = result.trials
    assert plain.setting.speculation is None and speculative.setting.speculation == ngram
    assert plain.error is None and speculative.error is None, (plain.error, speculative.error)
    logs = {p.parent.name: p.read_text() for p in (tmp_path / "tune").glob("*/vllm.log")}
    (spec_log,) = [text for name, text in logs.items() if "spec=" in name]
    assert '"method": "ngram"' in spec_log
    answers = {
        p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "tune").glob("*/answers.json")
    }
    assert len(answers) == 2 and all(len(a) == 6 for a in answers.values())
    same = len({json.dumps(a) for a in answers.values()}) == 1
    # The tuner's verdict is what the two servers answered, and only a setting whose
    # answers matched may be chosen.
    assert (speculative.answers_changed is None) == same, speculative.answers_changed
    assert chosen.speculation in ((None, ngram) if same else (None,))


def test_each_level_of_a_server_sends_prompts_it_has_not_seen(tmp_path, tiny_model_dir):
    """The tuner measures a server's levels in one GuideLLM run each. With GuideLLM's one
    seed every run sent the first run's synthetic prompts again, and vLLM's prefix cache
    served them: 81% of the prompt tokens at every level after a server's first on 2 CPU
    cores, 97% on an H100, against 3% in the release's one-run sweep. Real vLLM, prefix
    caching on, prompts of two cache blocks: the second level's hit rate is that of new
    prompts (the chat template's first tokens at most)."""
    from llm_release.results import Setting
    from llm_release.serving.tune import vllm_session

    serving = ServingConfig(enforce_eager=True, max_model_len=512, enable_prefix_caching=True)
    profile = LoadProfile(
        concurrencies=[2, 4], requests_per_level=4, prompt_tokens=300, output_tokens=4
    )
    session = vllm_session(tiny_model_dir, ["tiny"], serving, tiny_model_dir, profile, tmp_path)
    with session(Setting(max_num_seqs=4)) as probe:
        first, second = probe(2), probe(4)
    assert (first.requests, second.requests, second.errors) == (4, 4, 0), (first, second)
    assert second.prefix_cache_hit_rate is not None
    assert second.prefix_cache_hit_rate < 0.3, second
