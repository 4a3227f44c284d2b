"""The canary's quality check: the probe set, the slices' verdicts and the window's."""

import numpy as np
import pytest

from llm_release.canary import analysis, quality
from llm_release.canary.analysis import CheckResult, WindowVerdict, with_quality
from llm_release.canary.quality import ProbeRun
from llm_release.errors import EvalError

GOOD_REFUSAL = "The passage does not state it."
INVENTED = "It is 42 N·m [KB-9999]."


@pytest.fixture(scope="module")
def probe_set():
    # The project's eval sets: manufacturing_kb (3 metrics and a safety slice), refusal_kb.
    return quality.build_probe_set("release-a", items_per_set=8, min_per_slice=6)


def reference(item) -> str:
    """An answer every metric of the item's set scores 1 (its reference with the citation)."""
    if item.eval_set == "refusal_kb":
        return GOOD_REFUSAL
    return f"{item.doc['answer']} [{item.doc['passage_id']}]"


def run(probe_set, canary=reference, stable=reference) -> ProbeRun:
    answers = {
        "canary": {i.key: canary(i) for i in probe_set.items},
        "stable": {i.key: stable(i) for i in probe_set.items},
    }
    answered = {r: sum(a is not None for a in v.values()) for r, v in answers.items()}
    sent = {r: len(probe_set.items) for r in answers}
    return ProbeRun(sent=sent, answered=answered, answers=answers)


def by_slice(scores):
    return {s.slice: s for s in scores}


def test_the_probe_set_is_fixed_per_release_and_bounded(probe_set):
    again = quality.build_probe_set("release-a", items_per_set=8, min_per_slice=6)
    other = quality.build_probe_set("release-b", items_per_set=8, min_per_slice=6)
    assert again == probe_set
    assert [i.key for i in other.items] != [i.key for i in probe_set.items]
    per_set = {
        s: sum(i.eval_set == s for i in probe_set.items) for s in ("manufacturing_kb", "refusal_kb")
    }
    assert per_set == {"manufacturing_kb": 8, "refusal_kb": 8}
    # The safety slice gets its minimum first, so it can be judged.
    safety = [i for i in probe_set.items if i.eval_set == "manufacturing_kb" and "safety" in i.tags]
    assert len(safety) >= 6
    # The set's own prompt, as the offline evaluation renders it.
    item = probe_set.items[0]
    assert (
        item.messages[-1]["role"] == "user"
        and item.doc["passage_id"] in item.messages[-1]["content"]
    )
    assert probe_set.decoding["temperature"] == 0.0
    names = {s.name for s in probe_set.slices}
    assert "quality manufacturing_kb[safety] numeric_match" in names
    assert "quality refusal_kb refusal" in names


def test_sample_takes_every_item_when_fewer_and_tags_first():
    items = [{"id": str(i), "tags": ["x"] if i >= 8 else []} for i in range(10)]
    rng = np.random.default_rng(1)
    chosen = quality.sample(items, 3, tags=["x"], min_per_tag=2, rng=rng)
    assert len(chosen) == 3 and sum("x" in i["tags"] for i in chosen) >= 2
    assert len(quality.sample(items, 50, tags=[], min_per_tag=2, rng=rng)) == 10


def test_no_critical_set_is_an_error():
    with pytest.raises(EvalError, match="no critical eval set"):
        quality.build_probe_set("r", items_per_set=4, min_per_slice=2, names=[])


def test_a_canary_answering_like_the_stable_passes(probe_set):
    scores = quality.judge(probe_set, run(probe_set), min_items=6)
    assert {s.outcome for s in scores} == {"pass"}
    refusal = by_slice(scores)["quality refusal_kb refusal"]
    assert refusal.canary == refusal.stable == 1.0 and refusal.drop == 0.0
    assert refusal.answered == 8


def test_a_canary_that_stopped_refusing_fails_with_its_numbers(probe_set):
    def broken(item):
        return INVENTED if item.eval_set == "refusal_kb" else reference(item)

    scores = by_slice(quality.judge(probe_set, run(probe_set, canary=broken), min_items=6))
    refusal = scores["quality refusal_kb refusal"]
    assert refusal.outcome == "fail"
    assert (refusal.canary, refusal.stable, refusal.drop) == (0.0, 1.0, 1.0)
    assert refusal.ci_low > refusal.max_drop == 0.10
    assert "canary 0.000, stable 1.000 on 8 items" in refusal.reason
    assert "margin 0.1" in refusal.reason
    assert scores["quality manufacturing_kb numeric_match"].outcome == "pass"


