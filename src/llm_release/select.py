"""Gates and the winner rule. A candidate failing any gate is never eligible for traffic."""

from __future__ import annotations

from .config import BASELINE, Gates
from .results import CandidateResult, CandidateVerdict, Decision, GateVerdict

RULE = (
    "Every gate must pass: the candidate was served and measured; no eval metric drops "
    "more than max_quality_drop below the baseline; TTFT p95 is under the SLO at every "
    "load level; the error rate is under the ceiling at every load level. Among eligible "
    "candidates other than the current stable release, the winner has the highest output "
    "tokens/s at the highest measured concurrency; ties go to the smaller model on disk."
)


def _scores(result: CandidateResult) -> dict[tuple[str, str], tuple[float, bool]]:
    return {
        (ev.eval_set, metric): (score.value, score.higher_is_better)
        for ev in result.evals
        for metric, score in ev.metrics.items()
    }


def judge(
    result: CandidateResult, baseline: CandidateResult | None, gates: Gates
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
            else f"failed: {(result.error or '').splitlines()[0] if result.error else 'unknown error'}",
        )
    )
    if served:
        verdicts += _quality_gates(result, baseline, gates)
        verdicts += _load_gates(result, gates)
    eligible = all(v.passed for v in verdicts)
    rank_key = None
    if served and result.load and result.load.levels:
        rank_key = max(result.load.levels, key=lambda lv: lv.concurrency).output_tokens_per_s
    return CandidateVerdict(name=result.name, eligible=eligible, gates=verdicts, rank_key=rank_key)


def _quality_gates(
    result: CandidateResult, baseline: CandidateResult | None, gates: Gates
) -> list[GateVerdict]:
    mine = _scores(result)
    if not mine:
        return [
            GateVerdict(
                gate="quality",
                passed=False,
                value=None,
                threshold=None,
                detail="no eval scores were recorded",
            )
        ]
    if baseline is None or baseline.status != "measured":
        return [
            GateVerdict(
                gate="quality",
                passed=False,
                value=None,
                threshold=None,
                detail="the baseline was not measured, so no drop can be computed",
            )
        ]
    reference = _scores(baseline)
    out = []
    for (eval_set, metric), (value, higher_is_better) in sorted(mine.items()):
        name = f"quality:{eval_set}/{metric}"
        if (eval_set, metric) not in reference:
            out.append(
                GateVerdict(
                    gate=name,
                    passed=False,
                    value=value,
                    threshold=None,
                    detail="the baseline has no score for this metric",
                )
            )
            continue
        base_value = reference[(eval_set, metric)][0]
        drop = (base_value - value) if higher_is_better else (value - base_value)
        passed = drop <= gates.max_quality_drop + 1e-12
        out.append(
            GateVerdict(
                gate=name,
                passed=passed,
                value=round(drop, 6),
                threshold=gates.max_quality_drop,
                detail=f"score {value:.4f} vs baseline {base_value:.4f}: drop {drop:+.4f} "
                f"(allowed {gates.max_quality_drop:.4f})",
            )
        )
    return out


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
    verdicts = [judge(r, baseline, gates) for r in results]
    sizes = {r.name: r.size_bytes or 0 for r in results}
    contenders = [v for v in verdicts if v.eligible and v.name != stable]
    contenders.sort(key=lambda v: (-(v.rank_key or 0.0), sizes[v.name]))
    winner = contenders[0].name if contenders else None
    if winner:
        summary = f"winner: {winner} ({contenders[0].rank_key:.1f} output tok/s at top load)"
    else:
        failed = [v.name for v in verdicts if not v.eligible]
        summary = "no candidate passed every gate" + (
            f" (failed: {', '.join(failed)})" if failed else ""
        )
    return Decision(winner=winner, stable=stable, rule=RULE, verdicts=verdicts, summary=summary)
