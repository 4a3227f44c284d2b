import json
import shutil
from pathlib import Path

import pytest

from llm_release import paths
from llm_release.errors import EvalError
from llm_release.evaluate import load_decoding, load_eval_set, task_config


def test_every_eval_set_in_the_repo_loads():
    names = [
        p.name
        for p in paths.eval_sets_dir().iterdir()
        if (p / "task.yaml").exists() and not p.name.startswith("_")
    ]
    assert "manufacturing_kb" in names
    decoding = load_decoding()
    for name in names:
        eval_set = load_eval_set(name)
        config = task_config(eval_set, decoding)
        assert Path(config["dataset_kwargs"]["data_files"]["test"]).is_absolute()
        assert config["generation_kwargs"]["temperature"] == decoding["temperature"]


def test_process_results_scores_with_the_registered_metric():
    config = task_config(load_eval_set("manufacturing_kb"), load_decoding())
    doc = {"answer": "85 N·m"}
    assert config["process_results"](doc, ["It is 85 N·m."]) == {"numeric_match": 1.0}
    assert config["process_results"](doc, ["It is 80 N·m."]) == {"numeric_match": 0.0}


@pytest.fixture()
def sets_root(tmp_path):
    root = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir() / "manufacturing_kb", root / "kb2")
    text = (root / "kb2" / "task.yaml").read_text().replace("task: manufacturing_kb", "task: kb2")
    (root / "kb2" / "task.yaml").write_text(text)
    return root


def edit(root: Path, old: str, new: str) -> None:
    path = root / "kb2" / "task.yaml"
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))


def test_copied_set_loads(sets_root):
    assert load_eval_set("kb2", sets_root).name == "kb2"


def test_unknown_metric(sets_root):
    edit(sets_root, "metric: numeric_match", "metric: bleu")
    with pytest.raises(EvalError, match="unknown metric 'bleu'"):
        load_eval_set("kb2", sets_root)


def test_code_tags_are_refused(sets_root):
    path = sets_root / "kb2" / "task.yaml"
    path.write_text(path.read_text() + "process_results: !function utils.process\n")
    with pytest.raises(EvalError, match="!function"):
        load_eval_set("kb2", sets_root)


def test_unknown_key_is_refused(sets_root):
    path = sets_root / "kb2" / "task.yaml"
    path.write_text(path.read_text() + "filter_list: []\n")
    with pytest.raises(EvalError, match="filter_list"):
        load_eval_set("kb2", sets_root)


def test_data_file_must_exist_inside_the_folder(sets_root):
    edit(sets_root, "test: data.jsonl", "test: ../../etc/passwd")
    with pytest.raises(EvalError, match="must exist inside"):
        load_eval_set("kb2", sets_root)


def test_missing_set_lists_available(sets_root):
    with pytest.raises(EvalError) as info:
        load_eval_set("nope", sets_root)
    assert "kb2" in str(info.value)


def test_eval_items_do_not_overlap_calibration():
    calibration = {
        json.loads(line)["text"]
        for line in (paths.calibration_dir() / "manufacturing_maintenance.jsonl")
        .read_text()
        .splitlines()
    }
    for line in (
        (paths.eval_sets_dir() / "manufacturing_kb" / "data.jsonl").read_text().splitlines()
    ):
        passage = json.loads(line)["passage"]
        assert not any(passage in text for text in calibration)
