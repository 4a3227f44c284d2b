from llm_release.config import Gates
from llm_release.results import CandidateResult, EvalResult, LoadLevel, LoadResult, MetricScore
from llm_release.select import decide


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


def result(name, score=0.8, levels=None, status="measured", size=100):
    return CandidateResult(
        name=name,
        scheme="x",
        status=status,
        size_bytes=size,
        error=None if status == "measured" else "ServeError: boom\nlog tail",
        evals=[
            EvalResult(
                eval_set="kb", num_items=40, metrics={"numeric_match": MetricScore(value=score)}
            )
        ]
        if status == "measured"
        else [],
        load=LoadResult(levels=levels or [level()]) if status == "measured" else None,
    )


def test_quality_drop_beyond_margin_fails_the_gate():
    decision = decide([result("baseline", 0.80), result("q", 0.70)], Gates(max_quality_drop=0.05))
    verdict = next(v for v in decision.verdicts if v.name == "q")
    gate = next(g for g in verdict.gates if g.gate.startswith("quality"))
    assert not gate.passed and abs(gate.value - 0.10) < 1e-9
    assert decision.winner is None


def test_equal_quality_passes_and_wins():
    decision = decide([result("baseline", 0.8), result("q", 0.8)], Gates())
    assert decision.winner == "q"


def test_ttft_over_slo_fails():
    slow = result("q", levels=[level(1, 500), level(4, 3500)])
    decision = decide([result("baseline"), slow], Gates(ttft_p95_slo_s=3.0))
    verdict = next(v for v in decision.verdicts if v.name == "q")
    ttft = next(g for g in verdict.gates if g.gate == "ttft_p95")
    assert not ttft.passed and ttft.value == 3500
    assert decision.winner is None


def test_error_rate_over_ceiling_fails():
    flaky = result("q", levels=[level(errors=1, requests=8)])
    decision = decide([result("baseline"), flaky], Gates(max_error_rate=0.01))
    assert decision.winner is None


def test_failed_candidate_never_wins_even_if_listed_first():
    decision = decide([result("broken", status="failed"), result("baseline"), result("q")], Gates())
    assert decision.winner == "q"
    broken = next(v for v in decision.verdicts if v.name == "broken")
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


def test_without_a_measured_baseline_no_quality_gate_can_pass():
    decision = decide([result("baseline", status="failed"), result("q")], Gates())
    assert decision.winner is None