def test_a_drop_beyond_the_margin_within_noise_is_inconclusive_never_a_pass(probe_set):
    # One refusal item of eight lost: 0.125 > 0.10 but its interval reaches 0: not a fail,
    # and not a pass either (the same item is lost again in every window).
    lost = [i.key for i in probe_set.items if i.eval_set == "refusal_kb"][0]

    def one_worse(item):
        return INVENTED if item.key == lost else reference(item)

    refusal = by_slice(quality.judge(probe_set, run(probe_set, canary=one_worse), min_items=6))[
        "quality refusal_kb refusal"
    ]
    assert refusal.outcome == "inconclusive" and refusal.drop == pytest.approx(0.125)
    assert refusal.ci_low <= 0
    assert "exceeds the margin 0.1, but its interval reaches 0" in refusal.reason


def test_a_drop_within_the_margin_passes(probe_set):
    # The margin widened to 0.2: one lost item of eight (0.125) is within it.
    lost = [i.key for i in probe_set.items if i.eval_set == "refusal_kb"][0]
    wide = probe_set.model_copy(
        update={
            "slices": [
                s.model_copy(update={"max_drop": 0.2}) if s.eval_set == "refusal_kb" else s
                for s in probe_set.slices
            ]
        }
    )

    def one_worse(item):
        return INVENTED if item.key == lost else reference(item)

    refusal = by_slice(quality.judge(wide, run(wide, canary=one_worse), min_items=6))[
        "quality refusal_kb refusal"
    ]
    assert refusal.outcome == "pass" and refusal.drop == pytest.approx(0.125)
    assert "within the margin 0.2" in refusal.reason


def test_a_better_canary_passes(probe_set):
    def worse(item):
        return INVENTED

    scores = quality.judge(probe_set, run(probe_set, stable=worse), min_items=6)
    assert {s.outcome for s in scores} == {"pass"}


def test_too_few_answers_are_inconclusive(probe_set):
    refusal_keys = [i.key for i in probe_set.items if i.eval_set == "refusal_kb"]

    def half_unanswered(item):
        return None if item.key in refusal_keys[:4] else reference(item)

    scores = by_slice(quality.judge(probe_set, run(probe_set, canary=half_unanswered), min_items=6))
    refusal = scores["quality refusal_kb refusal"]
    assert refusal.outcome == "inconclusive" and refusal.answered == 4
    assert "4 of 8 items answered by both; at least 6 needed" in refusal.reason
    assert scores["quality manufacturing_kb cites_source"].outcome == "pass"


def verdict(outcome="pass", reason="all 6 checks passed on 30 requests") -> WindowVerdict:
    check = CheckResult(
        name="ttft_p95_s", canary=1.0, stable=1.0, rule="r", outcome=outcome, reason="x"
    )
    return WindowVerdict(
        service="tiny",
        prometheus_url="http://127.0.0.1:9",
        started_at=0.0,
        ended_at=60.0,
        window_s=60,
        canary_requests=30.0,
        stable_requests=90.0,
        checks=[check],
        verdict=outcome,
        reason=reason,
    )


def test_a_failing_quality_check_fails_a_fast_window(probe_set):
    def broken(item):
        return INVENTED

    probes = run(probe_set, canary=broken)
    scores = quality.judge(probe_set, probes, min_items=6)
    out = with_quality(verdict("pass"), scores, probes)
    assert out.verdict == "fail"
    assert "quality refusal_kb refusal: canary 0.000, stable 1.000" in out.reason
    failing = [c for c in out.checks if c.outcome == "fail"]
    assert {c.name for c in failing} >= {"quality refusal_kb refusal"}
    assert all(c.canary is not None and c.stable is not None for c in failing)
    assert out.quality == scores
    # The counts stay in the verdict, the answers do not.
    assert out.probes.sent == {"canary": 16, "stable": 16} and out.probes.answers == {}


def test_quality_keeps_a_latency_failure_and_opens_a_pass(probe_set):
    probes = run(probe_set)
    scores = quality.judge(probe_set, probes, min_items=6)
    failed = with_quality(verdict("fail", "ttft_p95_s: slow"), scores, probes)
    assert failed.verdict == "fail" and failed.reason == "ttft_p95_s: slow"
    passed = with_quality(verdict("pass"), scores, probes)
    assert passed.verdict == "pass" and passed.reason.endswith("5 quality slices passed")
    thin = quality.judge(probe_set, probes, min_items=9)
    assert with_quality(verdict("pass"), thin, probes).verdict == "inconclusive"


def test_probes_that_could_not_run_never_pass():
    out = analysis.probe_window(verdict("pass"), None, None, why_not="no critical eval set")
    assert out.verdict == "inconclusive"
    assert out.checks[-1].name == "quality" and "no critical eval set" in out.reason
