"""Eval sets that data scientists own: one folder each under ``eval_sets/``.

A folder holds ``README.md`` (purpose, owner, criticality, how the data was made),
``task.yaml`` (a versioned lm-evaluation-harness task, optionally ``include:``-ing a base
YAML, plus its ``gates``) and the items as JSONL. Everything here is data: metric names
resolve to functions in :mod:`llm_release.evaluation.metrics`, and no code is imported from a folder.
Every error names the file, the line and the field. Here a set is loaded and its gates
filled in; its files are read by :mod:`set_files`, its items by :mod:`items`, checked by
:mod:`set_checks`, made and listed by :mod:`authoring`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_release import paths, safety
from llm_release.errors import EvalError
from llm_release.evaluation import metrics, templates
from llm_release.evaluation.set_files import (
    EvalSetError,
    Origin,
    key_origins,
    read_text,
    read_yaml,
    record_read,
)
from llm_release.fileio import sha256_file
from llm_release.results import GateSpec, InconclusivePolicy, MetricGate

TEMPLATE = "_template"
README_FIELDS = ("Purpose", "Owner", "Criticality")
# lm-eval keys an eval set may use; anything else (process_results, filters, !function…)
# is refused, and with it every way of running code from a data folder.
LM_EVAL_KEYS = {
    "task",
    "tag",
    "dataset_path",
    "dataset_kwargs",
    "test_split",
    "output_type",
    "doc_to_text",
    "doc_to_target",
    "metric_list",
    "metadata",
    "description",
}
OUR_KEYS = {"include", "gates"}


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Defaults(StrictModel):
    critical: bool = True
    confidence: float = Field(0.95, gt=0.5, lt=1)
    on_inconclusive: InconclusivePolicy = "review"
    # No project-wide floor by default: each critical set declares its own, measured
    # (a default of 0 is a floor that cannot fail).
    min_score: float | None = Field(None, ge=0, le=1)
    max_drop: float = Field(0.05, ge=0, le=1)
    bootstrap_iters: int = Field(2000, ge=100)


@dataclass
class EvalSet:
    name: str
    directory: Path
    task: dict
    data_path: Path
    metric_names: list[str]
    gates: GateSpec
    readme: dict[str, str]
    key_lines: dict[str, int] = field(default_factory=dict)


def files_sha256(eval_set: EvalSet) -> dict[str, str]:
    """The SHA-256 of each file that defines the set's items and prompts (YAML, JSONL)."""
    files = sorted(p for p in eval_set.directory.glob("*") if p.suffix in {".yaml", ".jsonl"})
    return {p.name: sha256_file(p) for p in files}


