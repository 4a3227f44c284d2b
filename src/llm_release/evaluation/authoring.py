"""What a data scientist does by hand: ``eval-sets new`` (a set scaffolded from the
template, its name and floor checked) and ``eval-sets list`` (every set, a bad one listed with
its error and hiding no other)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from llm_release import paths
from llm_release.errors import EvalError, ReleaseError
from llm_release.evaluation.evalsets import FLOOR_HINT, TEMPLATE, available, load_eval_set
from llm_release.evaluation.items import load_items

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
        except OSError as exc:  # a folder it cannot enter, a file gone meanwhile
            rows.append({"name": name, "error": f"cannot be read: {exc.strerror or exc}"})
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
