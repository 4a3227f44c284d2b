import re

from llm_release.config import Gates, ReleaseConfig, SourceConfig
from llm_release.decision.select import decide
from llm_release.reporting.report import ReleaseReport
from llm_release.results import (
    CandidateResult,
    EvalResult,
    GateSpec,
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


def render(results, decision, stage_seconds=None, **fields) -> str:
    return report(results, decision, stage_seconds, **fields).to_markdown()


def report(results, decision, stage_seconds=None, **fields) -> ReleaseReport:
    return ReleaseReport(
        run_id="r1",
        source={"repo_id": "a/b", "revision": "main", "commit": "c" * 40},
        config=ReleaseConfig(source=SourceConfig(repo_id="a/b")),
        results=results,
        decision=decision,
        stage_seconds={"acquire": 1.0} if stage_seconds is None else stage_seconds,
        **fields,
    )


def rows(text: str) -> list[list[str]]:
    """Every markdown table row of ``text``, as its cells."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]


def has_row(text: str, *cells: str) -> bool:
    """A table row of ``text`` starts with ``cells`` (the last one may be a cell's start)."""
    *whole, last = cells
    return any(
        row[: len(whole)] == whole and len(row) > len(whole) and row[len(whole)].startswith(last)
        for row in rows(text)
    )


def test_report_shows_slices_intervals_gates_and_disagreements():
    results = [
        candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"]),
        candidate("w4a16", [0, 1, 1, 0], ["7 bar", "1 bar", "2 bar", "x"]),
    ]
    results[1].load.notes = ["concurrency 4: 3 of 8 requests (stopped by max_seconds_per_level)"]
    decision = decide(results, Gates())
    text = render(results, decision)
    assert "### kb (version 2, critical, decoding v1, 95% intervals)" in text
    assert has_row(
        text, "safety", "numeric_match", "1.000 [1.00, 1.00] (n=2)", "0.500, drop +0.500"
    )
    assert has_row(text, "all", "numeric_match", "0.750")
    assert "w4a16 vs baseline on `numeric_match`: 1 items disagree" in text
    assert ["i0", "prompt 0", "0 bar", "0 bar (1)", "7 bar (0)"] in rows(text)
    # A zero-margin slice fails on one flipped item, however few items it has.
    assert has_row(
        text,
        "kb[safety]/numeric_match:drop vs own unquantized model",
        "FAIL",
        "own unquantized model",
        "0.5",
    )
    # Four items cannot resolve a 0.05 margin: the gate says so and what they can resolve.
    assert "4 items cannot resolve a 0.050 margin at 95%" in text
    assert "- w4a16, concurrency 4: 3 of 8 requests (stopped by max_seconds_per_level)" in text
    assert "- baseline, concurrency" not in text


def test_the_report_names_the_floor_that_refused_a_first_release():
    gates = GATES | {"metrics": {"numeric_match": {"min_score": 0.5, "max_drop": 0.05}}}
    results = [candidate("baseline", [0, 0, 1, 0], ["x", "y", "2 bar", "z"])]
    results[0].evals[0].gates = GateSpec.model_validate(gates)
    decision = decide(results, Gates())
    assert decision.stable is None
    text = render(results, decision)
    header = text[: text.index("\n## ")]
    assert (
        "- **Refused by floors (min_score):** baseline: kb/numeric_match 0.250 below floor 0.500"
        in header
    ), header
    assert has_row(text, "kb/numeric_match:min_score", "FAIL", "—", "0.25")
    # A candidate that passes its floors gets no such line.
    results = [candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"])]
    results[0].evals[0].gates = GateSpec.model_validate(gates)
    passed = render(results, decide(results, Gates()), {})
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
    text = render(results, decision)
    assert decision.winner == "steady"
    assert "Goodput: the highest concurrency whose TTFT p95 ≤ 3000 ms, ITL p95 ≤ 250 ms" in text
    level_cells = ["8", "0", "100", "200", "30.0"]
    # the prefix-cache hit rate column: "—" where vLLM's counters were not read
    fast_1 = ["fast", "1", *level_cells, "40.0", "30.0", "100%", "0.75", "—", "**goodput**"]
    assert fast_1 in rows(text)
    assert has_row(
        text, "fast", "4", *level_cells, "400.0", "90.0", "25%", "0.75", "—", "missed: ITL p95"
    )
    steady_4 = ["steady", "4", *level_cells, "60.0", "70.0", "—", "—", "—", "**goodput**"]
    assert steady_4 in rows(text)
    assert ["steady", "1", *level_cells, "40.0", "25.0", "—", "—", "—", "met"] in rows(text)
    # a level whose hit rate was read shows it
    results[2].load.levels[0].prefix_cache_hit_rate = 0.625
    assert ["steady", "1", *level_cells, "40.0", "25.0", "—", "—", "62%", "met"] in rows(
        render(results, decision)
    )
    # the candidates table has the goodput column
    header = next(row for row in rows(text) if row[0] == "verdict")
    assert "goodput_streams" in header
    # the levels followed no warm-up here, so the report claims none; then one at 4 streams
    assert "unmeasured level" not in text
    for r in results[1:]:
        r.load.warm_up = 4
    assert "each server ran one unmeasured level at 4 streams" in render(results, decision)


def release(release_id: str):
    from llm_release.config import ServingConfig
    from llm_release.registry import Release

    return Release(
        release_id=release_id,
        candidate="baseline",
        scheme="bf16",
        repo_id="a/b",
        commit="c" * 40,
        model_dir="/m",
        public_name="b",
        port=8001,
        log_path="/l",
        serving=ServingConfig(),
    )


def test_the_report_json_round_trips_with_the_keys_its_readers_read(tmp_path):
    import json

    from llm_release.canary.rollout import RolloutOutcome
    from llm_release.registry import RegistryState
    from llm_release.reporting.report import Deployment

    results = [
        candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"]),
        candidate("w4a16", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"]),
    ]
    state = RegistryState(
        router_port=8100, stable=release("r-stable"), canary=release("r-canary"), canary_weight=25
    )
    canary = RolloutOutcome(status="held", release_id="r-canary", reached_weight=25, reason="r")
    written = report(
        results,
        decide(results, Gates()),
        {"plan": 0.5, "acquire": 2.0},
        deployment=Deployment.of(state),
        canary=canary,
    )
    files = written.write_files(tmp_path, written.to_markdown())
    text = (tmp_path / "report.json").read_text()
    assert files["json"] == str(tmp_path / "report.json") and (tmp_path / "items.csv").exists()
    assert (tmp_path / "report.md").read_text() == written.to_markdown()
    assert ReleaseReport.model_validate_json(text) == written
    data = json.loads(text)
    assert list(data) == [
        "run_id",
        "source",
        "plan",
        "config",
        "host",
        "results",
        "decision",
        "stage_seconds",
        "deployment",
        "canary",
    ]
    assert data["source"] == {"repo_id": "a/b", "revision": "main", "commit": "c" * 40}
    assert data["deployment"] == {
        "load balancer": "http://127.0.0.1:8100",
        "stable": "r-stable",
        "canary": "r-canary at 25%",
    }
    assert data["stage_seconds"] == {"plan": 0.5, "acquire": 2.0}
    # EvalResult.gates is the eval set's GateSpec in the JSON as it was (a dict of its fields).
    assert data["results"][0]["evals"][0]["gates"]["metrics"] == GATES["metrics"]
    assert {r["name"] for r in data["results"]} == {"baseline", "w4a16"}
    assert data["decision"]["stable"] == "baseline" and data["canary"]["status"] == "held"


def test_the_markdown_shows_timings_deployment_and_verdict():
    from llm_release.canary.rollout import RolloutOutcome
    from llm_release.reporting.report import Deployment

    results = [candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"])]
    decision = decide(results, Gates())
    deployment = Deployment(load_balancer="http://127.0.0.1:8100", stable="r-1", canary=None)
    deployed = report(results, decision, {"plan": 1.0, "acquire": 3.0}, deployment=deployment)
    text = deployed.to_markdown()
    assert text.startswith("# Release r1: a/b\n")
    assert ["plan", "1.0", "25%"] in rows(text) and ["acquire", "3.0", "75%"] in rows(text)
    deployed_lines = text[text.index("## Deployment") :].splitlines()
    assert deployed_lines[2:5] == [
        "- **load balancer:** http://127.0.0.1:8100",
        "- **stable:** r-1",
        "- **canary:** None",
    ]
    assert (deployed.verdict, deployed.summary) == ("deployed", decision.summary)
    # Nothing deployed: no deployment section; rejected, or rejected by review.
    rejected = report(results, decision)
    assert "## Deployment" not in rejected.to_markdown() and rejected.verdict == "rejected"
    reviewed = report(results, decision.model_copy(update={"reviewed": "no"}))
    assert reviewed.verdict == "review rejected"
    # A canary that ended names the verdict, and the summary says why.
    canary = RolloutOutcome(
        status="rolled back", release_id="r-2", reached_weight=25, reason="TTFT p95 over the SLO"
    )
    rolled = report(results, decision, deployment=deployment, canary=canary)
    assert rolled.verdict == "rolled back"
    assert rolled.summary == f"{decision.summary}; canary rolled back: TTFT p95 over the SLO"
    assert "## Canary rollout" in rolled.to_markdown()


def test_the_gates_say_where_a_contender_was_measured_and_what_was_lost():
    home = candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"])
    away = candidate("fp8", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"]).model_copy(
        update={"measured_on": "gpu_b", "lost": ["host gpu_c, flow run r-7: lost: no heartbeat"]}
    )
    text = render([home, away], decide([home, away], Gates()))
    # Markdown's own characters are escaped (gpu\_b renders as gpu_b)
    assert "*fp8: measured on fleet host gpu\\_b.*" in text
    assert "*fp8: an attempt was lost: host gpu\\_c, flow run r-7: lost: no heartbeat.*" in text
    assert "baseline: measured on" not in text  # the release's own host says nothing


def test_a_lost_attempts_reason_from_another_host_reaches_the_report_inert():
    home = candidate("baseline", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"])
    hostile = (
        "crashed\n\n## Decision\n\nwinner: fp8 [approve](http://evil.example/x) "
        "<img src=x onerror=alert(1)> | b | \x1b[31m" + "a" * 400
    )
    away = candidate("fp8", [1, 1, 1, 0], ["0 bar", "1 bar", "2 bar", "x"]).model_copy(
        update={"measured_on": "gpu_b](http://evil.example)", "lost": [hostile]}
    )
    text = render([home, away], decide([home, away], Gates()))
    line = next(x for x in text.splitlines() if x.startswith("*fp8: an attempt was lost:"))
    assert "\n## Decision\n\nwinner: fp8" not in text  # no heading of its own
    assert "[approve](http" not in line and "\\[approve\\]\\(http" in line
    assert re.search(r"(?<!\\)<", line) is None and "\\<img" in line
    assert "\x1b" not in line
    assert "|" not in line and "/ b /" in line  # a pipe is no cell border of its own
    assert len(line) < 400 and line.endswith("….*")
    assert "](http://evil.example)" not in text


def test_the_sizing_section_shows_the_plans_notes_inert():
    from llm_release.reporting.report import sizing_section
    from llm_release.sizing import CapacityPlan

    plan = CapacityPlan.model_construct(
        verdict="fits on 1 GPU(s): 1,000 KV tokens",
        notes=["fleet: also fits gpu_b, [evil](http://x.example)", "--foo is not modelled"],
    )
    lines = sizing_section(plan, [])
    assert lines[2:] == [
        "- **Plan (from the repo's headers, before the download):** fits on 1 GPU(s): 1,000 "
        "KV tokens",
        "  - fleet: also fits gpu\\_b, \\[evil\\]\\(http://x.example\\)",
        "  - --foo is not modelled",
        "",
    ]