def fingerprint(eval_set: EvalSet) -> str:
    """One SHA-256 for the set as it was evaluated: its version and its files' hashes. Two
    results with the same fingerprint asked the same questions the same way."""
    version = (eval_set.task.get("metadata") or {}).get("version")
    canonical = json.dumps({"version": version, "files": files_sha256(eval_set)}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def defaults(root: Path | None = None) -> Defaults:
    path = (root or paths.eval_sets_dir()) / "defaults.yaml"
    if not path.exists():
        record_read(path, None)
        return Defaults()
    data = read_yaml(path)
    try:
        return Defaults.model_validate(
            data.get("gates", {}) | {k: v for k, v in data.items() if k == "bootstrap_iters"}
        )
    except ValidationError as exc:
        raise EvalSetError(path, None, "gates", _pydantic_message(exc)) from None


def _pydantic_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


MAX_INCLUDE_DEPTH = 4


def _load_task(
    path: Path, root: Path, seen: tuple[Path, ...] = ()
) -> tuple[dict, dict[str, int], dict[str, Origin]]:
    data = read_yaml(path)
    origins = key_origins(path)
    lines = {k: o.line for k, o in origins.items()}
    include = data.pop("include", None)
    if include is None:
        return data, lines, origins
    if not isinstance(include, str):
        raise EvalSetError(path, lines.get("include"), "include", "must be a relative path")
    base_path = (path.parent / str(include)).resolve()
    if root.resolve() not in base_path.parents or not base_path.exists():
        raise EvalSetError(
            path,
            lines.get("include"),
            "include",
            f"{include!r} must name an existing YAML inside {root}",
        )
    if base_path in seen:
        raise EvalSetError(path, lines.get("include"), "include", "include cycle")
    if len(seen) >= MAX_INCLUDE_DEPTH:
        raise EvalSetError(
            path,
            lines.get("include"),
            "include",
            f"more than {MAX_INCLUDE_DEPTH} includes deep; include a base YAML directly",
        )
    base, _, base_origins = _load_task(base_path, root, (*seen, path))
    return base | data, lines, base_origins | origins


def parse_readme(path: Path) -> dict[str, str]:
    if not path.exists():
        raise EvalSetError(
            path,
            None,
            None,
            "README.md is missing",
            hint=f"copy eval_sets/{TEMPLATE}/README.md and fill it in",
        )
    found = {}
    for line in read_text(path).splitlines():
        match = re.match(r"\s*[-*]\s*\*\*(\w+):\*\*\s*(.*)", line)
        if match:
            found[match.group(1)] = match.group(2).strip()
    missing = [f for f in README_FIELDS if not found.get(f)]
    if missing:
        raise EvalSetError(
            path, None, missing[0], f"README must state {', '.join(missing)} as '- **Field:** text'"
        )
    return found


def load_eval_set(name: str, root: Path | None = None) -> EvalSet:
    root = root or paths.eval_sets_dir()
    safety.set_name(name, "eval set")  # a name, never a path out of eval_sets/
    directory = root / name
    task_path = directory / "task.yaml"
    if not task_path.exists():
        raise EvalError(
            f"eval set {name!r} not found ({task_path} does not exist)",
            hint=f"available eval sets: {', '.join(available(root)) or 'none'}; "
            f"create one with 'llm-release eval-sets new {name}'",
        )
    task, lines, origins = _load_task(task_path, root)
    unknown = sorted(set(task) - LM_EVAL_KEYS - OUR_KEYS)
    if unknown:
        raise EvalSetError(
            task_path,
            lines.get(unknown[0]),
            unknown[0],
            "key not allowed in an eval set",
            hint=f"allowed keys: {', '.join(sorted(LM_EVAL_KEYS | OUR_KEYS))}",
        )
    if task.get("task") != name:
        raise EvalSetError(
            task_path,
            lines.get("task"),
            "task",
            f"must equal the folder name {name!r} (found {task.get('task')!r})",
        )
    for required in ("doc_to_text", "doc_to_target", "metric_list"):
        if not task.get(required):
            raise EvalSetError(task_path, None, required, "is required")
    check_templates(task, task_path, origins)
    metadata = task.get("metadata")
    version = metadata.get("version") if isinstance(metadata, dict) else None
    if version is None:
        raise EvalSetError(
            task_path,
            lines.get("metadata"),
            "metadata.version",
            "is required: bump it whenever items, prompt or scoring change",
        )
    split = task.get("test_split", "test")
    # lm-eval hands these to datasets.load_dataset: only the local JSON loader and its data
    # files, never a hub dataset, a loading script or trust_remote_code.
    if task.get("dataset_path", "json") != "json":
        raise EvalSetError(
            task_path, lines.get("dataset_path"), "dataset_path", "must be 'json' (local items)"
        )
    extra = sorted(set(task.get("dataset_kwargs") or {}) - {"data_files"})
    if extra:
        raise EvalSetError(
            task_path,
            lines.get("dataset_kwargs"),
            f"dataset_kwargs.{extra[0]}",
            "not allowed; dataset_kwargs may only name data_files",
        )
    kwargs = task.get("dataset_kwargs")
    files = kwargs.get("data_files") if isinstance(kwargs, dict) else None
    relative = files.get(split) if isinstance(files, dict) else None
    if not relative or not isinstance(relative, str):
        raise EvalSetError(
            task_path,
            lines.get("dataset_kwargs"),
            f"dataset_kwargs.data_files.{split}",
            "is required",
        )
    data_path = (directory / relative).resolve()
    if directory.resolve() not in data_path.parents or not data_path.exists():
        raise EvalSetError(
            task_path,
            lines.get("dataset_kwargs"),
            f"dataset_kwargs.data_files.{split}",
            f"data file {relative!r} must exist inside {directory}",
        )
    metric_names = []
    for entry in task["metric_list"]:
        metric_name = entry.get("metric") if isinstance(entry, dict) else None
        try:
            metrics.get(metric_name)
        except KeyError as exc:
            raise EvalSetError(
                task_path, lines.get("metric_list"), "metric_list.metric", exc.args[0]
            ) from None
        metric_names.append(metric_name)
    gates = _gate_spec(
        task.get("gates") or {}, metric_names, defaults(root), task_path, lines.get("gates")
    )
    readme = parse_readme(directory / "README.md")
    return EvalSet(name, directory, task, data_path, metric_names, gates, readme, lines)


def check_templates(task: dict, task_path: Path, origins: dict[str, Origin] | None = None) -> None:
    """Every rendered field is plain text, data fields and allowed filters (see templates)."""
    origins = origins or {}
    for field_name in templates.TEMPLATE_FIELDS:
        if field_name not in task:
            continue
        value = task[field_name]
        origin = origins.get(field_name)
        file = origin.file if origin else task_path
        if isinstance(value, int) and not isinstance(value, bool) and field_name == "doc_to_target":
            continue  # an index into the choices, not a template
        if not isinstance(value, str):
            raise EvalSetError(
                file, origin.line if origin else None, field_name, "must be a text template"
            )
        problem = templates.check(value)
        if problem:
            raise EvalSetError(
                file,
                origin.template_line(problem.line) if origin else None,
                field_name,
                problem.message,
                hint="templates may only use {{ field }} and the filters "
                f"{', '.join(sorted(templates.ALLOWED_FILTERS))}",
            )


def _gate_spec(
    raw: dict, metric_names: list[str], project: Defaults, path: Path, line: int | None
) -> GateSpec:
    try:
        spec = GateSpec.model_validate(
            {
                "critical": project.critical,
                "confidence": project.confidence,
                "on_inconclusive": project.on_inconclusive,
            }
            | raw
        )
    except ValidationError as exc:
        raise EvalSetError(path, line, "gates", _pydantic_message(exc)) from None
    for name in list(spec.metrics) + [s.metric for s in spec.slices]:
        if name not in metric_names:
            raise EvalSetError(
                path, line, "gates", f"gate names metric {name!r}, which metric_list does not score"
            )
    filled = {}
    for name in metric_names:
        gate = spec.metrics.get(name, MetricGate())
        filled[name] = MetricGate(
            min_score=project.min_score if gate.min_score is None else gate.min_score,
            max_drop=project.max_drop if gate.max_drop is None else gate.max_drop,
        )
    slices = [
        s.model_copy(
            update={
                "min_score": project.min_score if s.min_score is None else s.min_score,
                "max_drop": project.max_drop if s.max_drop is None else s.max_drop,
            }
        )
        for s in spec.slices
    ]
    if spec.critical:
        _require_floors(filled, path, line)
    return spec.model_copy(update={"metrics": filled, "slices": slices})


FLOOR_HINT = (
    "set gates.metrics.METRIC.min_score in task.yaml from a measured score (the reference "
    "model's lower confidence bound minus the margin; docs/decisions.md: 'How a release is decided'), "
    "or make the set non-critical"
)


def _require_floors(filled: dict[str, MetricGate], path: Path, line: int | None) -> None:
    """A critical set's every metric has a floor above 0: a floor of 0 cannot fail, so a
    first release (nothing to compare with) would pass a model that scores nothing."""
    for name, gate in filled.items():
        if gate.min_score is None or gate.min_score <= 0:
            found = "no min_score" if gate.min_score is None else "min_score 0"
            raise EvalSetError(
                path,
                line,
                f"gates.metrics.{name}.min_score",
                f"a critical set needs a floor above 0 ({found}: a score of 0 would pass)",
                hint=FLOOR_HINT.replace("METRIC", name),
            )


def available(root: Path | None = None) -> list[str]:
    root = root or paths.eval_sets_dir()
    if not root.exists():
        return []
    return sorted(
        p.name for p in root.iterdir() if (p / "task.yaml").exists() and not p.name.startswith("_")
    )
