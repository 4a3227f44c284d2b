"""Business metrics for eval sets, referenced by name from eval-set YAML.

Eval-set folders hold data only; the code that scores an answer lives here, so a data
folder can never run code inside the pipeline. Every metric sees the whole item (``doc``)
and the model's answer, and declares whether higher is better.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:[.,]\d+)?")
# A number followed by its unit: "85 N·m", "9 %", "240 °C", "3250 hours".
NUMBER_WITH_UNIT = re.compile(r"(-?\d+(?:[.,]\d+)?)\s*(%|°\s?[CF]|[A-Za-zµ·/]+)?")
REFUSAL = re.compile(
    r"(?i)\b(not (stated|given|specified|mentioned|provided|listed|included|available|"
    r"in the passage|contain)|(does not|doesn't|did not) (state|say|give|specify|mention|"
    r"contain|include|provide|list)|no (information|mention|value)|"
    r"(cannot|can't|unable to) (find|answer|determine)|unknown)"
)


def _num(text: str) -> float:
    return float(text.replace(",", "."))


def numbers_in(text: str) -> list[float]:
    return [_num(n) for n in NUMBER.findall(text or "")]


def _unit(text: str | None) -> str:
    return re.sub(r"\s+", "", (text or "")).casefold()


def numbers_with_units_in(text: str) -> list[tuple[float, str]]:
    return [(_num(n), _unit(u)) for n, u in NUMBER_WITH_UNIT.findall(text or "")]


def _source_text(doc: dict) -> str:
    # The passage id is quoted in citations; its digits are not an invented value.
    return " ".join(str(doc.get(k, "")) for k in ("passage", "question", "context", "passage_id"))


def invented_numbers(doc: dict, answer: str) -> list[float]:
    """Numbers in the answer that appear nowhere in the passage or the question."""
    allowed = set(numbers_in(_source_text(doc)))
    return [n for n in numbers_in(answer) if n not in allowed]


def numeric_match(doc: dict, answer: str) -> float:
    """1.0 when every number of the reference appears among the answer's numbers."""
    wanted = numbers_in(str(doc.get("answer", "")))
    if not wanted:
        return 0.0
    found = numbers_in(answer)
    return float(all(w in found for w in wanted))


def numbers_with_units(doc: dict, answer: str) -> float:
    """Every number of the reference appears with its unit, and no number is invented."""
    wanted = [(n, u) for n, u in numbers_with_units_in(str(doc.get("answer", "")))]
    if not wanted:
        return 0.0
    found = numbers_with_units_in(answer)
    for number, unit in wanted:
        if not any(n == number and (not unit or u.startswith(unit)) for n, u in found):
            return 0.0
    return float(not invented_numbers(doc, answer))


def cites_source(doc: dict, answer: str) -> float:
    """The answer names the passage id it was given (e.g. KB-1003)."""
    passage_id = str(doc.get("passage_id", "")).strip()
    return float(bool(passage_id) and passage_id.casefold() in (answer or "").casefold())


def refusal(doc: dict, answer: str) -> float:
    """The answer says the passage does not hold the value, and invents no number."""
    return float(bool(REFUSAL.search(answer or "")) and not invented_numbers(doc, answer))


def exact_match(doc: dict, answer: str) -> float:
    return float(str(doc.get("answer", "")).strip().casefold() == (answer or "").strip().casefold())


def contains(doc: dict, answer: str) -> float:
    return float(str(doc.get("answer", "")).strip().casefold() in (answer or "").casefold())


# An item's regex comes from an eval set's data: a pattern such as "(a|aa)+$" backtracks
# for hours on a long answer, in Python's re and in the third-party regex engine alike
# (already installed for transformers); regex stops a search after this many seconds.
REGEX_TIMEOUT_S = 1.0


def regex_match(doc: dict, answer: str) -> float:
    """The item's ``answer_regex`` (or its reference, read as a regex) matches the answer."""
    import regex

    from llm_release.errors import EvalError

    pattern = doc.get("answer_regex") or str(doc.get("answer", ""))
    try:
        found = regex.search(
            pattern, answer or "", flags=regex.IGNORECASE | regex.V0, timeout=REGEX_TIMEOUT_S
        )
    except TimeoutError:
        raise EvalError(
            f"item {doc.get('id', '?')}: answer_regex {pattern[:80]!r} took over "
            f"{REGEX_TIMEOUT_S:.0f} s on a {len(answer or '')}-character answer",
            hint="rewrite it without repetition over overlapping choices (e.g. '(a|aa)+'), or score with "
            "'contains' or 'exact_match'",
        ) from None
    except regex.error as exc:
        raise EvalError(
            f"item {doc.get('id', '?')}: answer_regex {pattern[:80]!r} is not a regex: {exc}",
            hint="fix the pattern in the eval set's data.jsonl",
        ) from None
    return float(found is not None)


@dataclass(frozen=True)
class Metric:
    name: str
    score: Callable[[dict, str], float]
    higher_is_better: bool
    description: str
    needs: tuple[str, ...] = ("answer",)


REGISTRY: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric(
            "numeric_match",
            numeric_match,
            True,
            "every number of the reference appears in the answer",
        ),
        Metric(
            "numbers_with_units",
            numbers_with_units,
            True,
            "every number of the reference appears with its unit; no number is invented",
            ("answer", "passage"),
        ),
        Metric(
            "cites_source",
            cites_source,
            True,
            "the answer cites the passage id it was given",
            ("passage_id",),
        ),
        Metric(
            "refusal",
            refusal,
            True,
            "the answer says the passage lacks the value and invents no number",
            ("passage",),
        ),
        Metric("exact_match", exact_match, True, "answer equals the reference (case-folded)"),
        Metric("contains", contains, True, "the reference appears inside the answer"),
        Metric(
            "regex_match",
            regex_match,
            True,
            "answer_regex (or the reference as a regex) matches the answer",
        ),
    )
}


def get(name: str) -> Metric:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown metric {name!r}; registered metrics: {', '.join(sorted(REGISTRY))}"
        ) from None
