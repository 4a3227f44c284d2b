"""``eval-sets validate``: everything checked of a set before a release trusts it (items,
templates, the metrics' fields, leaks from the calibration texts, slice tags, what its gates
can resolve), and the check remembered while nothing it read has changed."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

import jinja2
import yaml

from llm_release import paths, safety
from llm_release.evaluation import metrics, templates
from llm_release.evaluation.evalsets import EvalSet, load_eval_set
from llm_release.evaluation.items import MAX_DATA_BYTES, load_items, render
from llm_release.evaluation.set_files import EvalSetError, recording_reads
from llm_release.fileio import atomic_write_json


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
        if record["context"] == context and _unchanged(record["reads"], root, name):
            return record["summary"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    with recording_reads() as reads:
        summary = validate(name, root)
    atomic_write_json(store, {"context": context, "reads": reads, "summary": summary})
    return summary


def _checker_fingerprint() -> str:
    """The checking code and the calibration texts a leak is looked for in."""
    digest = hashlib.sha256(f"{yaml.__version__} {jinja2.__version__}".encode())
    from llm_release.evaluation import stats

    for module in (metrics, templates, safety, stats):
        digest.update(Path(module.__file__).read_bytes())
    from llm_release.evaluation import evalsets, items, set_files

    for module in (evalsets, items, set_files):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(Path(__file__).read_bytes())
    for path in sorted(paths.calibration_dir().glob("*.jsonl")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _unchanged(reads: object, root: Path, name: str) -> bool:
    """Every file the kept check read is byte for byte the same. The kept record is a state
    file, input like any: its paths must be files of the eval sets' folder, the set's own
    task.yaml among them (a record naming only absent files passed everything), each a
    regular file of at most MAX_DATA_BYTES read without waiting (a FIFO or /dev/zero named
    there hung or filled the worker)."""
    if not isinstance(reads, dict) or not reads:
        return False
    base = root.resolve()
    task = str((root / name / "task.yaml").absolute())
    if not reads.get(task):
        return False
    for path, digest in reads.items():
        if not isinstance(path, str) or not isinstance(digest, str):
            return False
        if base not in Path(path).resolve().parents:
            return False
        if _digest_of(Path(path)) != digest:
            return False
    return True


def _digest_of(path: Path) -> str:
    """The SHA-256 of a regular file of at most MAX_DATA_BYTES; "" for one that is absent,
    and "?" (matching no digest) for anything else."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return ""
    except OSError:
        return "?"
    info = os.fstat(descriptor)
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_DATA_BYTES:
        os.close(descriptor)
        return "?"
    with open(descriptor, "rb") as handle:
        return hashlib.sha256(handle.read(MAX_DATA_BYTES + 1)).hexdigest()


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
