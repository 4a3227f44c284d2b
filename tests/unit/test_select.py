"""Gate logic on constructed results: the paired bootstrap blocks real regressions only."""

from llm_release.config import Gates
from llm_release.evalsets import GateSpec, MetricGate, SliceGate
from llm_release.results import (
    CandidateResult,
    EvalResult,
    ItemResult,
    LoadLevel,
    LoadResult,
    MetricScore,
)
from llm_release.select import decide

SPEC = GateSpec(metrics={"m": MetricGate(min_score=0.0, max_drop=0.05)})


def level(concurrency=4, ttft_p95=200.0, tps=50.0, errors=0, requests=8):
    return LoadLevel(
        concurrency=concurrency,
        requests=requests,
        errors=errors,
        error_rate=errors / requests,
        ttft_p50_ms=ttft_p95 / 2,
        ttft_p95_ms=ttft_p95,
        itl_p50_ms=30,
        itl_p95_ms=40,
        output_tokens_per_s=tps,
        requests_per_s=1.0,
    )


def result(name, scores=(1,) * 40, levels=None, status="measured", size=100, spec=SPEC, tags=None):
    items = [
        ItemResult(id=f"i{k}", scores={"m": float(v)}, tags=(tags or {}).get(k, []))
        for k, v in enumerate(scores)
    ]
    mean = sum(scores) / len(scores)
    return CandidateResult(
        name=name,
        scheme="x",
        status=status,
        size_bytes=size,
        error=None if status == "measured" else "ServeError: boom\nlog tail",
        evals=[
            EvalResult(
                eval_set="kb",
                num_items=len(items),
                items=items,
                metrics={"m": MetricScore(value=mean)},
                gates=spec.model_dump(),
            )
        ]
        if status == "measured"
        else [],
        load=LoadResult(levels=levels or [level()]) if status == "measured" else None,
    )


def verdict(decision, name):
    return next(v for v in decision.verdicts if v.name == name)


def gate(decision, name, prefix):
    return next(g for g in verdict(decision, name).gates if g.gate.startswith(prefix))


def test_real_regression_fails_and_names_the_flipped_items():
    base = [1] * 40
    worse = [1] * 20 + [0] * 20  # half the items flipped from right to wrong
    decision = decide([result("baseline", base), result("q", worse)], Gates())
    drop = gate(decision, "q", "kb/m:drop")
    assert not drop.passed and drop.ci_low > 0.05
    assert drop.flipped_worse == sorted(f"i{k}" for k in range(20, 40))
    assert decision.winner is None


def test_equal_candidate_passes_and_wins():
    scores = [1, 0] * 20
    decision = decide([result("baseline", scores), result("q", scores)], Gates())
    assert gate(decision, "q", "kb/m:drop").passed
    assert decision.winner == "q"


def test_small_sample_wobble_within_the_interval_passes():
    # 10 items, 1 flipped each way twice: a 0.10 point drop that noise easily explains.
    base = [1, 1, 1, 0, 1, 0, 1, 1, 1, 1]
    cand = [1, 0, 1, 0, 1, 0, 1, 1, 0, 1]
    decision = decide([result("baseline", base), result("q", cand)], Gates())
    drop = gate(decision, "q", "kb/m:drop")
    assert abs(drop.value - 0.2) < 1e-9 and drop.ci_low <= 0.05
    assert drop.passed and decision.winner == "q"


def test_min_score_gate():
    spec = GateSpec(metrics={"m": MetricGate(min_score=0.9, max_drop=1.0)})
    low = [1] * 30 + [0] * 10
    decision = decide([result("baseline", low, spec=spec), result("q", low, spec=spec)], Gates())
    assert not gate(decision, "q", "kb/m:min_score").passed
    assert decision.winner is None


def test_critical_slice_blocks_even_when_the_whole_set_passes():
    spec = GateSpec(
        metrics={"m": MetricGate(min_score=0.0, max_drop=0.5)},
        slices=[SliceGate(tag="safety", metric="m", max_drop=0.0, min_score=0.0)],
    )
    tags = {k: ["safety"] for k in range(10)}
    base = [1] * 40
    cand = [0] * 10 + [1] * 30  # every safety item lost
    decision = decide(
        [result("baseline", base, spec=spec, tags=tags), result("q", cand, spec=spec, tags=tags)],
        Gates(),
    )
    assert gate(decision, "q", "kb/m:drop").passed
    assert not gate(decision, "q", "kb[safety]/m:drop").passed
    assert decision.winner is None


def test_non_critical_set_reports_but_does_not_block():
    spec = GateSpec(critical=False, metrics={"m": MetricGate(min_score=0.0, max_drop=0.05)})
    decision = decide(
        [result("baseline", [1] * 40, spec=spec), result("q", [0] * 40, spec=spec)], Gates()
    )
    drop = gate(decision, "q", "kb/m:drop")
    assert not drop.passed and not drop.blocking
    assert decision.winner == "q"


def test_ttft_over_slo_fails():
    slow = result("q", levels=[level(1, 500), level(4, 3500)])
    decision = decide([result("baseline"), slow], Gates(ttft_p95_slo_s=3.0))
    ttft = gate(decision, "q", "ttft_p95")
    assert not ttft.passed and ttft.value == 3500
    assert decision.winner is None


def test_error_rate_over_ceiling_fails():
    flaky = result("q", levels=[level(errors=1, requests=8)])
    assert decide([result("baseline"), flaky], Gates(max_error_rate=0.01)).winner is None


def test_failed_candidate_never_wins_even_if_listed_first():
    decision = decide([result("broken", status="failed"), result("baseline"), result("q")], Gates())
    assert decision.winner == "q"
    broken = verdict(decision, "broken")
    assert not broken.eligible and "boom" in broken.gates[0].detail


def test_highest_throughput_at_top_load_wins_and_ties_go_to_smaller():
    a = result("a", levels=[level(1, tps=100), level(4, tps=40)])
    b = result("b", levels=[level(1, tps=10), level(4, tps=60)])
    assert decide([result("baseline"), a, b], Gates()).winner == "b"
    c = result("c", levels=[level(4, tps=60)], size=50)
    assert decide([result("baseline"), b, c], Gates()).winner == "c"


def test_stable_release_is_never_the_canary():
    decision = decide([result("baseline", levels=[level(tps=999)]), result("q")], Gates())
    assert decision.winner == "q"
    later = decide([result("baseline", levels=[level(tps=999)]), result("q")], Gates(), stable=None)
    assert later.winner == "baseline"


def test_without_a_measured_baseline_no_candidate_is_eligible():
    decision = decide([result("baseline", status="failed"), result("q")], Gates())
    assert decision.winner is None
