"""Business metrics for eval sets, referenced by name from eval-set YAML.

Eval-set folders hold data only; the code that scores an answer lives here, so a data
folder can never run code inside the pipeline.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?")


def numbers_in(text: str) -> list[float]:
    return [float(n.replace(",", ".")) for n in NUMBER.findall(text or "")]


def numeric_match(reference: str, answer: str) -> float:
    """1.0 when every number of the reference appears among the answer's numbers."""
    wanted = numbers_in(reference)
    if not wanted:
        return 0.0
    found = numbers_in(answer)
    return float(all(any(abs(w - f) < 1e-9 for f in found) for w in wanted))


def exact_match(reference: str, answer: str) -> float:
    return float(reference.strip().casefold() == (answer or "").strip().casefold())


def contains(reference: str, answer: str) -> float:
    return float(reference.strip().casefold() in (answer or "").casefold())


@dataclass(frozen=True)
class Metric:
    name: str
    score: Callable[[str, str], float]
    higher_is_better: bool = True
    description: str = ""


REGISTRY: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "numeric_match",
            numeric_match,
            True,
            "every number of the reference appears in the answer",
        ),
        Metric("exact_match", exact_match, True, "answer equals the reference (case-folded)"),
        Metric("contains", contains, True, "the reference appears inside the answer"),
    )
}


def get(name: str) -> Metric:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown metric {name!r}; registered metrics: {', '.join(sorted(REGISTRY))}"
        ) from None
