"""Eval sets are hostile input too: nesting is bounded before any YAML parser runs, and a
set that passed is checked again only when a file its check read changed (by content)."""

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from llm_release import paths
from llm_release.evaluation import evalsets, set_checks
from llm_release.evaluation.set_checks import validate_cached
from llm_release.evaluation.set_files import EvalSetError


@pytest.fixture()
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    root = tmp_path / "eval_sets"
    root.mkdir()
    shutil.copy(paths.eval_sets_dir() / "defaults.yaml", root)
    shutil.copytree(paths.eval_sets_dir() / "_template", root / "kb2")
    task = root / "kb2" / "task.yaml"
    task.write_text(task.read_text().replace("task: my_eval_set", "task: kb2"))
    return root


def task_path(root: Path) -> Path:
    return root / "kb2" / "task.yaml"


@pytest.mark.parametrize(
    "nested",
    [
        # 30 KB of '[': about a minute of CPU in PyYAML's scanner before it was refused
        "a: " + "[" * 15_000 + "]" * 15_000,
        "a: " + "{a: " * 7_000 + "}" * 7_000,
        "a: " + "[{" * 15_000,
        "a:\n  " + "- " * 30_000 + "x",
        "? " * 30_000 + "x",
        "".join(" " * i + f"k{i}:\n" for i in range(300)),
    ],
    ids=["flow-lists", "flow-maps", "unclosed", "dashes", "complex-keys", "indentation"],
)
def test_deep_nesting_is_refused_within_a_second(root, nested):
    task_path(root).write_text("task: kb2\n" + nested + "\n")
    started = time.process_time()
    with pytest.raises(EvalSetError, match="nested more than 32 levels deep") as caught:
        evalsets.load_eval_set("kb2", root)
    assert time.process_time() - started < 1
    assert caught.value.file == task_path(root) and caught.value.line


def test_ordinary_nesting_braces_and_indented_prompts_pass(root):
    text = task_path(root).read_text()
    prompt = "".join(" " * (2 + i) + f"line {i} {{{{ question }}}} [{i}]\n" for i in range(60))
    task_path(root).write_text(
        text + "description: |\n" + prompt + "tag: [[a, [b, {c: [d]}]], e]\n"
    )
    eval_set = evalsets.load_eval_set("kb2", root)
    assert eval_set.task["description"].count("{{ question }}") == 60


@pytest.mark.parametrize(
    "body",
    ["".join(f"k{i}: [a, b]\n" for i in range(8000)), "a: " + "[" * 50_000 + "]" * 50_000],
    ids=["many-keys", "100KB-nested"],
)
def test_a_large_task_yaml_is_refused_before_parsing(root, body):
    task_path(root).write_text("task: kb2\n" + body)
    started = time.process_time()
    with pytest.raises(EvalSetError, match="at most 65536 allowed"):
        evalsets.load_eval_set("kb2", root)
    assert time.process_time() - started < 1


def test_includes_are_bounded_in_depth(root):
    text = task_path(root).read_text()
    task_path(root).write_text("include: base1.yaml\n" + "task: kb2\n")
    for level in range(1, 7):
        (root / "kb2" / f"base{level}.yaml").write_text(
            f"include: base{level + 1}.yaml\n" if level < 6 else text
        )
    with pytest.raises(EvalSetError, match="includes deep"):
        evalsets.load_eval_set("kb2", root)


def test_a_passing_set_is_not_checked_again_until_a_file_changes(root, monkeypatch):
    calls = []
    real = set_checks.validate
    monkeypatch.setattr(set_checks, "validate", lambda *a, **k: calls.append(a) or real(*a, **k))
    first = validate_cached("kb2", root)
    assert validate_cached("kb2", root) == first and len(calls) == 1
    # An item edited in place, same size and mtime: checked again, and the break found.
    data = root / "kb2" / "data.jsonl"
    before = os.stat(data)
    text = data.read_text()
    assert '"id": "' in text
    data.write_text(text.replace('"id": "', '"iX": "', 1))
    os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(data).st_size == before.st_size
    with pytest.raises(EvalSetError, match="'id'"):
        validate_cached("kb2", root)
    # Put back: the same bytes as the check that passed, so it is not run again.
    data.write_text(text)
    assert validate_cached("kb2", root) == first and len(calls) == 2


def test_defaults_and_calibration_are_part_of_the_check(root, tmp_path, monkeypatch):
    calls = []
    real = set_checks.validate
    monkeypatch.setattr(set_checks, "validate", lambda *a, **k: calls.append(a) or real(*a, **k))
    validate_cached("kb2", root)
    defaults = root / "defaults.yaml"
    defaults.write_text(defaults.read_text() + "\n# edited\n")
    validate_cached("kb2", root)
    assert len(calls) == 2
    # A calibration text that now appears in the items: the leak is found, not cached away.
    project = tmp_path / "project"
    (project / "calibration").mkdir(parents=True)
    item = (root / "kb2" / "data.jsonl").read_text().splitlines()[0]
    longest = max((v for v in json.loads(item).values() if isinstance(v, str)), key=len)
    assert len(longest) >= set_checks.LEAK_MIN_CHARS
    (project / "calibration" / "c.jsonl").write_text(json.dumps({"text": longest}) + "\n")
    monkeypatch.setattr(paths, "calibration_dir", lambda: project / "calibration")
    with pytest.raises(EvalSetError, match="also in the calibration set"):
        validate_cached("kb2", root)


@pytest.mark.parametrize(
    "forged",
    [
        {"/nonexistent": ""},  # only absent files: passed everything
        {"/dev/zero": "0" * 64},  # read whole: filled the memory
        {"{fifo}": "0" * 64},  # read: waited for a writer for ever
        "not a mapping",
    ],
)
def test_a_forged_check_record_is_checked_again_and_hangs_nothing(root, forged, monkeypatch):
    """eval-set-checks/<set>.json is a state file: a record naming files outside the eval
    sets' folder, or none of the set's own, is not taken as a pass (the check runs)."""
    calls = []
    real = set_checks.validate
    monkeypatch.setattr(set_checks, "validate", lambda *a, **k: calls.append(a) or real(*a, **k))
    first = validate_cached("kb2", root)
    store = paths.home() / "eval-set-checks" / "kb2.json"
    record = json.loads(store.read_text())
    fifo = root.parent / "fifo"
    os.mkfifo(fifo)
    if isinstance(forged, dict):
        forged = {k.format(fifo=fifo): v for k, v in forged.items()}
    record["reads"] = forged
    record["summary"] = {"items": 999}
    store.write_text(json.dumps(record))
    started = time.monotonic()
    summary = validate_cached("kb2", root)
    assert summary == first and len(calls) == 2  # checked again, not the forged pass
    assert time.monotonic() - started < 60
