"""Gates and the winner rule. A candidate failing any blocking gate is never eligible.

Quality gates come from each eval set (``gates:`` in its task.yaml, with project defaults
from eval_sets/defaults.yaml): a minimum absolute score, and a maximum drop versus the
baseline judged on the same items with a paired bootstrap interval — a candidate fails
only when the whole interval of the drop lies beyond the margin, so a small-sample wobble
passes and a real regression does not. Gates of a non-critical set are reported but do
not block; a slice gate (items with a tag) always blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import BASELINE, Gates
from .evalsets import GateSpec
from .results import CandidateResult, CandidateVerdict, Decision, EvalResult, GateVerdict
from .stats import paired_drop_ci

RULE = (
    "Every blocking gate must pass: the candidate was served and measured; for each eval "
    "set and metric the score is at least min_score and the drop versus the baseline, on "
    "the same items, is not beyond max_drop with the set's confidence (paired bootstrap); "
    "the same for every gated slice; TTFT p95 is under the SLO and the error rate under "
    "the ceiling at every load level. Among eligible candidates other than the current "
    "stable release, the winner has the highest output tokens/s at the highest measured "
    "concurrency; ties go to the smaller model on disk."
)


@dataclass
class Paired:
    n: int
    base_score: float
    cand_score: float
    drop: float
    ci_low: float
    ci_high: float
    worse: list[str]
    better: list[str]


def paired(
    baseline: EvalResult,
    candidate: EvalResult,
    metric: str,
    *,
    confidence: float,
    tag: str | None = None,
    higher_is_better: bool = True,
) -> Paired:
    base = {i.id: i for i in baseline.items if tag is None or tag in i.tags}
    cand = {i.id: i for i in candidate.items if tag is None or tag in i.tags}
    ids = sorted(set(base) & set(cand))
    b = [base[i].scores.get(metric, 0.0) for i in ids]
    c = [cand[i].scores.get(metric, 0.0) for i in ids]
    drop, low, high = paired_drop_ci(b, c, higher_is_better=higher_is_better, confidence=confidence)
    sign = 1 if higher_is_better else -1
    worse = [i for i, x, y in zip(ids, b, c, strict=True) if sign * (x - y) > 0]
    better = [i for i, x, y in zip(ids, b, c, strict=True) if sign * (y - x) > 0]
    n = len(ids)
    return Paired(
        n, sum(b) / n if n else 0.0, sum(c) / n if n else 0.0, drop, low, high, worse, better
    )


def _first_line(text: str | None) -> str:
    return (text or "unknown error").splitlines()[0]


def judge(
    result: CandidateResult,
    baseline: CandidateResult | None,
    gates: Gates,
    *,
    is_baseline: bool = False,
) -> CandidateVerdict:
    verdicts: list[GateVerdict] = []
    served = result.status == "measured"
    verdicts.append(
        GateVerdict(
            gate="served",
            passed=served,
            value=None,
            threshold=None,
            detail="served and measured"
            if served
            else f"{result.status}: {_first_line(result.error)}",
        )
    )
    if served:
        verdicts += _quality_gates(result, None if is_baseline else baseline)
        verdicts += _load_gates(result, gates)
    eligible = all(v.passed for v in verdicts if v.blocking)
    rank_key = None
    if served and result.load and result.load.levels:
        rank_key = max(result.load.levels, key=lambda lv: lv.concurrency).output_tokens_per_s
    return CandidateVerdict(name=result.name, eligible=eligible, gates=verdicts, rank_key=rank_key)


def _quality_gates(result: CandidateResult, baseline: CandidateResult | None) -> list[GateVerdict]:
    """Gates of every eval set; ``baseline`` None means this is the reference itself."""
    if not result.evals:
        return [
            GateVerdict(
                gate="quality",
                passed=False,
                value=None,
                threshold=None,
                detail="no eval scores were recorded",
            )
        ]
    out: list[GateVerdict] = []
    reference = {e.eval_set: e for e in baseline.evals} if baseline else {}
    if baseline is not None and baseline.status != "measured":
        out.append(
            GateVerdict(
                gate="quality",
                passed=False,
                value=None,
                threshold=None,
                detail="the baseline was not measured, so no drop can be computed",
            )
        )
    for ev in result.evals:
        spec = GateSpec.model_validate(ev.gates) if ev.gates else GateSpec()
        for metric, gate in spec.metrics.items():
            score = ev.metrics[metric]
            if gate.min_score is not None:
                out.append(
                    GateVerdict(
                        gate=f"{ev.eval_set}/{metric}:min_score",
                        blocking=spec.critical,
                        passed=score.value >= gate.min_score,
                        value=round(score.value, 4),
                        threshold=gate.min_score,
                        ci_low=score.ci_low,
                        ci_high=score.ci_high,
                        detail=f"score {score.value:.3f} [{score.ci_low or 0:.3f}, "
                        f"{score.ci_high or 0:.3f}] (minimum {gate.min_score:.3f})",
                    )
                )
            if baseline is None or baseline.status != "measured" or gate.max_drop is None:
                continue
            out.append(
                _drop_verdict(
                    ev,
                    reference.get(ev.eval_set),
                    metric,
                    gate.max_drop,
                    spec,
                    None,
                    score.higher_is_better,
                    spec.critical,
                )
            )
        for slice_gate in spec.slices:
            if baseline is None or baseline.status != "measured":
                continue
            higher = ev.metrics[slice_gate.metric].higher_is_better
            out.append(
                _drop_verdict(
                    ev,
                    reference.get(ev.eval_set),
                    slice_gate.metric,
                    slice_gate.max_drop,
                    spec,
                    slice_gate.tag,
                    higher,
                    True,
                    min_score=slice_gate.min_score,
                )
            )
    return out


def _drop_verdict(
    ev: EvalResult,
    base: EvalResult | None,
    metric: str,
    max_drop: float,
    spec: GateSpec,
    tag: str | None,
    higher_is_better: bool,
    blocking: bool,
    *,
    min_score: float | None = None,
) -> GateVerdict:
    where = f"{ev.eval_set}[{tag}]" if tag else ev.eval_set
    name = f"{where}/{metric}:drop"

    def cannot_compare(why: str) -> GateVerdict:
        return GateVerdict(
            gate=name, passed=False, value=None, threshold=max_drop, blocking=blocking, detail=why
        )

    if base is None:
        return cannot_compare("the baseline has no result for this set")
    p = paired(
        base, ev, metric, confidence=spec.confidence, tag=tag, higher_is_better=higher_is_better
    )
    if p.n == 0:
        return cannot_compare("no item in common with the baseline")
    beyond = p.ci_low > max_drop + 1e-12
    low_score = min_score is not None and p.cand_score < min_score
    detail = (
        f"{p.cand_score:.3f} vs baseline {p.base_score:.3f} on {p.n} items: drop "
        f"{p.drop:+.3f}, {spec.confidence:.0%} CI [{p.ci_low:+.3f}, {p.ci_high:+.3f}] "
        f"(margin {max_drop:.3f}); {len(p.worse)} items got worse, {len(p.better)} better"
    )
    if low_score:
        detail += f"; slice score below {min_score:.3f}"
    return GateVerdict(
        gate=name,
        passed=not beyond and not low_score,
        value=round(p.drop, 4),
        threshold=max_drop,
        blocking=blocking,
        ci_low=round(p.ci_low, 4),
        ci_high=round(p.ci_high, 4),
        detail=detail,
        flipped_worse=p.worse,
        flipped_better=p.better,
    )


def _load_gates(result: CandidateResult, gates: Gates) -> list[GateVerdict]:
    if result.load is None or not result.load.levels:
        return [
            GateVerdict(
                gate="load",
                passed=False,
                value=None,
                threshold=None,
                detail="no load-test measurement",
            )
        ]
    worst_ttft = max(result.load.levels, key=lambda lv: lv.ttft_p95_ms)
    worst_err = max(result.load.levels, key=lambda lv: lv.error_rate)
    slo_ms = gates.ttft_p95_slo_s * 1000
    return [
        GateVerdict(
            gate="ttft_p95",
            passed=worst_ttft.ttft_p95_ms <= slo_ms,
            value=round(worst_ttft.ttft_p95_ms, 1),
            threshold=slo_ms,
            detail=f"worst TTFT p95 {worst_ttft.ttft_p95_ms:.0f} ms at concurrency "
            f"{worst_ttft.concurrency} (SLO {slo_ms:.0f} ms)",
        ),
        GateVerdict(
            gate="error_rate",
            passed=worst_err.error_rate <= gates.max_error_rate,
            value=round(worst_err.error_rate, 4),
            threshold=gates.max_error_rate,
            detail=f"worst error rate {worst_err.error_rate:.2%} at concurrency "
            f"{worst_err.concurrency} (ceiling {gates.max_error_rate:.2%})",
        ),
    ]


def decide(results: list[CandidateResult], gates: Gates, stable: str | None = BASELINE) -> Decision:
    baseline = next((r for r in results if r.name == BASELINE), None)
    verdicts = [judge(r, baseline, gates, is_baseline=r.name == BASELINE) for r in results]
    sizes = {r.name: r.size_bytes or 0 for r in results}
    contenders = [v for v in verdicts if v.eligible and v.name != stable]
    contenders.sort(key=lambda v: (-(v.rank_key or 0.0), sizes[v.name]))
    winner = contenders[0].name if contenders else None
    if winner:
        summary = f"winner: {winner} ({contenders[0].rank_key:.1f} output tok/s at top load)"
    else:
        failed = [v.name for v in verdicts if not v.eligible]
        summary = "no candidate passed every gate"
        if failed:
            summary += f" (failed: {', '.join(failed)})"
    return Decision(winner=winner, stable=stable, rule=RULE, verdicts=verdicts, summary=summary)
