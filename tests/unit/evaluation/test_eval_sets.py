"""Eval sets as data: every set in the repo validates; each kind of mistake gets its own error."""

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from llm_release import paths
from llm_release.cli import main as cli
from llm_release.errors import EvalError, ReleaseError
from llm_release.evaluation.authoring import describe, scaffold
from llm_release.evaluation.evalsets import available, load_eval_set
from llm_release.evaluation.evaluate import load_decoding, task_config
from llm_release.evaluation.items import load_items
from llm_release.evaluation.set_checks import validate
from llm_release.evaluation.set_files import EvalSetError


@pytest.mark.parametrize("name", available())
def test_every_eval_set_in_the_repo_validates(name):
    summary = validate(name)
    assert summary["items"] > 0
    config = task_config(load_eval_set(name), load_decoding())
    assert Path(config["dataset_kwargs"]["data_files"]["test"]).is_absolute()
    assert "gates" not in config and callable(config["process_results"])


def test_the_repo_has_both_business_sets():
    assert {"manufacturing_kb", "refusal_kb"} <= set(available())


def test_process_results_scores_with_the_registered_metrics():
    config = task_config(load_eval_set("manufacturing_kb"), load_decoding())
    doc = {"answer": "85 N·m", "passage": "Tighten to 85 N·m.", "passage_id": "KB-1"}
    assert config["process_results"](doc, ["It is 85 N·m [KB-1]."]) == {
        "numeric_match": 1.0,
        "numbers_with_units": 1.0,
        "cites_source": 1.0,
    }
    assert config["process_results"](doc, ["It is 80 N·m."])["numeric_match"] == 0.0


@pytest.fixture()
def root(tmp_path):
    root = tmp_path / "eval_sets"
    shutil.copytree(paths.eval_sets_dir(), root)
    scaffold("kb2", root, min_score=0.0)
    shutil.copy(root / "manufacturing_kb" / "data.jsonl", root / "kb2" / "data.jsonl")
    return root


def edit(path: Path, old: str, new: str) -> None:
    assert old in path.read_text(), old
    path.write_text(path.read_text().replace(old, new))


def rewrite_item(root: Path, line: int, **changes) -> None:
    data = root / "kb2" / "data.jsonl"
    rows = data.read_text().splitlines()
    item = json.loads(rows[line - 1])
    for key, value in changes.items():
        if value is None:
            item.pop(key, None)
        else:
            item[key] = value
    rows[line - 1] = json.dumps(item)
    data.write_text("\n".join(rows) + "\n")


def test_scaffolded_set_validates(root):
    assert validate("kb2", root, calibration=[])["items"] == 80


def test_validate_states_what_each_gate_can_resolve_and_warns_when_too_small(root):
    (gate,) = validate("kb2", root, calibration=[])["resolution"]
    assert (gate["items"], gate["margin"], gate["detectable_drop"]) == (80, 0.05, 0.05)
    assert gate["warning"] is None
    data = root / "kb2" / "data.jsonl"
    data.write_text("".join(data.read_text().splitlines(keepends=True)[:14]))
    (gate,) = validate("kb2", root, calibration=[])["resolution"]
    assert gate["items"] == 14 and abs(gate["detectable_drop"] - 4 / 14) < 1e-9
    assert "14 items cannot resolve a 0.050 margin" in gate["warning"]


def test_missing_field_points_at_the_data_line(root):
    rewrite_item(root, 7, passage_id=None)
    with pytest.raises(EvalSetError) as info:
        validate("kb2", root, calibration=[])
    assert info.value.line == 7 and info.value.field == "passage_id"
    assert "data.jsonl:7" in str(info.value)


def test_unknown_metric(root):
    edit(root / "kb2" / "task.yaml", "- metric: numeric_match", "- metric: bleu")
    with pytest.raises(EvalSetError, match="unknown metric 'bleu'") as info:
        load_eval_set("kb2", root)
    assert info.value.field == "metric_list.metric" and info.value.line is not None


def test_duplicate_id(root):
    rewrite_item(root, 5, id="mkb-001")
    with pytest.raises(EvalSetError, match="duplicate id 'mkb-001' .first on line 1") as info:
        validate("kb2", root, calibration=[])
    assert info.value.line == 5


def test_broken_template(root):
    edit(root / "kb2" / "task.yaml", "Question: {{question}}", "Question: {{question}")
    with pytest.raises(EvalSetError, match="broken template") as info:
        validate("kb2", root, calibration=[])
    assert info.value.field == "doc_to_text"


