from llm_release.config import Gates
from llm_release.decision.select import decide
from llm_release.reporting.report import render_markdown
from llm_release.results import (
    CandidateResult,
    EvalResult,
    ItemResult,
    LoadLevel,
    LoadResult,
    MetricScore,
)

GATES = {
    "critical": True,
    "confidence": 0.95,
    "metrics": {"numeric_match": {"min_score": 0.0, "max_drop": 0.05}},
    "slices": [{"tag": "safety", "metric": "numeric_match", "min_score": 0.0, "max_drop": 0.0}],
}


def candidate(name, scores, answers):
    items = [
        ItemResult(
            id=f"i{k}",
            tags=["safety"] if k < 2 else ["interval"],
            scores={"numeric_match": s},
            prompt=f"prompt {k}",
            reference=f"{k} bar",
            answer=a,
        )
        for k, (s, a) in enumerate(zip(scores, answers, strict=True))
    ]
    level = LoadLevel(
        concurrency=4,
        requests=8,
        errors=0,
        error_rate=0,
        ttft_p50_ms=100,
        ttft_p95_ms=200,
        itl_p50_ms=30,
        itl_p95_ms=40,
        output_tokens_per_s=50,
        requests_per_s=1,
    )
    return CandidateResult(
        name=name,
        scheme="x",
        status="measured",
        size_bytes=1000,
        evals=[
            EvalResult(
                eval_set="kb",
                version=2,
                num_items=len(items),
                items=items,
                metrics={"numeric_match": MetricScore(value=sum(scores) / 4)},
                gates=GATES,
                decoding={"version": 1},
            )
        ],
        load=LoadResult(levels=[level]),
    )


def test_report_shows_slices_intervals_gates_and_disagreements():
    results = [
        candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"]),
        candidate("w4a16", [0, 1, 1, 0], ["7 bar", "1 bar", "2 bar", "x"]),
    ]
    results[1].load.notes = ["concurrency 4: 3 of 8 requests (stopped by max_seconds_per_level)"]
    decision = decide(results, Gates())
    text = render_markdown(
        title="t",
        source={"repo_id": "a/b", "revision": "main", "commit": "c" * 40},
        results=results,
        decision=decision,
        stage_seconds={"acquire": 1.0},
        deployment=None,
    )
    assert "### kb (version 2, critical, decoding v1, 95% intervals)" in text
    assert "| safety | numeric_match | 1.000 [1.00, 1.00] (n=2) | 0.500, drop +0.500" in text
    assert "| all | numeric_match | 0.750" in text
    assert "w4a16 vs baseline on `numeric_match`: 1 items disagree" in text
    assert "| i0 | prompt 0 | 0 bar | 0 bar (1) | 7 bar (0) |" in text
    # A zero-margin slice fails on one flipped item, however few items it has.
    assert (
        "| kb[safety]/numeric_match:drop vs own unquantized model | FAIL | "
        "own unquantized model | 0.5 |"
    ) in text
    # Four items cannot resolve a 0.05 margin: the gate says so and what they can resolve.
    assert "4 items cannot resolve a 0.050 margin at 95%" in text
    assert "- w4a16, concurrency 4: 3 of 8 requests (stopped by max_seconds_per_level)" in text
    assert "- baseline, concurrency" not in text


def test_the_report_names_the_floor_that_refused_a_first_release():
    gates = GATES | {"metrics": {"numeric_match": {"min_score": 0.5, "max_drop": 0.05}}}
    results = [candidate("baseline", [0, 0, 1, 0], ["x", "y", "2 bar", "z"])]
    results[0].evals[0].gates = gates
    decision = decide(results, Gates())
    assert decision.stable is None
    text = render_markdown(
        title="t",
        source={"repo_id": "a/b", "revision": "main", "commit": "c" * 40},
        results=results,
        decision=decision,
        stage_seconds={"acquire": 1.0},
        deployment=None,
    )
    header = text[: text.index("\n## ")]
    assert (
        "- **Refused by floors (min_score):** baseline: kb/numeric_match 0.250 below floor 0.500"
        in header
    ), header
    assert "| kb/numeric_match:min_score | FAIL | — | 0.25 |" in text
    # A candidate that passes its floors gets no such line.
    results = [candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"])]
    results[0].evals[0].gates = gates
    passed = render_markdown(
        title="t",
        source={"repo_id": "a/b", "revision": "main", "commit": "c" * 40},
        results=results,
        decision=decide(results, Gates()),
        stage_seconds={},
        deployment=None,
    )
    assert "Refused by floors" not in passed


def test_items_table_puts_every_contender_side_by_side():
    from llm_release.reporting.report import items_table

    results = [
        candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"]),
        candidate("w4a16", [0, 1, 1, 0], ["7 bar", "1 bar", "2 bar", "x"]),
    ]
    table = items_table(results)
    assert list(table.columns[:6]) == ["eval_set", "item", "tags", "metric", "baseline", "w4a16"]
    row = table.set_index("item").loc["i0"]
    assert (row["baseline"], row["w4a16"], row["answer:w4a16"]) == (1.0, 0.0, "7 bar")
    assert len(table) == 4


def test_the_load_curve_marks_each_candidates_goodput_against_the_slo():
    def level(concurrency, itl_p95, tps, attainment=None):
        return LoadLevel(
            concurrency=concurrency,
            requests=8,
            errors=0,
            error_rate=0,
            ttft_p50_ms=100,
            ttft_p95_ms=200,
            itl_p50_ms=30,
            itl_p95_ms=itl_p95,
            output_tokens_per_s=tps,
            requests_per_s=1,
            slo_attainment=attainment,
            goodput_rps=0.75 if attainment is not None else None,
        )

    results = [
        candidate("baseline", [1, 1, 1, 1], ["0 bar", "1 bar", "2 bar", "3 bar"]),
        candidate("fast", [1, 1, 1, 1], ["0 bar", "1 bar", "2 bar", "3 bar"]),
        candidate("steady", [1, 1, 1, 1], ["0 bar", "1 bar", "2 bar", "3 bar"]),
    ]
    results[1].load = LoadResult(levels=[level(1, 40, 30, 1.0), level(4, 400, 90, 0.25)])
    results[2].load = LoadResult(levels=[level(1, 40, 25), level(4, 60, 70)])
    decision = decide(results, Gates())
    text = render_markdown(
        title="t",
        source={"repo_id": "a/b", "revision": "main", "commit": "c" * 40},
        results=results,
        decision=decision,
        stage_seconds={"acquire": 1.0},
        deployment=None,
    )
    assert decision.winner == "steady"
    assert "Goodput: the highest concurrency whose TTFT p95 ≤ 3000 ms, ITL p95 ≤ 250 ms" in text
    assert (
        "| fast | 1 | 8 | 0 | 100 | 200 | 30.0 | 40.0 | 30.0 | 100% | 0.75 | **goodput** |" in text
    )
    assert (
        "| fast | 4 | 8 | 0 | 100 | 200 | 30.0 | 400.0 | 90.0 | 25% | 0.75 | missed: ITL p95"
        in text
    )
    assert "| steady | 4 | 8 | 0 | 100 | 200 | 30.0 | 60.0 | 70.0 | — | — | **goodput** |" in text
    assert "| steady | 1 | 8 | 0 | 100 | 200 | 30.0 | 40.0 | 25.0 | — | — | met |" in text
    # the candidates table has the goodput column
    header = next(line for line in text.splitlines() if line.startswith("| verdict |"))
    assert "goodput_streams" in header
