"""An eval set's items as the traffic the evaluation, the canary's probes and a load test's
``prompts_from`` send: the same chat messages, in the set's order."""

import shutil

import pytest

from llm_release import paths
from llm_release.errors import ReleaseError
from llm_release.evaluation.authoring import scaffold
from llm_release.evaluation.evalsets import load_eval_set
from llm_release.evaluation.items import chat_messages, load_items, traffic


def test_a_sets_traffic_is_its_items_prompts_in_order():
    prompts = traffic("manufacturing_kb")
    eval_set = load_eval_set("manufacturing_kb")
    items = load_items(eval_set)
    assert len(prompts) == len(items) == 80
    assert prompts == [chat_messages(eval_set, item) for item in items]
    first = prompts[0][-1]
    assert first["role"] == "user" and items[0]["question"] in first["content"]


def test_a_description_is_the_system_message(tmp_path):
    root = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir(), root)
    scaffold("kb2", root, min_score=0.0)
    task = root / "kb2" / "task.yaml"
    task.write_text(task.read_text() + 'description: "Answer from the passage only."\n')
    (system, user) = traffic("kb2", root)[0]
    assert system == {"role": "system", "content": "Answer from the passage only."}
    assert user["role"] == "user" and user["content"]


def test_a_set_that_does_not_exist_is_one_line_naming_the_others(tmp_path):
    with pytest.raises(ReleaseError, match="eval set 'nope' not found"):
        traffic("nope")