def test_leaked_calibration_item(root):
    calibration = [
        json.loads(line)["text"]
        for line in (paths.calibration_dir() / "manufacturing_maintenance.jsonl")
        .read_text()
        .splitlines()
    ]
    leaked = calibration[3].split(". ", 1)[1]
    rewrite_item(root, 2, passage=leaked)
    with pytest.raises(EvalSetError, match="calibration set") as info:
        validate("kb2", root)
    assert info.value.line == 2 and info.value.field == "passage"


def test_code_tags_and_unknown_keys_are_refused(root):
    task = root / "kb2" / "task.yaml"
    original = task.read_text()
    task.write_text(original + "process_results: !function utils.process\n")
    with pytest.raises(EvalSetError, match="!function"):
        load_eval_set("kb2", root)
    task.write_text(original + "filter_list: []\n")
    with pytest.raises(EvalSetError, match="not allowed") as info:
        load_eval_set("kb2", root)
    assert info.value.field == "filter_list" and info.value.line == len(original.splitlines()) + 1


def test_gate_naming_an_unscored_metric(root):
    edit(root / "kb2" / "task.yaml", "numeric_match: {min_score: 0.0,", "refusal: {min_score: 0.0,")
    with pytest.raises(EvalSetError, match="metric_list does not score"):
        load_eval_set("kb2", root)


def test_variant_includes_a_base_yaml(root):
    variant = root / "kb2_strict"
    variant.mkdir()
    shutil.copy(root / "kb2" / "README.md", variant / "README.md")
    shutil.copy(root / "kb2" / "data.jsonl", variant / "data.jsonl")
    (variant / "task.yaml").write_text(
        "include: ../kb2/task.yaml\ntask: kb2_strict\n"
        "gates:\n  critical: true\n  metrics:\n    numeric_match: {max_drop: 0.0, min_score: 0.5}\n"
    )
    eval_set = load_eval_set("kb2_strict", root)
    assert eval_set.task["doc_to_text"] == load_eval_set("kb2", root).task["doc_to_text"]
    assert eval_set.gates.critical and eval_set.gates.metrics["numeric_match"].max_drop == 0.0
    assert validate("kb2_strict", root, calibration=[])["items"] == 80


def test_project_defaults_fill_unset_gates(root):
    (root / "defaults.yaml").write_text("gates:\n  max_drop: 0.2\n  min_score: 0.1\n")
    edit(
        root / "kb2" / "task.yaml",
        "numeric_match: {min_score: 0.0, max_drop: 0.05}",
        "numeric_match: {}",
    )
    gate = load_eval_set("kb2", root).gates.metrics["numeric_match"]
    assert (gate.max_drop, gate.min_score) == (0.2, 0.1)


def test_missing_set_lists_available(root):
    with pytest.raises(EvalError) as info:
        load_eval_set("nope", root)
    assert "manufacturing_kb" in str(info.value)


