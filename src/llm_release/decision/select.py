"""Gates and the winner rule: champion and challengers, gates with three outcomes.

The champion is the release serving users now, measured in the same run on the same items,
decoding and load profile as every challenger (or its measurement reused when nothing it
depends on changed). The challengers are the new commit's unquantized model (``baseline``)
and the candidates quantized from it. Every challenger is judged against the champion;
a quantized candidate is also judged against its own unquantized model, so the cost of
quantizing is reported apart from the cost of the upstream change.

Quality gates come from each eval set (``gates:`` in its task.yaml, with project defaults
from eval_sets/defaults.yaml). A drop gate compares the same items, paired, with a
bootstrap interval of the drop, and has three outcomes:

- ``fail``: the point estimate of the drop is beyond the margin (a zero margin fails on
  any item that went from right to wrong);
- ``pass``: the whole interval lies within the margin;
- ``inconclusive``: the interval straddles the margin — the set is too small, or the
  candidate too close to the margin, to tell. The set's ``on_inconclusive`` decides:
  ``block``, ``pass``, or ``review`` (a human approves or rejects in the Prefect UI).

Absolute gates (``min_score``, the TTFT SLO, the error ceiling) apply to every challenger,
the new commit's unquantized model included. Gates of a non-critical set are reported but
do not block; a slice gate always blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from llm_release.config import BASELINE, CHAMPION, Gates
from llm_release.decision.contenders import Contender
from llm_release.evaluation.stats import detectable_drop, paired_drop_ci
from llm_release.load.loadtest import goodput, slo_for
from llm_release.results import (
    CandidateResult,
    CandidateVerdict,
    Decision,
    DeployTarget,
    EvalResult,
    GateSpec,
    GateVerdict,
)

RULE = (
    "A challenger is eligible when every blocking gate passes: it was served and measured; "
    "for each eval set and metric its score is at least min_score; its drop versus the "
    "champion (the release serving users now) and, for a quantized candidate, versus its own "
    "unquantized model, on the same items, passes — the paired bootstrap interval of the "
    "drop lies within max_drop (a point estimate beyond max_drop fails; an interval that "
    "straddles it is inconclusive and follows the set's on_inconclusive: block, pass, or "
    "review by a human); the same for every gated slice (a zero margin fails on any item "
    "that went from right to wrong); TTFT p95 is under the SLO and the error rate under the "
    "ceiling at every load level. The winner is the eligible challenger with the highest "
    "goodput: the highest load level whose TTFT p95, ITL p95 and error rate meet the SLO "
    "(gates.ttft_p95_slo_s, gates.itl_p95_slo_ms, gates.max_error_rate), every lower level "
    "meeting it too; at equal goodput, the one with more output tokens/s at that level (at the "
    "highest level when no level meets the SLO); then the smaller model on "
    "disk. When no challenger is eligible, the best one awaiting review goes to a human. "
    "On a first release (no champion) there is nothing to compare with: the new commit's "
    "unquantized model becomes stable only if it passes its absolute gates — every critical "
    "set's floors (min_score, measured and declared by each set), the TTFT SLO and the error "
    "ceiling."
)
EPS = 1e-12


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


def drop_outcome(p: Paired, margin: float) -> str:
    """fail: the point estimate is beyond the margin, or a zero margin saw any flip to
    worse; pass: the whole interval lies within the margin; else inconclusive."""
    if margin <= EPS:
        return "fail" if p.worse else "pass"
    if p.drop > margin + EPS:
        return "fail"
    if p.ci_high <= margin + EPS:
        return "pass"
    return "inconclusive"


def _first_line(text: str | None) -> str:
    return (text or "unknown error").splitlines()[0]


def _gate(name: str, outcome: str, **fields) -> GateVerdict:
    policy = fields.get("policy")
    passed = outcome == "pass" or (outcome == "inconclusive" and policy == "pass")
    return GateVerdict(gate=name, outcome=outcome, passed=passed, **fields)


def judge(
    result: CandidateResult,
    references: list[tuple[str, CandidateResult]],
    gates: Gates,
) -> CandidateVerdict:
    """``references`` are (label, result) pairs the drops are measured against."""
    verdicts: list[GateVerdict] = []
    served = result.status == "measured"
    verdicts.append(
        _gate(
            "served",
            "pass" if served else "fail",
            value=None,
            threshold=None,
            detail="served and measured"
            if served
            else f"{result.status}: {_first_line(result.error)}",
        )
    )
    if served:
        verdicts += _score_gates(result)
        for label, reference in references:
            verdicts += _drop_gates(result, label, reference)
        verdicts += _load_gates(result, gates)
    blocking = [v for v in verdicts if v.blocking]
    failed = any(not v.passed and v.outcome != "inconclusive" for v in blocking) or any(
        v.outcome == "inconclusive" and v.policy == "block" for v in blocking
    )
    review = any(v.outcome == "inconclusive" and v.policy == "review" for v in blocking)
    rank_key, good = None, None
    if served and result.load and result.load.levels:
        good = goodput(result.load.levels, slo_for(gates))
        rank_key = good.output_tokens_per_s
        if not good.concurrency:
            rank_key = max(result.load.levels, key=lambda lv: lv.concurrency).output_tokens_per_s
    return CandidateVerdict(
        name=result.name,
        role=result.role,
        eligible=not failed and not review,
        needs_review=not failed and review,
        gates=verdicts,
        rank_key=rank_key,
        goodput=good,
    )


def _score_gates(result: CandidateResult) -> list[GateVerdict]:
    """Absolute gates: the minimum score of every set, for every challenger."""
    if not result.evals:
        return [_gate("quality", "fail", value=None, threshold=None, detail="no eval scores")]
    out = []
    for ev in result.evals:
        spec = ev.gates
        for metric, gate in spec.metrics.items():
            if gate.min_score is None:
                continue
            score = ev.metrics[metric]
            out.append(
                _gate(
                    f"{ev.eval_set}/{metric}:min_score",
                    "pass" if score.value >= gate.min_score - EPS else "fail",
                    blocking=spec.critical,
                    value=round(score.value, 4),
                    threshold=gate.min_score,
                    ci_low=score.ci_low,
                    ci_high=score.ci_high,
                    items=ev.num_items,
                    detail=f"score {score.value:.3f} [{score.ci_low or 0:.3f}, "
                    f"{score.ci_high or 0:.3f}] (minimum {gate.min_score:.3f})",
                )
            )
    return out


def _drop_gates(
    result: CandidateResult, label: str, reference: CandidateResult
) -> list[GateVerdict]:
    if reference.status != "measured":
        return [
            _gate(
                f"quality vs {label}",
                "fail",
                value=None,
                threshold=None,
                reference=label,
                detail=f"{label} was not measured, so no drop can be computed",
            )
        ]
    by_set = {e.eval_set: e for e in reference.evals}
    out = []
    for ev in result.evals:
        spec = ev.gates
        base = by_set.get(ev.eval_set)
        for metric, gate in spec.metrics.items():
            if gate.max_drop is None:
                continue
            higher = ev.metrics[metric].higher_is_better
            out.append(
                _drop_verdict(
                    ev, base, label, metric, gate.max_drop, spec, None, higher, spec.critical
                )
            )
        for slice_gate in spec.slices:
            higher = ev.metrics[slice_gate.metric].higher_is_better
            out.append(
                _drop_verdict(
                    ev,
                    base,
                    label,
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
    label: str,
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
    name = f"{where}/{metric}:drop vs {label}"
    common = {
        "threshold": max_drop,
        "blocking": blocking,
        "reference": label,
        "policy": spec.on_inconclusive,
    }
    if base is None:
        return _gate(
            name, "fail", value=None, detail=f"{label} has no result for this set", **common
        )
    if base.version != ev.version:
        return _gate(
            name,
            "fail",
            value=None,
            detail=f"{label} was measured on version {base.version} of the set, this on {ev.version}",
            **common,
        )
    p = paired(
        base, ev, metric, confidence=spec.confidence, tag=tag, higher_is_better=higher_is_better
    )
    if p.n == 0:
        return _gate(name, "fail", value=None, detail=f"no item in common with {label}", **common)
    outcome = drop_outcome(p, max_drop)
    low_score = min_score is not None and p.cand_score < min_score - EPS
    if low_score:
        outcome = "fail"
    resolvable = detectable_drop(p.n, confidence=spec.confidence)
    warning = None
    if max_drop > EPS and (resolvable is None or resolvable > max_drop + EPS):
        warning = (
            f"{p.n} items cannot resolve a {max_drop:.3f} margin at {spec.confidence:.0%}: the "
            f"smallest drop they tell from noise is {resolvable or 1:.3f}; a drop within the margin "
            f"will be inconclusive — grow the set (see docs/decisions.md, 'How large a set must be')"
        )
    detail = (
        f"{p.cand_score:.3f} vs {label} {p.base_score:.3f} on {p.n} items: drop {p.drop:+.3f}, "
        f"{spec.confidence:.0%} CI [{p.ci_low:+.3f}, {p.ci_high:+.3f}] (margin {max_drop:.3f}); "
        f"{len(p.worse)} items got worse, {len(p.better)} better"
    )
    if low_score:
        detail += f"; slice score below {min_score:.3f}"
    return _gate(
        name,
        outcome,
        value=round(p.drop, 4),
        ci_low=round(p.ci_low, 4),
        ci_high=round(p.ci_high, 4),
        items=p.n,
        detectable_drop=round(resolvable, 4) if resolvable is not None else None,
        warning=warning,
        detail=detail,
        flipped_worse=p.worse,
        flipped_better=p.better,
        **common,
    )


def _load_gates(result: CandidateResult, gates: Gates) -> list[GateVerdict]:
    if result.load is None or not result.load.levels:
        return [
            _gate("load", "fail", value=None, threshold=None, detail="no load-test measurement")
        ]
    worst_ttft = max(result.load.levels, key=lambda lv: lv.ttft_p95_ms)
    worst_err = max(result.load.levels, key=lambda lv: lv.error_rate)
    slo_ms = gates.ttft_p95_slo_s * 1000
    return [
        _gate(
            "ttft_p95",
            "pass" if worst_ttft.ttft_p95_ms <= slo_ms else "fail",
            value=round(worst_ttft.ttft_p95_ms, 1),
            threshold=slo_ms,
            detail=f"worst TTFT p95 {worst_ttft.ttft_p95_ms:.0f} ms at concurrency "
            f"{worst_ttft.concurrency} (SLO {slo_ms:.0f} ms)",
        ),
        _gate(
            "error_rate",
            "pass" if worst_err.error_rate <= gates.max_error_rate else "fail",
            value=round(worst_err.error_rate, 4),
            threshold=gates.max_error_rate,
            detail=f"worst error rate {worst_err.error_rate:.2%} at concurrency "
            f"{worst_err.concurrency} (ceiling {gates.max_error_rate:.2%})",
        ),
    ]


def references_for(
    result: CandidateResult, results: list[CandidateResult]
) -> list[tuple[str, CandidateResult]]:
    """What a challenger is judged against: the champion, and its own unquantized model."""
    by_name = {r.name: r for r in results}
    refs: list[tuple[str, CandidateResult]] = []
    champion = by_name.get(CHAMPION)
    if champion is not None and result.role != "champion":
        who = f"champion ({champion.release_id})" if champion.release_id else "champion"
        refs.append((who, champion))
    baseline = by_name.get(BASELINE)
    if result.role == "quantized" and baseline is not None:
        refs.append(("own unquantized model", baseline))
    return refs


def decide(results: list[CandidateResult], gates: Gates) -> Decision:
    """Judge every challenger; pick the winner; on a first release, the stable one too."""
    verdicts = [judge(r, references_for(r, results), gates) for r in results]
    by_name = {v.name: v for v in verdicts}
    sizes = {r.name: r.size_bytes or 0 for r in results}
    has_champion = CHAMPION in by_name

    def ranked(pool: list[CandidateVerdict]) -> list[CandidateVerdict]:
        # goodput first, then output tokens/s at the goodput level, then the smaller model
        return sorted(pool, key=lambda v: (-_goodput(v), -(v.rank_key or 0.0), sizes[v.name]))

    challengers = [v for v in verdicts if v.role != "champion"]
    stable: str | None = CHAMPION if has_champion else None
    if not has_champion:
        # First release: the unquantized model becomes stable only if it passes its gates;
        # the canary is the best other challenger. With no eligible baseline, the best
        # eligible quantized model goes out alone, as the stable release.
        base = by_name.get(BASELINE)
        if base is not None and base.eligible:
            stable = BASELINE
            challengers = [v for v in challengers if v.name != BASELINE]
    eligible = ranked([v for v in challengers if v.eligible])
    waiting = ranked([v for v in challengers if v.needs_review])
    winner = eligible[0].name if eligible else None
    review = waiting[0].name if not eligible and waiting else None
    if not has_champion and stable is None and winner:
        stable, winner = winner, None
    if winner:
        summary = f"winner: {winner} ({_rank_text(eligible[0])})"
    elif review:
        summary = f"{review} awaits review: a gate was inconclusive and its set asks a human"
    elif stable and not has_champion:
        summary = f"first release: {stable} becomes stable; no other challenger passed every gate"
        floors = floor_refusals(verdicts)
        if floors:
            summary += " (refused by floors: " + "; ".join(floors) + ")"
    else:
        failed = [v.name for v in challengers if not v.eligible]
        summary = "no challenger passed every gate"
        if failed:
            summary += f" (failed: {', '.join(failed)})"
        floors = floor_refusals(verdicts)
        if floors:
            summary += "; refused by floors: " + "; ".join(floors)
        if has_champion:
            summary += "; the champion keeps serving"
    return Decision(
        winner=winner,
        stable=stable,
        rule=RULE,
        verdicts=verdicts,
        summary=summary,
        review=review,
        slo=slo_for(gates),
    )


def floor_refusals(verdicts: list[CandidateVerdict]) -> list[str]:
    """Each blocking floor (``min_score``) a challenger failed, as ``name: set/metric score
    below floor``: what the report and the summary name when a floor refused a model."""
    out = []
    for v in verdicts:
        if v.role == "champion":
            continue
        for g in v.gates:
            if g.gate.endswith(":min_score") and g.blocking and g.outcome == "fail":
                where = g.gate.removesuffix(":min_score")
                out.append(f"{v.name}: {where} {g.value:.3f} below floor {g.threshold:.3f}")
    return out


def _goodput(verdict: CandidateVerdict) -> int:
    return verdict.goodput.concurrency if verdict.goodput else 0


def _rank_text(verdict: CandidateVerdict) -> str:
    """What ranked ``verdict`` first, in words."""
    tok_s = verdict.rank_key or 0.0
    if _goodput(verdict):
        return f"goodput {_goodput(verdict)} streams within the SLO, {tok_s:.1f} output tok/s there"
    return f"no load level within the SLO; {tok_s:.1f} output tok/s at the top level"


def deploy_targets(
    decision: Decision, contenders: list[Contender], repo_id: str, commit: str, run_dir: Path
) -> tuple[DeployTarget | None, DeployTarget | None]:
    """What the decision sends out, as (stable, canary): the contender each names, with the
    commit it was built from. The champion already serves, so it is no target; neither is a
    name that no contender carries, nor none."""
    by_name = {c.name: c for c in contenders}

    def target(name: str | None) -> DeployTarget | None:
        c = by_name.get(name) if name is not None else None
        if c is None or c.role == "champion":
            return None
        return DeployTarget(
            candidate=c.name,
            scheme=c.scheme,
            model_dir=c.model_dir,
            repo_id=repo_id,
            commit=commit,
            serving=c.serving,
            run_dir=run_dir,
        )

    return target(decision.stable), target(decision.winner)


def apply_review(decision: Decision, approved: bool, note: str) -> Decision:
    """A human's answer to ``decision.review``: approved, the candidate becomes the winner."""
    name = decision.review
    if name is None:
        return decision
    if approved:
        stable, winner = decision.stable, name
        if stable is None:  # first release: nothing serves yet, the approved one is stable
            stable, winner = name, None
        summary = f"{name} approved by review ({note}); " + (
            f"winner: {winner}" if winner else f"{name} becomes stable"
        )
    else:
        stable = decision.stable if decision.stable != name else None
        winner = None
        summary = f"{name} rejected by review ({note}); nothing new goes out"
    return decision.model_copy(
        update={"winner": winner, "stable": stable, "summary": summary, "reviewed": note}
    )
