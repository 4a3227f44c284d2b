"""``llm-release history``: each release's chain from the record, its run's report and its
quantization record; a release whose run folder is gone keeps its line and says what is
missing."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import time
from pathlib import Path

from llm_release import registry
from llm_release.canary import rollout
from llm_release.canary.analysis import WindowVerdict
from llm_release.canary.publish import origin_of
from llm_release.canary.rollout import Answer, RolloutOutcome, WindowRecord
from llm_release.cli import main
from llm_release.config import ReleaseConfig, ServingConfig, SourceConfig
from llm_release.decision import decisions, measurements
from llm_release.quantization.quantize import RECORD
from llm_release.registry import RegistryState, Release
from llm_release.reporting import lineage
from llm_release.reporting.report import ReleaseReport
from llm_release.results import (
    CandidateResult,
    CandidateVerdict,
    Decision,
    EvalResult,
    Goodput,
    LoadLevel,
    LoadResult,
    MetricScore,
    Slo,
)


def _release(home, release_id: str, candidate: str, scheme: str, run: str | None) -> Release:
    model = home / "models" / release_id
    model.mkdir(parents=True)
    return Release(
        release_id=release_id,
        candidate=candidate,
        scheme=scheme,
        repo_id="acme/m",
        commit=("a" if candidate == "baseline" else "b") * 40,
        model_dir=str(model),
        public_name="m",
        port=9001,
        log_path=str(home / "log"),
        run_dir=str(home / "runs" / run) if run else None,
        serving=ServingConfig(max_model_len=1024),
    )


def _window(weight: int, verdict: str, reason: str) -> WindowRecord:
    return WindowRecord(
        weight=weight,
        index=1,
        verdict=WindowVerdict(
            service="m",
            prometheus_url="http://127.0.0.1:9",
            started_at=time.time() - 60,
            ended_at=time.time(),
            window_s=60,
            canary_requests=30.0,
            stable_requests=90.0,
            checks=[],
            verdict=verdict,
            reason=reason,
        ),
    )


def _run(home, release: Release) -> None:
    """The run that released ``release`` as a canary, promoted after two windows."""
    run_dir = home / "runs" / "r2"
    run_dir.mkdir(parents=True)
    result = CandidateResult(
        name="w4a16",
        scheme="W4A16_AWQ",
        status="measured",
        evals=[
            EvalResult(
                eval_set="refusal_kb",
                version="3f2a",
                num_items=20,
                metrics={"refusal": MetricScore(value=0.85, ci_low=0.7, ci_high=0.95)},
            )
        ],
    )
    report = ReleaseReport(
        run_id="r2",
        source={"repo_id": "acme/m", "revision": "main", "commit": "b" * 40},
        config=ReleaseConfig(source=SourceConfig(repo_id="acme/m")),
        results=[result],
        decision=Decision(
            winner="w4a16",
            stable="baseline",
            rule="goodput",
            verdicts=[
                CandidateVerdict(
                    name="w4a16",
                    eligible=True,
                    gates=[],
                    goodput=Goodput(concurrency=50, output_tokens_per_s=9000.0),
                )
            ],
            summary="w4a16 goes out: all gates passed, goodput 50",
            reviewed="approved: drop within noise",
        ),
        canary=RolloutOutcome(
            status="promoted",
            release_id=release.release_id,
            reached_weight=100,
            windows=[_window(5, "pass", "all 7 checks passed"), _window(25, "pass", "ok")],
            reason="every step passed",
            answers=[Answer(approve=True, note="ship it", by="person")],
        ),
    )
    (run_dir / "report.json").write_text(report.to_json())
    (home / "models" / release.release_id / RECORD).write_text(
        json.dumps(
            {
                "candidate": {
                    "name": "w4a16",
                    "scheme": "W4A16_AWQ",
                    "group_size": 128,
                    "calibration_set": "manufacturing",
                },
                "calibration_sha256": "c" * 64,
                "cache_key": "9" * 64,
                "files": {"model.safetensors": "e" * 64, "config.json": "f" * 64},
            }
        )
    )


def _record(home) -> None:
    first = _release(home, "baseline-1", "baseline", "unquantized", None)
    second = _release(home, "w4a16-2", "w4a16", "W4A16_AWQ", "r2")
    _run(home, second)
    state = RegistryState(stable=first)
    state.log("stable", release=first.release_id)
    registry.save(state)
    with registry.locked() as current:
        current.canary, current.canary_weight = second, 5
        current.log("canary", release=second.release_id, weight=5)
    with registry.locked() as current:
        current.stable, current.canary, current.canary_weight = second, None, 0
        current.log("promote", release=second.release_id, replaced=first.release_id)
    with registry.locked() as current:  # what canary.publish.publish_release records
        current.log("publish", release=second.release_id, repo="acme/m-w4a16", commit="d" * 40)


def test_history_joins_record_run_and_quantization(home):
    _record(home)
    first, second = lineage.history()
    assert (first.release_id, first.state) == ("baseline-1", "replaced")
    # the first release's run folder is gone: its line stays and says so
    assert first.missing == ["artifact hashes", "scores", "goodput", "decision"]
    assert first.scores == [] and first.artifact_sha256 == {}
    assert [e["event"] for e in first.events] == ["stable", "promote"]
    assert second.state == "stable" and second.upstream_commit == "b" * 40
    assert second.recipe["group_size"] == 128 and second.calibration_set == "manufacturing"
    assert second.calibration_sha256 == "c" * 64 and second.artifact_cache_key == "9" * 64
    assert second.artifact_sha256 == {"model.safetensors": "e" * 64, "config.json": "f" * 64}
    assert not second.origin_recorded  # deployed before the record kept origins: the folder
    (score,) = second.scores
    assert (score.eval_set, score.metric, score.value) == ("refusal_kb", "refusal", 0.85)
    assert (score.ci_low, score.ci_high, score.eval_set_version) == (0.7, 0.95, "3f2a")
    assert (second.goodput, second.goodput_tok_s) == (50, 9000.0)
    assert second.reviewed == "approved: drop within noise"
    assert second.approvals == ["approved by person: ship it"]
    assert second.rollout == "promoted" and [w.weight for w in second.windows] == [5, 25]
    assert [e["event"] for e in second.events] == ["canary", "promote", "publish"]
    assert second.published == "acme/m-w4a16@" + "d" * 40 and first.published is None
    assert lineage.history("other") == []
    # recorded before the record kept measurements, judgements and walks: report.json
    assert second.missing == [] and first.from_report == []
    assert second.from_report == ["scores", "goodput", "decision", "review", "canary walk"]


def test_a_quantized_release_without_its_record_says_so(home):
    release = _release(home, "fp8-1", "fp8", "FP8_DYNAMIC", None)
    state = RegistryState(canary=release, canary_weight=5)
    state.log("canary", release=release.release_id, weight=5)
    registry.save(state)
    (line,) = lineage.history()
    assert line.missing == [
        "quantization record",
        "artifact hashes",
        "scores",
        "goodput",
        "decision",
        "canary walk",
    ]
    assert line.recipe == {} and line.from_report == []


def test_the_cli_prints_the_chain_and_its_json(home, capsys):
    assert main(["history"]) == 0
    assert capsys.readouterr().out.strip() == "no release in the record"
    _record(home)
    assert main(["history", "m", "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["release_id"] for r in records] == ["baseline-1", "w4a16-2"]
    assert records[1]["scores"][0]["ci_low"] == 0.7
    assert main(["history"]) == 0
    text = capsys.readouterr().out
    assert "w4a16-2: w4a16 goes out" in text and "refusal_kb/refusal 0.850 [0.700, 0.950]" in text
    assert "5% window 1: pass" in text and "acme/m@bbbbbbbbbbbb" in text
    assert "published as acme/m-w4a16@dddd" in text


def _level(concurrency: int, ttft_p95_ms: float, tok_s: float) -> LoadLevel:
    return LoadLevel(
        concurrency=concurrency,
        requests=100,
        errors=0,
        error_rate=0.0,
        ttft_p50_ms=ttft_p95_ms / 2,
        ttft_p95_ms=ttft_p95_ms,
        itl_p50_ms=20.0,
        itl_p95_ms=30.0,
        output_tokens_per_s=tok_s,
        requests_per_s=concurrency / 2,
    )


def test_history_reads_the_record_after_the_run_folder_is_gone(home):
    """A release of this pipeline: its origin (recorded at deploy), measurement, judgement,
    walk and approvals are on the record, so its lineage needs neither its run's folder,
    its report nor its model folder."""
    release = _release(home, "w4a16-3", "w4a16", "W4A16_AWQ", "r3")
    model = Path(release.model_dir)
    (model / "model.safetensors").write_bytes(b"weights")
    (model / RECORD).write_text(
        json.dumps(
            {
                "candidate": {"name": "w4a16", "scheme": "W4A16_AWQ", "group_size": 64},
                "calibration_sha256": "c" * 64,
                "cache_key": "9" * 64,
            }
        )
    )
    # What deploy records (promote._start_release): the record lists no files, so they are
    # hashed once, the quantization record itself left out.
    release.origin = origin_of(model, release.scheme, hash_missing=True)
    assert release.origin.files == {"model.safetensors": hashlib.sha256(b"weights").hexdigest()}
    run_dir = home / "runs" / "r3"
    run_dir.mkdir(parents=True)
    state = RegistryState(canary=release, canary_weight=5)
    state.log("canary", release=release.release_id, weight=5)
    registry.save(state)
    measured = CandidateResult(
        name="w4a16",
        scheme="W4A16_AWQ",
        status="measured",
        fingerprint="f" * 64,
        evals=[
            EvalResult(
                eval_set="refusal_kb",
                version=3,
                sha256="5" * 64,
                num_items=20,
                metrics={"refusal": MetricScore(value=0.85, ci_low=0.7, ci_high=0.95)},
            )
        ],
        load=LoadResult(
            # 32 streams break the TTFT objective: goodput is 16, at its 900 tok/s
            levels=[_level(1, 200, 80.0), _level(16, 900, 900.0), _level(32, 4000, 1500.0)],
            slo=Slo(ttft_p95_ms=3000, itl_p95_ms=200, max_error_rate=0.01),
        ),
    )
    measurements.save(measured, "r3")
    measurements.save(measured.model_copy(update={"fingerprint": "e" * 64}), "another-run")
    config = ReleaseConfig(source=SourceConfig(repo_id="acme/m"))
    decisions.record(
        config, release.commit, "promoted", "w4a16 goes out", "r3", approved_by="drop in noise"
    )
    steps = [5, 100]
    rollout.record(release.release_id, steps, 5, "warming up")
    for index, outcome in enumerate(["pass", "pass"], start=1):
        window = _window(5, outcome, f"window {index} passed")
        window.index = window.verdict.started_at = index  # distinct windows
        rollout.record(release.release_id, steps, 5, "analysing", last=window)
    rollout.record_answer(
        release.release_id, "promote", 5, Answer(approve=True, note="ship it", by="person")
    )
    rollout.record(release.release_id, steps, 100, "promoted")
    run_dir.rmdir()  # the worker's disk is gone
    shutil.rmtree(model)

    (line,) = lineage.history()
    (score,) = line.scores
    assert (score.value, score.ci_low, score.ci_high, score.eval_set_version) == (
        0.85,
        0.7,
        0.95,
        "3",
    )
    assert (line.goodput, line.goodput_tok_s) == (16, 900.0)
    assert (line.decision, line.reviewed) == ("w4a16 goes out", "drop in noise")
    assert line.rollout == "promoted"
    assert [(w.weight, w.index, w.verdict) for w in line.windows] == [
        (5, 1, "pass"),
        (5, 2, "pass"),
    ]
    assert [(s.weight, s.outcome, len(s.windows)) for s in line.steps] == [
        (5, "cleared", 2),
        (100, "promoted", 0),
    ]
    assert score.eval_set_sha256 == "5" * 64
    assert line.approvals == ["approved by person: ship it"]
    assert line.origin_recorded and line.recipe == {"scheme": "W4A16_AWQ", "group_size": 64}
    assert (line.calibration_sha256, line.artifact_cache_key) == ("c" * 64, "9" * 64)
    assert line.artifact_sha256 == release.origin.files
    assert line.missing == [] and line.from_report == []


def test_origin_of_an_upstream_folder_is_its_verified_download(home):
    # The hub's manifest beside the folder (hub.acquire) lists what the download verified.
    model = home / "models" / ("a" * 40)
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    manifest = model.with_name(model.name + ".manifest.json")
    manifest.write_text(
        json.dumps({"files": [{"path": "config.json", "sha256": "9" * 64, "size": 2}]})
    )
    origin = origin_of(model, "unquantized", hash_missing=True)
    assert origin.files == {"config.json": "9" * 64} and origin.recipe == {}
    assert origin.cache_key is None and origin.calibration_set is None
    # No manifest: hashed only when asked (deploy), never by 'history' on a big folder.
    manifest.unlink()
    assert origin_of(model, "unquantized").files == {}
    sha = hashlib.sha256(b"{}").hexdigest()
    assert origin_of(model, "unquantized", hash_missing=True).files == {"config.json": sha}


def test_origin_of_a_hostile_quantization_record_is_empty_not_an_error(home):
    model = home / "models" / "x"
    model.mkdir(parents=True)
    for text in ("[1, 2]", '{"candidate": "fp8", "files": ["a"]}', "{not json"):
        (model / RECORD).write_text(text)
        origin = origin_of(model, "FP8_DYNAMIC")
        assert (origin.recipe, origin.files, origin.cache_key) == ({}, {}, None)
    # A hostile download manifest beside the folder lists nothing either.
    manifest = model.with_name(model.name + ".manifest.json")
    for text in ('{"files": "all"}', '{"files": [{"path": "a"}]}', "[]", "{not json"):
        manifest.write_text(text)
        assert origin_of(model, "FP8_DYNAMIC").files == {}


HOSTILE = "x\x1b]0;owned\x07\x1b[2J|y\nz\u202ew\x9b1m\\"


def test_history_prints_the_records_text_inert():
    """Text from the record (anyone with its URL writes it) reaches the terminal with its
    escapes, controls, bidi overrides and line breaks escaped, and '|' cannot add a cell."""
    line = lineage.ReleaseLineage(
        release_id="w4a16-9",
        service="m",
        state=f"stable{HOSTILE}",
        started_at="2026-12-04T00:00:00Z",
        upstream_repo=f"acme/{HOSTILE}",
        upstream_commit="b" * 40,
        candidate="w4a16",
        scheme=HOSTILE,
        decision=f"goes out{HOSTILE}",
        rollout=HOSTILE,
        missing=[HOSTILE],
        published=HOSTILE,
        approvals=[f"approved by {HOSTILE}"],
        scores=[lineage.Score(eval_set=HOSTILE, metric=HOSTILE, value=0.5)],
        steps=[
            lineage.Step(
                weight=5,
                entered_at=HOSTILE,
                outcome=HOSTILE,
                windows=[lineage.Window(weight=5, index=1, verdict=HOSTILE, reason=HOSTILE)],
            )
        ],
    )
    text = lineage.to_markdown([line])
    assert not any(ch in text for ch in "\x1b\x07\x9b\u202e")
    assert all(ch == "\n" or ch.isprintable() for ch in text)
    assert "\\x1b]0;owned\\x07\\x1b[2J\\|y\\nz\\u202ew\\x9b1m\\\\" in text
    table = [row for row in text.splitlines() if row.startswith("|")]
    assert len(table) == 3  # header, rule, one release: the '\n' split no row
    for row in table:  # 7 cells: 8 pipes not preceded by a backslash
        assert len(re.findall(r"(?<!\\)\|", row)) == 8, row
    # Each release's lines stay its own: the hostile '\n' starts no line of its own.
    assert not any(row.startswith(("z", "y")) for row in text.splitlines())
    # --json escapes them as JSON does.
    assert "\x1b" not in lineage.to_json([line])