def test_cli_new_validate_list(tmp_path, capsys):
    root = tmp_path / "sets"
    shutil.copytree(paths.eval_sets_dir(), root)
    assert cli(["eval-sets", "new", "line_speed", "--root", str(root), "--min-score", "0"]) == 0
    assert cli(["eval-sets", "validate", "line_speed", "--root", str(root)]) == 0
    assert cli(["eval-sets", "list", "--json", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    rows = {r["name"]: r for r in json.loads(out[out.index("\n[") + 1 :])}
    assert rows["line_speed"]["items"] == 1 and not rows["line_speed"]["critical"]
    (root / "line_speed" / "data.jsonl").write_text('{"id": "x"}\n')
    assert cli(["eval-sets", "validate", "line_speed", "--root", str(root)]) == 1
    assert "data.jsonl:1: field 'answer'" in capsys.readouterr().out


def test_every_critical_set_in_the_repo_declares_a_measured_floor():
    for name in available():
        eval_set = load_eval_set(name)
        if not eval_set.gates.critical:
            continue
        floors = {m: g.min_score for m, g in eval_set.gates.metrics.items()}
        assert all(f is not None and f > 0 for f in floors.values()), (name, floors)
        assert eval_set.readme.get("Floors"), f"{name}: README says how the floors were chosen"


def critical_kb2(root: Path, gate: str) -> None:
    edit(root / "kb2" / "task.yaml", "critical: false", "critical: true")
    edit(root / "kb2" / "task.yaml", "numeric_match: {min_score: 0.0, max_drop: 0.05}", gate)


@pytest.mark.parametrize(
    "gate, found",
    [
        ("numeric_match: {max_drop: 0.05}", "no min_score"),
        ("numeric_match: {min_score: 0.0, max_drop: 0.05}", "min_score 0"),
        ("numeric_match: {min_score: 0, max_drop: 0.05}", "min_score 0"),
    ],
)
def test_a_critical_set_without_a_floor_above_zero_is_refused_in_one_line(
    root, capsys, gate, found
):
    critical_kb2(root, gate)
    with pytest.raises(
        EvalSetError, match=f"a critical set needs a floor above 0 .{found}"
    ) as info:
        load_eval_set("kb2", root)
    assert info.value.field == "gates.metrics.numeric_match.min_score"
    assert info.value.line == 14  # the gates: key
    assert cli(["eval-sets", "validate", "kb2", "--root", str(root)]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("FAIL kb2: ") and "how to fix: set gates.metrics.numeric_match" in line


def test_the_project_defaults_no_longer_give_a_floor_of_zero(root):
    # defaults.yaml has no min_score: a critical set that declares none is refused, and a
    # floor of 0 put back into the defaults is refused the same way.
    assert load_eval_set("manufacturing_kb", root).gates.metrics["numeric_match"].min_score > 0
    critical_kb2(root, "numeric_match: {max_drop: 0.05}")
    with pytest.raises(EvalSetError, match="no min_score"):
        load_eval_set("kb2", root)
    defaults = root / "defaults.yaml"
    edit(defaults, "  max_drop: 0.05", "  min_score: 0.0\n  max_drop: 0.05")
    with pytest.raises(EvalSetError, match="min_score 0"):
        load_eval_set("kb2", root)
    # A floor above 0 is accepted; a non-critical set may keep 0 (reported, never blocking).
    defaults.write_text(defaults.read_text().replace("min_score: 0.0", "min_score: 0.2"))
    assert load_eval_set("kb2", root).gates.metrics["numeric_match"].min_score == 0.2


def test_a_critical_sets_readme_must_say_how_its_floors_were_chosen(root):
    critical_kb2(root, "numeric_match: {min_score: 0.5, max_drop: 0.05}")
    assert validate("kb2", root, calibration=[])["items"] == 80
    readme = root / "kb2" / "README.md"
    readme.write_text(
        "\n".join(line for line in readme.read_text().splitlines() if "**Floors:**" not in line)
    )
    with pytest.raises(EvalSetError, match="must say how each min_score was chosen") as info:
        validate("kb2", root, calibration=[])
    assert info.value.field == "Floors"


def test_cli_new_asks_for_the_floor(tmp_path, capsys, monkeypatch):
    root = tmp_path / "sets"
    shutil.copytree(paths.eval_sets_dir(), root)
    new = ["eval-sets", "new", "line_speed", "--root", str(root)]
    # Not on a terminal and no --min-score: refused in one line, nothing created.
    with pytest.raises(SystemExit, match="needs the set's floor: pass --min-score"):
        cli(new)
    assert not (root / "line_speed").exists()
    # A critical set with a floor of 0 is refused the same way.
    assert cli([*new, "--critical", "--min-score", "0"]) == 2
    assert "above 0 for a critical set" in capsys.readouterr().err
    assert not (root / "line_speed").exists()
    # On a terminal it asks.
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: "0.45" if "floor" in prompt else "")
    assert cli([*new, "--critical"]) == 0
    eval_set = load_eval_set("line_speed", root)
    assert eval_set.gates.critical
    assert eval_set.gates.metrics["numeric_match"].min_score == 0.45
    assert cli(["eval-sets", "validate", "line_speed", "--root", str(root)]) == 0


def test_describe_reports_owner_size_and_gates():
    rows = {r["name"]: r for r in describe()}
    kb = rows["manufacturing_kb"]
    assert kb["owner"] and kb["items"] == 80 and kb["critical"]
    assert kb["slice_gates"][0]["tag"] == "safety"


def test_prompt_text_from_every_shape_lm_eval_logs():
    from collections import namedtuple

    from llm_release.evaluation.evaluate import _prompt_text

    chat = '[{"role": "user", "content": "Passage [KB-1]: text"}]'
    json_chat = namedtuple("JsonChatStr", ["prompt"])(chat)
    for arguments in ([(json_chat, {})], [(chat, {})], [[repr((chat,))]]):
        assert _prompt_text({"arguments": arguments}) == "Passage [KB-1]: text"


# -- hostile and broken eval sets: each refused with file and line, none runs code ----------

INJECTIONS = [
    "{{ ''.__class__.__mro__ }}",
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{% for x in range(2) %}{{ x }}{% endfor %}",
    "{{ question | attr('__class__') }}",
]


@pytest.mark.parametrize("payload", INJECTIONS)
@pytest.mark.parametrize("field", ["doc_to_text", "doc_to_target", "description"])
def test_template_injection_in_every_rendered_field_is_refused(root, tmp_path, field, payload):
    marker = tmp_path / "pwned"
    task = root / "kb2" / "task.yaml"
    text = json.dumps(payload.replace("MARKER", str(marker)))
    if field == "description":
        task.write_text(task.read_text() + f"description: {text}\n")
        line = len(task.read_text().splitlines())
    else:
        lines = task.read_text().splitlines()
        line = next(i for i, row in enumerate(lines, 1) if row.startswith(field + ":"))
        lines[line - 1] = f"{field}: {text}"
        task.write_text("\n".join(lines) + "\n")
    with pytest.raises(EvalSetError) as info:
        validate("kb2", root, calibration=[])
    assert (info.value.file, info.value.line, info.value.field) == (task, line, field)
    assert f"task.yaml:{line}:" in str(info.value)
    assert not marker.exists()
    assert cli(["eval-sets", "validate", "kb2", "--root", str(root)]) == 1
    assert not marker.exists()


def test_template_line_inside_a_block_scalar(root):
    task = root / "kb2" / "task.yaml"
    edit(
        task,
        'doc_to_target: "{{answer}}"',
        "doc_to_target: |\n  {{answer}}\n  {{ answer.upper() }}",
    )
    with pytest.raises(EvalSetError) as info:
        load_eval_set("kb2", root)
    assert info.value.line == 11 and "calls" in info.value.message


def test_yaml_alias_bomb_is_refused_before_it_expands(root):
    task = root / "kb2" / "task.yaml"
    bomb = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    bomb += [
        f"{c}: &{c} [{', '.join(['*' + p] * 9)}]"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    ]
    original = task.read_text()
    task.write_text(original + "\n".join(bomb) + "\n")
    with pytest.raises(EvalSetError, match="alias") as info:
        load_eval_set("kb2", root)
    assert info.value.line == len(original.splitlines()) + 2


def test_duplicate_keys_are_refused_at_the_second(root):
    task = root / "kb2" / "task.yaml"
    original = task.read_text()
    task.write_text(original + 'doc_to_text: "{{question}}"\n')
    with pytest.raises(EvalSetError, match="duplicate key .first on line 8") as info:
        load_eval_set("kb2", root)
    assert info.value.line == len(original.splitlines()) + 1 and info.value.field == "doc_to_text"


@pytest.mark.parametrize("file", ["task.yaml", "data.jsonl", "README.md"])
def test_non_utf8_bytes_are_a_one_line_error_with_file_and_line(root, capsys, file):
    path = root / "kb2" / file
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2] + b" \xff\xfe"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(EvalSetError, match="not UTF-8") as info:
        validate("kb2", root, calibration=[])
    assert (info.value.file, info.value.line) == (path, 3)
    assert cli(["eval-sets", "validate", "kb2", "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert f"{path}:3:" in out and "Traceback" not in out


@pytest.mark.parametrize("name", ["../eval_sets/kb2", "..", "/etc", "kb2/../kb2", "KB2"])
def test_set_names_that_climb_out_are_refused(root, capsys, name):
    with pytest.raises(ReleaseError, match="not allowed"):
        load_eval_set(name, root)
    assert cli(["eval-sets", "validate", name, "--root", str(root)]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "not allowed" in out


def test_include_outside_the_eval_sets_folder_is_refused(root, tmp_path):
    (tmp_path / "outside.yaml").write_text("doc_to_text: '{{question}}'\n")
    task = root / "kb2" / "task.yaml"
    task.write_text("include: ../../outside.yaml\n" + task.read_text())
    with pytest.raises(EvalSetError, match="inside") as info:
        load_eval_set("kb2", root)
    assert info.value.line == 1 and info.value.field == "include"


def test_a_bad_set_does_not_hide_the_others_in_list(root, capsys):
    evil = root / "evil"
    shutil.copytree(root / "kb2", evil)
    edit(evil / "task.yaml", "task: kb2", "task: evil")
    edit(evil / "task.yaml", "Question: {{question}}", "{{ ''.__class__ }}")
    shutil.copytree(root / "kb2", root / "Bad.Name")
    assert cli(["eval-sets", "list", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"(?m)^evil +INVALID: .*evil/task\.yaml:8: field 'doc_to_text'", out)
    assert re.search(r"(?m)^Bad\.Name +INVALID: .*not allowed", out)
    for good in ("kb2", "manufacturing_kb", "refusal_kb"):
        assert re.search(rf"(?m)^{good} +v\d+ +\d+ items", out), good
    rows = {r["name"]: r for r in describe(root)}
    assert "error" in rows["evil"] and rows["manufacturing_kb"]["items"] == 80


def test_lm_eval_gets_only_checked_templates(root):
    eval_set = load_eval_set("kb2", root)
    eval_set.task["description"] = "{{ cycler.__init__ }}"
    with pytest.raises(EvalSetError, match="attribute access"):
        task_config(eval_set, load_decoding())


@pytest.mark.parametrize(
    "old, new, field",
    [
        ("dataset_path: json", "dataset_path: evil/remote-dataset", "dataset_path"),
        ("dataset_kwargs:\n", "dataset_kwargs:\n  trust_remote_code: true\n", "dataset_kwargs."),
    ],
)
def test_dataset_loading_is_local_json_only(root, old, new, field):
    edit(root / "kb2" / "task.yaml", old, new)
    with pytest.raises(EvalSetError) as info:
        load_eval_set("kb2", root)
    assert info.value.field.startswith(field) and info.value.line is not None


def test_one_deeply_nested_item_is_one_line_naming_its_set(root):
    """50,000 '[' in one item was a RecursionError that broke 'eval-sets list' for every
    set (issue 36, low); now it is that set's error, naming the file and line."""
    data = root / "kb2" / "data.jsonl"
    deep = '{"id": "deep", "answer": "x", "extra": ' + "[" * 50_000 + "]" * 50_000 + "}"
    data.write_text(data.read_text() + deep + "\n")
    lines = len(data.read_text().splitlines())
    with pytest.raises(EvalSetError, match=f"data.jsonl:{lines}: nested deeper than 32"):
        load_items(load_eval_set("kb2", root))
    # the brackets of a string are text, not nesting
    data.write_text('{"id": "s", "answer": "' + "[" * 100 + '"}\n')
    assert [i["id"] for i in load_items(load_eval_set("kb2", root))] == ["s"]


def test_an_oversized_item_or_data_file_is_refused(root, monkeypatch):
    from llm_release.evaluation import items

    data = root / "kb2" / "data.jsonl"
    data.write_text('{"id": "big", "answer": "' + "x" * (items.MAX_ITEM_CHARS + 1) + '"}\n')
    with pytest.raises(EvalSetError, match="data.jsonl:1: an item of"):
        load_items(load_eval_set("kb2", root))
    monkeypatch.setattr(items, "MAX_DATA_BYTES", 100)
    data.write_text('{"id": "a", "answer": "' + "x" * 200 + '"}\n')
    with pytest.raises(EvalSetError, match="bytes; at most 100 allowed"):
        load_items(load_eval_set("kb2", root))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("max_gen_toks: 1000000000", "max_gen_toks"),
        ("temperature: 50", "temperature"),
        ("until: [" + ", ".join(['"s"'] * 100) + "]", "until"),
        ("top_p: 0", "top_p"),
        ("secret_hook: 1", "secret_hook"),
        ("until: " + "[" * 200 + "]" * 200, "nest"),
    ],
)
def test_decoding_values_are_bounded(tmp_path, edit, message):
    path = tmp_path / "decoding.yaml"
    base = {
        "version": "version: 1",
        "temperature": "temperature: 0.0",
        "top_p": "top_p: 1.0",
        "max_gen_toks": "max_gen_toks: 48",
        "until": 'until: ["\\n\\n"]',
    }
    key = edit.split(":")[0]
    base[key] = edit
    path.write_text("\n".join(base.values()) + "\n")
    with pytest.raises(EvalError, match=message):
        load_decoding(path)


def test_an_oversized_decoding_file_is_refused(tmp_path):
    path = tmp_path / "decoding.yaml"
    path.write_text("version: 1\n" + "# padding\n" * 5000)
    with pytest.raises(EvalError, match="bytes; at most"):
        load_decoding(path)


def test_the_repos_decoding_passes_and_is_returned_as_written():
    decoding = load_decoding()
    assert decoding == yaml.safe_load((paths.eval_sets_dir() / "decoding.yaml").read_text())
