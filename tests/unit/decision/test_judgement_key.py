"""What makes a judged commit the same question (the nightly run answers it from memory)
and what asks it again. The e2e (tests/e2e/test_decisions_e2e.py) answers one question
from memory and asks another for a second eval set; the key's other cases are here, where
they cost no release."""

import shutil

from llm_release import paths
from llm_release.config import ReleaseConfig
from llm_release.decision.decisions import judgement_key

COMMIT = "c" * 40


def config(**changes) -> ReleaseConfig:
    base = {
        "source": {"repo_id": "org/model", "endpoint": "http://127.0.0.1:1"},
        "candidates": [],
        "evaluation": {"eval_sets": ["refusal_kb"]},
    }
    return ReleaseConfig.model_validate(base | changes)


def test_the_same_question_has_one_key_whatever_the_endpoint_review_or_force():
    key = judgement_key(config(), COMMIT)
    assert key == judgement_key(config(), COMMIT)
    same = [
        config(source={"repo_id": "org/model", "endpoint": "http://mirror:8080"}),
        config(source={"repo_id": "org/model", "revision": "release-branch"}),
        config(force=True),
        config(review={"auto": "approve"}),
    ]
    assert {judgement_key(c, COMMIT) for c in same} == {key}


def test_another_commit_eval_set_or_setting_is_another_question():
    key = judgement_key(config(), COMMIT)
    others = [
        judgement_key(config(), "d" * 40),
        judgement_key(config(evaluation={"eval_sets": ["manufacturing_kb", "refusal_kb"]}), COMMIT),
        judgement_key(config(gates={"ttft_p95_slo_s": 7.5}), COMMIT),
        judgement_key(config(load={"concurrencies": [1, 3]}), COMMIT),
    ]
    assert key not in others and len(set(others)) == len(others)


def test_an_edited_eval_set_asks_again(tmp_path, monkeypatch):
    root = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir(), root)
    monkeypatch.setenv("LLM_RELEASE_EVAL_SETS", str(root))
    before = judgement_key(config(), COMMIT)
    data = root / "refusal_kb" / "data.jsonl"
    lines = data.read_text().splitlines()
    data.write_text("\n".join(lines[:-1]) + "\n")  # one item fewer
    assert judgement_key(config(), COMMIT) != before
    # the shared defaults are part of every set's question too
    data.write_text("\n".join(lines) + "\n")
    assert judgement_key(config(), COMMIT) == before
    defaults = root / "defaults.yaml"
    defaults.write_text(defaults.read_text() + "\n# edited\n")
    assert judgement_key(config(), COMMIT) != before
