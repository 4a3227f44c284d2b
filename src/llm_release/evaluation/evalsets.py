"""Eval sets that data scientists own: one folder each under ``eval_sets/``.

A folder holds ``README.md`` (purpose, owner, criticality, how the data was made),
``task.yaml`` (a versioned lm-evaluation-harness task, optionally ``include:``-ing a base
YAML, plus its ``gates``) and the items as JSONL. Everything here is data: metric names
resolve to functions in :mod:`llm_release.evaluation.metrics`, and no code is imported from a folder.
Every error names the file, the line and the field.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llm_release import paths, safety
from llm_release.errors import EvalError, ReleaseError
from llm_release.evaluation import metrics, templates
from llm_release.fileio import atomic_write_json, sha256_file
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


class EvalSetError(EvalError):
    """A problem in an eval set, located at a file, a line and a field."""

    def __init__(
        self,
        file: Path,
        line: int | None,
        field_name: str | None,
        message: str,
        *,
        hint: str | None = None,
    ) -> None:
        self.file, self.line, self.field = Path(file), line, field_name
        where = f"{file}:{line}" if line else str(file)
        what = f" field '{field_name}':" if field_name else ""
        super().__init__(f"{where}:{what} {message}", hint=hint)


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
        _record(path, None)
        return Defaults()
    data = _read_yaml(path)
    try:
        return Defaults.model_validate(
            data.get("gates", {}) | {k: v for k, v in data.items() if k == "bootstrap_iters"}
        )
    except ValidationError as exc:
        raise EvalSetError(path, None, "gates", _pydantic_message(exc)) from None


def _pydantic_message(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())


# A task.yaml is a kilobyte or two; PyYAML reads about 30 KB a second of CPU in the worst
# legitimate shapes (many short keys or flow lists), so 64 KiB bounds a file to ~2 s.
MAX_YAML_BYTES = 64 * 1024
MAX_INCLUDE_DEPTH = 4


# While validate_cached runs: every file an eval set's check read, with its SHA-256 ("" for
# one that was looked for and absent), so the check is redone only when one of them changes.
_READS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "eval_set_reads", default=None
)


def _record(path: Path, data: bytes | None) -> None:
    reads = _READS.get()
    if reads is not None:
        reads[str(Path(path).absolute())] = "" if data is None else hashlib.sha256(data).hexdigest()


def _read_text(path: Path, limit: int | None = None) -> str:
    """A data file as UTF-8 text; bad bytes are an error naming the file and line."""
    data = path.read_bytes()
    _record(path, data)
    if limit is not None and len(data) > limit:
        raise EvalSetError(path, None, None, f"is {len(data)} bytes; at most {limit} allowed")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise EvalSetError(
            path, line, None, f"not UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
        ) from None


MAX_NESTING = 32
_BLOCK_SCALAR = re.compile(r"(?:^|[\s:-])[|>][-+0-9]*[ \t]*(?:#.*)?$")
_INDICATORS = re.compile(r"(?:[-?:](?:[ \t]+|$))+")


def check_nesting(path: Path, text: str) -> None:
    """Nesting bounded on the raw text, before any YAML parser sees it: PyYAML's scanner
    slows down with the square of the flow depth ('[[[[…' of 100 KB took 83 s of CPU) and
    its composer recurses once per level. Counted conservatively: every '[' or '{' opens a
    flow level wherever it stands (in quotes and block text too; a template's balanced
    '{{ field }}' closes what it opens), every ']' or '}' closes one; a block level is an
    indentation step or a '- ' / '? ' / ': ' indicator at the start of a line. The text of
    a '|' or '>' block scalar adds no block level (a prompt may be indented freely)."""
    flow = 0
    indents: list[int] = []
    scalar_indent: int | None = None  # the indent of the line that opened a block scalar
    for number, line in enumerate(text.splitlines(), 1):
        body = line.lstrip(" \t")
        indent = len(line) - len(body)
        if scalar_indent is not None and (not body or indent > scalar_indent):
            depth = len(indents)
        else:
            scalar_indent = None
            if not body or body.startswith("#"):
                depth = len(indents)
            else:
                while indents and indents[-1] >= indent:
                    indents.pop()
                indents.append(indent)
                marks = _INDICATORS.match(body)
                depth = len(indents) + (len(re.findall("[-?:]", marks[0])) if marks else 0)
                if _BLOCK_SCALAR.search(line):
                    scalar_indent = indent
        for char in line:
            if char in "[{":
                flow += 1
                if flow > MAX_NESTING:
                    break
            elif char in "]}" and flow:
                flow -= 1
        if depth + flow > MAX_NESTING:
            raise EvalSetError(
                path,
                number,
                None,
                f"nested more than {MAX_NESTING} levels deep ('[', '{{', indentation and "
                "'- ' count as levels)",
                hint="an eval set's task.yaml is a few levels deep; flatten it",
            )


def _check_yaml_structure(path: Path, text: str) -> None:
    """No aliases (an alias bomb expands a few lines into gigabytes) and no duplicate keys
    (YAML keeps the last silently, so a reviewer reads a different task than lm-eval)."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise EvalSetError(
                path,
                event.start_mark.line + 1,
                None,
                f"YAML alias *{event.anchor} is not allowed",
                hint="write the value out; anchors and aliases are refused in eval sets",
            )
    stack = [yaml.compose(text, Loader=yaml.SafeLoader)]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                name = str(key.value)
                if name in seen:
                    raise EvalSetError(
                        path,
                        key.start_mark.line + 1,
                        name,
                        f"duplicate key (first on line {seen[name]})",
                    )
                seen[name] = key.start_mark.line + 1
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def _read_yaml(path: Path) -> dict:
    text = _read_text(path, MAX_YAML_BYTES)
    check_nesting(path, text)
    try:
        _check_yaml_structure(path, text)
        data = yaml.safe_load(text)
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise EvalSetError(
            path,
            line,
            None,
            f"{exc.problem} (code tags such as !function "
            "are not allowed; use a metric registered in llm_release.evaluation.metrics)",
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise EvalSetError(
            path,
            mark.line + 1 if mark else None,
            None,
            f"not valid YAML: {getattr(exc, 'problem', exc)}",
        ) from None
    except RecursionError:
        raise EvalSetError(path, None, None, "nested too deeply") from None
    if not isinstance(data, dict):
        raise EvalSetError(path, 1, None, "expected a mapping at the top level")
    return data


@dataclass(frozen=True)
class Origin:
    """Where a top-level key of a task was written: file, key line, value line and style."""

    file: Path
    line: int
    value_line: int
    block: bool  # a '|' or '>' scalar: its text starts on the line after value_line

    def template_line(self, line_in_template: int) -> int:
        if self.block:
            return self.value_line + line_in_template
        return self.line


def _origins(path: Path) -> dict[str, Origin]:
    try:
        node = yaml.compose(_read_text(path, MAX_YAML_BYTES), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {
        str(k.value): Origin(
            path,
            k.start_mark.line + 1,
            v.start_mark.line + 1,
            getattr(v, "style", None) in ("|", ">"),
        )
        for k, v in node.value
    }


def _load_task(
    path: Path, root: Path, seen: tuple[Path, ...] = ()
) -> tuple[dict, dict[str, int], dict[str, Origin]]:
    data = _read_yaml(path)
    origins = _origins(path)
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
    for line in _read_text(path).splitlines():
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


# data.jsonl bounds: a business set is thousands of items of a few KB; one item is a prompt's
# passage and its answer.
MAX_DATA_BYTES = 64 * 1024 * 1024
MAX_ITEM_CHARS = 1024 * 1024


def _json_depth(line: str) -> int:
    """The deepest nesting of '[' / '{' in a JSON line, strings skipped (no parser)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in line:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def load_items(eval_set: EvalSet) -> list[dict]:
    """The items, each checked for an id, a reference answer and well-formed tags."""
    items, seen = [], {}
    text = _read_text(eval_set.data_path, MAX_DATA_BYTES)
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(line) > MAX_ITEM_CHARS:
            raise EvalSetError(
                eval_set.data_path,
                lineno,
                None,
                f"an item of {len(line)} characters; at most {MAX_ITEM_CHARS}",
            )
        if _json_depth(line) > MAX_NESTING:
            # json.loads recurses once a level: 50,000 '[' is a RecursionError, which took
            # 'eval-sets list' down for every set
            raise EvalSetError(
                eval_set.data_path, lineno, None, f"nested deeper than {MAX_NESTING} levels"
            )
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalSetError(
                eval_set.data_path, lineno, None, f"not valid JSON: {exc.msg}"
            ) from None
        if not isinstance(item, dict):
            raise EvalSetError(eval_set.data_path, lineno, None, "each line must be an object")
        for required in ("id", "answer"):
            if item.get(required) in (None, ""):
                raise EvalSetError(eval_set.data_path, lineno, required, "is missing")
        item_id = str(item["id"])
        if item_id in seen:
            raise EvalSetError(
                eval_set.data_path,
                lineno,
                "id",
                f"duplicate id {item_id!r} (first on line {seen[item_id]})",
            )
        seen[item_id] = lineno
        tags = item.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise EvalSetError(eval_set.data_path, lineno, "tags", "must be a list of strings")
        item["_line"] = lineno
        items.append(item)
    if not items:
        raise EvalSetError(eval_set.data_path, None, None, "has no items")
    return items


def render(template: str, item: dict, eval_set: EvalSet, template_field: str) -> str:
    """Render one item's prompt in the sandbox; the template already passed the check."""
    try:
        return templates.render(template, item)
    except jinja2.UndefinedError as exc:
        missing = re.search(r"'(\w+)' is undefined", str(exc))
        raise EvalSetError(
            eval_set.data_path,
            item.get("_line"),
            missing.group(1) if missing else None,
            f"missing, but {template_field} uses it",
        ) from None
    except jinja2.TemplateError as exc:  # the sandbox's SecurityError is one
        raise EvalSetError(
            eval_set.directory / "task.yaml",
            eval_set.key_lines.get(template_field),
            template_field,
            f"broken template: {exc}",
        ) from None


def _normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


def calibration_texts() -> list[str]:
    texts = []
    for path in sorted(paths.calibration_dir().glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                texts.append(_normalise(json.loads(line).get("text", "")))
    return texts


LEAK_MIN_CHARS = 40


def validate(name: str, root: Path | None = None, calibration: list[str] | None = None) -> dict:
    """Everything ``eval-sets validate`` checks; returns a summary, raises on the first error."""
    eval_set = load_eval_set(name, root)
    if eval_set.gates.critical and not eval_set.readme.get("Floors"):
        raise EvalSetError(
            eval_set.directory / "README.md",
            None,
            "Floors",
            "a critical set's README must say how each min_score was chosen",
            hint="add '- **Floors:** text' naming the measured scores (see eval_sets/_template)",
        )
    items = load_items(eval_set)
    needed = {f for m in eval_set.metric_names for f in metrics.get(m).needs}
    calibration = calibration_texts() if calibration is None else calibration
    for item in items:
        for template_field in templates.TEMPLATE_FIELDS:
            if isinstance(eval_set.task.get(template_field), str):
                render(eval_set.task[template_field], item, eval_set, template_field)
        for field_name in sorted(needed):
            if item.get(field_name) in (None, ""):
                metric = next(
                    m for m in eval_set.metric_names if field_name in metrics.get(m).needs
                )
                raise EvalSetError(
                    eval_set.data_path,
                    item["_line"],
                    field_name,
                    f"missing, but metric {metric!r} needs it",
                )
        for field_name, value in item.items():
            if not isinstance(value, str) or len(value) < LEAK_MIN_CHARS:
                continue
            text = _normalise(value)
            if any(text in cal or cal in text for cal in calibration if cal):
                raise EvalSetError(
                    eval_set.data_path,
                    item["_line"],
                    field_name,
                    "this text is also in the calibration set: quantized candidates were "
                    "tuned on it, which would flatter them",
                    hint="replace the item, or remove the text from calibration/",
                )
    tags = sorted({t for item in items for t in item.get("tags", [])})
    for gate in eval_set.gates.slices:
        if gate.tag not in tags:
            raise EvalSetError(
                eval_set.directory / "task.yaml",
                eval_set.key_lines.get("gates"),
                "gates.slices.tag",
                f"no item carries tag {gate.tag!r}",
            )
    return {
        "name": name,
        "items": len(items),
        "tags": tags,
        "metrics": eval_set.metric_names,
        "critical": eval_set.gates.critical,
        "resolution": resolution(eval_set, items),
    }


def validate_cached(name: str, root: Path | None = None) -> dict:
    """:func:`validate`, remembered: a set that passed is not checked again while every
    file its check read (task YAMLs, includes, README, items, defaults), the calibration
    texts and this checking code are byte for byte the same (compared by SHA-256, so a
    file edited in place with its size and mtime kept is checked again). Kept per set
    under the project home; only a passing check is kept."""
    safety.set_name(name, "eval set")
    root = root or paths.eval_sets_dir()
    store = paths.home() / "eval-set-checks" / f"{name}.json"
    context = {"root": str(root.absolute()), "code": _checker_fingerprint()}
    try:
        record = json.loads(store.read_text())
        if record["context"] == context and _unchanged(record["reads"]):
            return record["summary"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    token = _READS.set({})
    try:
        summary = validate(name, root)
        reads = dict(_READS.get() or {})
    finally:
        _READS.reset(token)
    atomic_write_json(store, {"context": context, "reads": reads, "summary": summary})
    return summary


def _checker_fingerprint() -> str:
    """The checking code and the calibration texts a leak is looked for in."""
    digest = hashlib.sha256(f"{yaml.__version__} {jinja2.__version__}".encode())
    from llm_release.evaluation import stats

    for module in (metrics, templates, safety, stats):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(Path(__file__).read_bytes())
    for path in sorted(paths.calibration_dir().glob("*.jsonl")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _unchanged(reads: dict[str, str]) -> bool:
    if not reads:
        return False
    for name, digest in reads.items():
        try:
            data = Path(name).read_bytes()
        except FileNotFoundError:
            if digest:
                return False
            continue
        if not digest or hashlib.sha256(data).hexdigest() != digest:
            return False
    return True


def resolution(eval_set: EvalSet, items: list[dict]) -> list[dict]:
    """For each drop gate: its margin, the items it is judged on, the smallest drop those
    items can tell from none at the set's confidence, and a warning when the margin is
    below it (a drop within the margin then comes out inconclusive)."""
    from llm_release.evaluation.stats import detectable_drop

    spec = eval_set.gates
    gates = [(f"{m}", g.max_drop, len(items)) for m, g in spec.metrics.items()]
    gates += [
        (f"[{s.tag}] {s.metric}", s.max_drop, sum(s.tag in i.get("tags", []) for i in items))
        for s in spec.slices
    ]
    out = []
    for gate, margin, n in gates:
        if margin is None:
            continue
        smallest = detectable_drop(n, confidence=spec.confidence) if n else None
        warning = None
        if margin == 0:
            note = "zero margin: fails on any item that goes from right to wrong"
        elif smallest is None or smallest > margin + 1e-12:
            warning = (
                f"{n} items cannot resolve a {margin:.3f} margin (smallest drop they resolve: "
                f"{smallest or 1:.3f}); grow the set or widen the margin"
            )
            note = warning
        else:
            note = f"resolves drops from {smallest:.3f}"
        out.append(
            {
                "gate": gate,
                "margin": margin,
                "items": n,
                "detectable_drop": smallest,
                "warning": warning,
                "note": note,
            }
        )
    return out


MAX_NEW_NAME = 64  # a folder name and an lm-eval task name; under safety.set_name's 100


def check_new_name(name: str) -> None:
    """A new set's name: ``[a-z][a-z0-9_]*``, at most MAX_NEW_NAME characters; EvalError in
    one line naming the rule and the bound (the name shown escaped and cut)."""
    rule = f"use lower-case letters, digits and '_', at most {MAX_NEW_NAME} characters"
    shown = ascii(name[:60]) + ("..." if len(name) > 60 else "")
    if len(name) > MAX_NEW_NAME:
        raise EvalError(f"eval set name {shown} is {len(name):,} characters long: {rule}")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise EvalError(f"eval set name {shown}: {rule}")


def scaffold(
    name: str, root: Path | None = None, *, min_score: float, critical: bool = False
) -> Path:
    """A new set from the template, with its floor (``min_score`` of every metric gate)
    and criticality written into task.yaml; a critical set's floor must be above 0."""
    root = root or paths.eval_sets_dir()
    check_new_name(name)
    if not 0 <= min_score <= 1 or (critical and min_score <= 0):
        raise EvalError(
            f"floor {min_score}: a score floor is between 0 and 1"
            + (", and above 0 for a critical set" if critical else ""),
            hint=FLOOR_HINT.replace("gates.metrics.METRIC.min_score in task.yaml", "--min-score"),
        )
    target = root / name
    if target.exists():
        raise EvalError(f"{target} already exists")
    shutil.copytree(root / TEMPLATE, target)
    task = target / "task.yaml"
    text = re.sub(r"(?m)^task: .*$", f"task: {name}", task.read_text())
    text = re.sub(r"(?m)^(  critical:) \w+", rf"\1 {str(critical).lower()}", text)
    text = re.sub(r"min_score: [0-9.]+", f"min_score: {min_score}", text)
    task.write_text(text)
    return target


def describe(root: Path | None = None) -> list[dict]:
    rows = []
    for name in available(root):
        try:
            eval_set = load_eval_set(name, root)
            items = load_items(eval_set)
        except ReleaseError as exc:
            # One bad set is listed as invalid with its error; it hides no other set.
            rows.append({"name": name, "error": " ".join(exc.message.split())})
            continue
        rows.append(
            {
                "name": name,
                "owner": eval_set.readme.get("Owner"),
                "criticality": eval_set.readme.get("Criticality"),
                "items": len(items),
                "version": eval_set.task.get("metadata", {}).get("version"),
                "metrics": eval_set.metric_names,
                "gates": {m: g.model_dump() for m, g in eval_set.gates.metrics.items()},
                "slice_gates": [s.model_dump() for s in eval_set.gates.slices],
                "critical": eval_set.gates.critical,
            }
        )
    return rows
