"""A data scientist adds an eval set in a scratch copy and runs it against real vLLM —
with no code change: scaffold, edit data, validate, evaluate."""

import json
import shutil

import pytest

from llm_release import paths
from llm_release.cli import main as cli
from llm_release.config import ServingConfig
from llm_release.evaluation.evaluate import run_evaluation
from llm_release.results import MetricGate
from llm_release.serving.serve import VllmServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_new_eval_set_runs_against_a_real_endpoint(tmp_path, monkeypatch, tiny_model_dir):
    sets = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir(), sets)
    monkeypatch.setenv("LLM_RELEASE_EVAL_SETS", str(sets))
    # Not critical, so a floor of 0 is allowed (its gates are reported, never blocking); the
    # random-weight model below scores about nothing.
    assert cli(["eval-sets", "new", "press_limits", "--min-score", "0"]) == 0
    items = [
        {
            "id": f"pl-{k}",
            "passage_id": f"PL-{k}",
            "passage": f"The press PL-{k} must not exceed {100 + k} kN of force.",
            "question": f"What is the force limit of press PL-{k}?",
            "answer": f"{100 + k} kN",
            "tags": ["force"] + (["safety"] if k % 2 else []),
        }
        for k in range(6)
    ]
    (sets / "press_limits" / "data.jsonl").write_text(
        "".join(json.dumps(item) + "\n" for item in items)
    )
    task = sets / "press_limits" / "task.yaml"
    task.write_text(
        task.read_text().replace(
            "- metric: numeric_match", "- metric: numeric_match\n  - metric: cites_source"
        )
    )
    assert cli(["eval-sets", "validate", "press_limits"]) == 0

    serving = ServingConfig(enforce_eager=True, max_model_len=1024, max_num_seqs=4)
    with VllmServer(tiny_model_dir, ["tiny"], serving, tmp_path / "vllm.log") as server:
        results = run_evaluation(
            server.base_url, "tiny", ["press_limits"], tmp_path / "eval", num_concurrent=2
        )
    (result,) = results
    assert result.eval_set == "press_limits" and result.num_items == 6
    assert set(result.metrics) == {"numeric_match", "cites_source"}
    assert {i.id for i in result.items} == {f"pl-{k}" for k in range(6)}
    assert all(i.prompt.startswith("Passage [PL-") for i in result.items), result.items[0].prompt
    assert result.gates.metrics["numeric_match"] == MetricGate(min_score=0.0, max_drop=0.05)
    assert result.gates.critical is False
    samples = (tmp_path / "eval" / "press_limits.samples.jsonl").read_text().splitlines()
    assert len(samples) == 6
