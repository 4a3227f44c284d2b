"""Gate logic on constructed results: champion and challengers, three outcomes per gate."""

from llm_release.config import Gates
from llm_release.decision.select import apply_review, decide
from llm_release.results import (
    CandidateResult,
    EvalResult,
    GateSpec,
    ItemResult,
    LoadLevel,
    LoadResult,
    MetricGate,
    MetricScore,
    SliceGate,
)

SPEC = GateSpec(metrics={"m": MetricGate(min_score=0.0, max_drop=0.05)})


def level(concurrency=4, ttft_p95=200.0, tps=50.0, errors=0, requests=8, itl_p95=40.0):
    return LoadLevel(
        concurrency=concurrency,
        requests=requests,
        errors=errors,
        error_rate=errors / requests,
        ttft_p50_ms=ttft_p95 / 2,
        ttft_p95_ms=ttft_p95,
        itl_p50_ms=30,
        itl_p95_ms=itl_p95,
        output_tokens_per_s=tps,
        requests_per_s=1.0,
    )


def result(name, scores=(1,) * 40, levels=None, status="measured", size=100, spec=SPEC, tags=None):
    items = [
        ItemResult(id=f"i{k}", scores={"m": float(v)}, tags=(tags or {}).get(k, []))
        for k, v in enumerate(scores)
    ]
    mean = sum(scores) / len(scores)
    role = {"baseline": "baseline", "champion": "champion"}.get(name, "quantized")
    return CandidateResult(
        name=name,
        role=role,
        release_id="stable-1" if role == "champion" else None,
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
                gates=spec,
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


def flipped(n_items: int, flips: int, start: int = 0) -> list[int]:
    return [0 if start <= k < start + flips else 1 for k in range(n_items)]


def test_seven_of_forty_items_flipped_fail_a_five_point_gate():
    # The case the old rule let through: -17.5% with an interval reaching below 0.05.
    decision = decide([result("baseline"), result("q", flipped(40, 7))], Gates())
    drop = gate(decision, "q", "kb/m:drop")
    assert drop.outcome == "fail" and abs(drop.value - 0.175) < 1e-9
    assert drop.flipped_worse == sorted(f"i{k}" for k in range(7))
    assert decision.winner is None and decision.review is None


def test_three_of_fourteen_safety_items_fail_a_zero_margin_slice():
    spec = GateSpec(
        metrics={"m": MetricGate(min_score=0.0, max_drop=0.5)},
        slices=[SliceGate(tag="safety", metric="m", max_drop=0.0, min_score=0.0)],
    )
    tags = {k: ["safety"] for k in range(14)}
    cand = flipped(40, 3)
    decision = decide(
        [result("baseline", spec=spec, tags=tags), result("q", cand, spec=spec, tags=tags)],
        Gates(),
    )
    assert gate(decision, "q", "kb/m:drop").outcome == "pass"
    assert gate(decision, "q", "kb[safety]/m:drop").outcome == "fail"
    assert decision.winner is None


def test_a_zero_margin_fails_on_one_flip_even_when_another_item_improved():
    spec = GateSpec(metrics={"m": MetricGate(min_score=0.0, max_drop=0.0)})
    base = [1, 0] + [1] * 38
    cand = [0, 1] + [1] * 38  # net drop 0, but one item went from right to wrong
    decision = decide([result("baseline", base, spec=spec), result("q", cand, spec=spec)], Gates())
    drop = gate(decision, "q", "kb/m:drop")
    assert drop.value == 0 and drop.outcome == "fail"


def test_a_candidate_equal_to_its_reference_passes_and_wins():
    scores = [1, 0] * 20
    decision = decide([result("baseline", scores), result("q", scores)], Gates())
    assert gate(decision, "q", "kb/m:drop").outcome == "pass"
    assert decision.winner == "q"


def test_an_interval_straddling_the_margin_is_inconclusive_and_asks_a_human():
    # One flip in 40: drop 0.025 is within 0.05, but the interval reaches 0.075.
    decision = decide([result("baseline"), result("q", flipped(40, 1))], Gates())
    drop = gate(decision, "q", "kb/m:drop")
    assert drop.outcome == "inconclusive" and drop.ci_high > 0.05 >= drop.value
    assert drop.policy == "review" and not drop.passed
    assert verdict(decision, "q").needs_review and not verdict(decision, "q").eligible
    assert decision.review == "q" and decision.winner is None
    approved = apply_review(decision, True, "checked the flipped item by hand")
    assert approved.winner == "q" and "checked the flipped item" in approved.reviewed
    rejected = apply_review(decision, False, "no")
    assert rejected.winner is None and rejected.stable == "baseline"


def test_the_set_chooses_what_inconclusive_does():
    def run(policy):
        spec = GateSpec(
            on_inconclusive=policy, metrics={"m": MetricGate(min_score=0.0, max_drop=0.05)}
        )
        return decide(
            [result("baseline", spec=spec), result("q", flipped(40, 1), spec=spec)], Gates()
        )

    assert run("block").winner is None and run("block").review is None
    assert run("pass").winner == "q"
    assert run("review").review == "q"


def test_an_eligible_challenger_goes_out_without_asking_even_if_a_faster_one_is_unsure():
    unsure = result("fast", flipped(40, 1), levels=[level(tps=99)])
    sure = result("slow", levels=[level(tps=10)])
    decision = decide([result("baseline"), unsure, sure], Gates())
    assert decision.winner == "slow" and decision.review is None


def test_challengers_are_judged_against_the_champion_and_quantized_ones_against_their_own_model():
    # The new commit is worse than what users get now: refused, the reason names the champion.
    champion = result("champion")
    new_commit = result("baseline", flipped(40, 10))
    quantized = result("q", flipped(40, 10))  # equal to its own unquantized model
    decision = decide([champion, new_commit, quantized], Gates())
    vs_champion = gate(decision, "baseline", "kb/m:drop vs champion")
    assert vs_champion.outcome == "fail" and vs_champion.reference == "champion (stable-1)"
    q_own = gate(decision, "q", "kb/m:drop vs own unquantized model")
    q_champ = gate(decision, "q", "kb/m:drop vs champion")
    assert q_own.outcome == "pass" and q_champ.outcome == "fail"
    assert decision.winner is None and decision.stable == "champion"
    assert "champion keeps serving" in decision.summary
    assert verdict(decision, "champion").role == "champion"


def test_the_champion_is_never_the_canary_and_the_new_commit_can_be():
    champion = result("champion", levels=[level(tps=999)])
    decision = decide([champion, result("baseline")], Gates())
    assert decision.winner == "baseline" and decision.stable == "champion"


def test_without_a_measured_champion_no_challenger_is_eligible():
    decision = decide([result("champion", status="failed"), result("baseline")], Gates())
    assert decision.winner is None
    assert "champion" in gate(decision, "baseline", "quality vs champion").detail


def test_a_first_release_deploys_nothing_that_fails_an_absolute_gate():
    spec = GateSpec(metrics={"m": MetricGate(min_score=0.9, max_drop=1.0)})
    low = [1] * 30 + [0] * 10
    decision = decide([result("baseline", low, spec=spec), result("q", low, spec=spec)], Gates())
    assert gate(decision, "baseline", "kb/m:min_score").outcome == "fail"
    assert decision.stable is None and decision.winner is None


def test_a_first_release_of_a_model_that_scores_nothing_is_refused_by_the_floor():
    # The hole of issue 23: with no champion only the absolute gates judge. A model that
    # scores 0 on a critical set, however fast, is refused, and the summary names the floor.
    spec = GateSpec(metrics={"m": MetricGate(min_score=0.3, max_drop=0.1)})
    zero = result("baseline", [0] * 40, spec=spec, levels=[level(tps=500)])
    decision = decide([zero], Gates())
    assert decision.stable is None and decision.winner is None and decision.review is None
    floor = gate(decision, "baseline", "kb/m:min_score")
    assert (floor.outcome, floor.value, floor.threshold) == ("fail", 0.0, 0.3)
    assert "refused by floors: baseline: kb/m 0.000 below floor 0.300" in decision.summary
    # The SLO and the error ceiling passed: the floor alone stopped it.
    assert [g.gate for g in verdict(decision, "baseline").gates if not g.passed] == [
        "kb/m:min_score"
    ]


def test_a_first_release_names_the_floor_a_quantized_candidate_failed():
    spec = GateSpec(metrics={"m": MetricGate(min_score=0.5, max_drop=1.0)})
    decision = decide(
        [result("baseline", spec=spec), result("q", [1] * 10 + [0] * 30, spec=spec)], Gates()
    )
    assert (decision.stable, decision.winner) == ("baseline", None)
    assert "(refused by floors: q: kb/m 0.250 below floor 0.500)" in decision.summary


def test_a_first_release_makes_the_baseline_stable_only_when_it_passes():
    ok = decide([result("baseline"), result("q")], Gates())
    assert (ok.stable, ok.winner) == ("baseline", "q")
    slow_base = result("baseline", levels=[level(ttft_p95=9000)])
    alone = decide([slow_base, result("q")], Gates(ttft_p95_slo_s=3))
    assert (alone.stable, alone.winner) == ("q", None)


def test_a_set_too_small_for_its_margin_is_flagged_with_what_it_can_resolve():
    decision = decide([result("baseline", [1] * 14), result("q", [1] * 14)], Gates())
    drop = gate(decision, "q", "kb/m:drop")
    assert drop.items == 14 and abs(drop.detectable_drop - 4 / 14) < 1e-3
    assert drop.warning and "14 items cannot resolve a 0.050 margin" in drop.warning
    big = decide([result("baseline", [1] * 80), result("q", [1] * 80)], Gates())
    assert gate(big, "q", "kb/m:drop").warning is None


def test_non_critical_set_reports_but_does_not_block():
    spec = GateSpec(critical=False, metrics={"m": MetricGate(min_score=0.0, max_drop=0.05)})
    decision = decide(
        [result("baseline", [1] * 40, spec=spec), result("q", [0] * 40, spec=spec)], Gates()
    )
    drop = gate(decision, "q", "kb/m:drop")
    assert drop.outcome == "fail" and not drop.blocking
    assert decision.winner == "q"


def test_ttft_over_slo_fails():
    slow = result("q", levels=[level(1, 500), level(4, 3500)])
    decision = decide([result("baseline"), slow], Gates(ttft_p95_slo_s=3.0))
    ttft = gate(decision, "q", "ttft_p95")
    assert ttft.outcome == "fail" and ttft.value == 3500
    assert decision.winner is None


def test_error_rate_over_ceiling_fails():
    flaky = result("q", levels=[level(errors=1, requests=8)])
    assert decide([result("baseline"), flaky], Gates(max_error_rate=0.01)).winner is None


def test_failed_candidate_never_wins_even_if_listed_first():
    decision = decide([result("broken", status="failed"), result("baseline"), result("q")], Gates())
    assert decision.winner == "q"
    broken = verdict(decision, "broken")
    assert not broken.eligible and "boom" in broken.gates[0].detail


def test_at_equal_goodput_more_tokens_there_wins_and_ties_go_to_smaller():
    # every level within the SLO: goodput 4 for all, so output tok/s at 4 decides
    a = result("a", levels=[level(1, tps=100), level(4, tps=40)])
    b = result("b", levels=[level(1, tps=10), level(4, tps=60)])
    assert decide([result("baseline"), a, b], Gates()).winner == "b"
    c = result("c", levels=[level(4, tps=60)], size=50)
    assert decide([result("baseline"), b, c], Gates()).winner == "c"


def test_goodput_decides_not_throughput_at_the_top_level():
    # 'fast' serves the most tokens/s at 8 streams, but its ITL p95 breaks the SLO (250 ms)
    # already at 4 streams: it serves 1 stream within the SLO, 'steady' serves 8.
    fast = result(
        "fast",
        levels=[level(1, tps=30), level(4, tps=90, itl_p95=400), level(8, tps=150, itl_p95=600)],
    )
    steady = result("steady", levels=[level(1, tps=25), level(4, tps=70), level(8, tps=110)])
    decision = decide([result("baseline"), fast, steady], Gates())
    assert decision.winner == "steady", decision.summary
    assert verdict(decision, "fast").eligible  # ITL ranks, it does not gate
    assert verdict(decision, "fast").goodput.concurrency == 1
    assert verdict(decision, "fast").goodput.failures == {
        4: "ITL p95 400 ms > 250 ms",
        8: "ITL p95 600 ms > 250 ms",
    }
    assert verdict(decision, "steady").goodput.concurrency == 8
    assert "goodput 8 streams within the SLO, 110.0 output tok/s there" in decision.summary
    assert decision.slo.itl_p95_ms == 250 and decision.slo.ttft_p95_ms == 3000
    # the gates' ITL ceiling is the SLO's: raised, both reach 8 and tokens/s decides
    loose = decide([result("baseline"), fast, steady], Gates(itl_p95_slo_ms=1000))
    assert loose.winner == "fast"


def test_a_level_above_a_missed_one_does_not_count():
    # 'gap' misses the ITL ceiling at 4 streams and meets the SLO again at 8 (noise, or a
    # batch that fills better): its goodput is 1, not 8.
    gap = result("gap", levels=[level(1, tps=20), level(4, tps=80, itl_p95=300), level(8, tps=200)])
    even = result("even", levels=[level(1, tps=20), level(4, tps=60), level(8, tps=90)])
    decision = decide([result("baseline"), gap, even], Gates())
    assert verdict(decision, "gap").goodput.concurrency == 1
    assert decision.winner == "even"


def test_with_no_level_within_the_slo_tokens_at_the_top_level_rank():
    slow = Gates(itl_p95_slo_ms=1)  # nothing meets it
    a = result("a", levels=[level(1, tps=30), level(4, tps=50)])
    b = result("b", levels=[level(1, tps=10), level(4, tps=70)])
    decision = decide([result("baseline"), a, b], slow)
    assert verdict(decision, "a").goodput.concurrency == 0
    assert decision.winner == "b"
    assert "no load level within the SLO; 70.0 output tok/s at the top level" in decision.summary


def test_deploy_targets_are_the_contenders_the_decision_names():
    from pathlib import Path

    from llm_release.config import ServingConfig
    from llm_release.decision.contenders import Contender
    from llm_release.decision.select import deploy_targets
    from llm_release.results import Decision

    serving = ServingConfig(max_model_len=1024)
    contenders = [
        Contender(name="champion", role="champion", scheme="bf16", serving=serving),
        Contender(name="baseline", role="baseline", scheme="bf16", serving=serving),
        Contender(
            name="w4a16",
            role="quantized",
            scheme="W4A16",
            serving=serving.model_copy(update={"max_num_seqs": 3}),
            model_dir=Path("/m/w4a16"),
        ),
    ]

    def targets(stable, winner):
        decision = Decision(winner=winner, stable=stable, rule="r", verdicts=[], summary="s")
        return deploy_targets(decision, contenders, "org/model", "c" * 40, Path("/runs/r1"))

    # A first release: both go out, each with the commit it was built from.
    stable, canary = targets("baseline", "w4a16")
    assert (stable.candidate, stable.scheme, stable.model_dir) == ("baseline", "bf16", None)
    assert (canary.candidate, canary.scheme, canary.model_dir) == (
        "w4a16",
        "W4A16",
        Path("/m/w4a16"),
    )
    assert canary.serving.max_num_seqs == 3 and stable.serving == serving
    assert {(t.repo_id, t.commit, t.run_dir) for t in (stable, canary)} == {
        ("org/model", "c" * 40, Path("/runs/r1"))
    }
    # The champion already serves: only the winner goes out.
    stable, canary = targets("champion", "w4a16")
    assert stable is None and canary.candidate == "w4a16"
    # Nothing passed: nothing goes out; a name no contender carries goes nowhere.
    assert targets("champion", None) == (None, None)
    assert targets(None, "ghost") == (None, None)
