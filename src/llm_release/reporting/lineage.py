"""Where each release came from and why it was chosen: one record per release, joined from
the release record — the release (``registry.releases``: repo, commit, folder, state), its
candidate's measurement in its run (scores with intervals, goodput; ``measurements``), the
run's judgement (the decision, the review's verdict; ``decisions``), the canary's walk
(steps, analysis windows, and the approvals among the registry's events;
``rollout.recorded_walk``) and the registry's history (deploy, promote, rollback, publish
events) — and the release's origin, recorded at deploy (recipe, calibration fingerprint,
cache key, each file's SHA-256; ``registry.Origin``; a release deployed before the record
kept it: read from its folder while the folder is there). ``llm-release history [SERVICE]
[--json]`` prints it.

The record survives the worker's disk: the run's ``report.json`` is read only for what a
release recorded before the record kept it lacks (named in ``from_report``). What neither
holds is ``None`` and named in ``missing``, never guessed.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tabulate import tabulate

from llm_release import paths, registry
from llm_release.canary import rollout
from llm_release.canary.publish import origin_of
from llm_release.canary.rollout import Answer, WindowRecord
from llm_release.config import Scheme
from llm_release.decision import decisions, measurements
from llm_release.load.loadtest import goodput
from llm_release.registry import Origin
from llm_release.reporting.report import ReleaseReport
from llm_release.results import CandidateResult


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Score(Record):
    eval_set: str
    metric: str
    value: float
    ci_low: float | None = None
    ci_high: float | None = None
    eval_set_version: str | None = Field(None, description="the eval set's declared version")
    eval_set_sha256: str | None = Field(
        None, description="the eval set's fingerprint when evaluated (its files' hashes)"
    )


class Window(Record):
    weight: int
    index: int
    verdict: str
    reason: str


class Step(Record):
    weight: int
    entered_at: str
    outcome: str | None = Field(None, description="cleared, or the walk's end; None: open")
    windows: list[Window] = Field(default_factory=list)


class ReleaseLineage(Record):
    release_id: str
    service: str
    state: str = Field(description="stable, canary, replaced, rolled back, stopped")
    started_at: str
    upstream_repo: str
    upstream_commit: str
    candidate: str
    scheme: str
    run_id: str | None = None
    recipe: dict = Field(default_factory=dict)
    calibration_set: str | None = None
    calibration_sha256: str | None = None
    artifact_cache_key: str | None = Field(None, description="the quantization's content hash")
    artifact_sha256: dict[str, str] = Field(
        default_factory=dict, description="each file of the served folder -> its SHA-256"
    )
    origin_recorded: bool = Field(
        False,
        description="recipe, calibration and hashes come from the record (False: read from "
        "the folder, a release deployed before the record kept them)",
    )
    scores: list[Score] = Field(default_factory=list)
    goodput: int | None = Field(None, description="concurrent streams within the SLO")
    goodput_tok_s: float | None = None
    decision: str | None = None
    reviewed: str | None = Field(None, description="the reviewer's verdict, when one was asked")
    approvals: list[str] = Field(
        default_factory=list, description="who approved each rollout question, and how"
    )
    rollout: str | None = Field(None, description="the canary's end: promoted, rolled back")
    steps: list[Step] = Field(default_factory=list, description="each rollout step, its windows")
    windows: list[Window] = Field(default_factory=list)
    published: str | None = Field(None, description="repo@commit on the publish hub")
    events: list[dict] = Field(default_factory=list, description="the registry's events")
    missing: list[str] = Field(
        default_factory=list,
        description="what neither the record nor the run's report holds: quantization "
        "record, artifact hashes, scores, goodput, decision, canary walk",
    )
    from_report: list[str] = Field(
        default_factory=list,
        description="what was read from the run's report.json, not the record (a release "
        "recorded before the record kept it)",
    )


def _report(run_dir: Path | None) -> ReleaseReport | None:
    if run_dir is None:
        return None
    try:
        return ReleaseReport.model_validate_json((run_dir / "report.json").read_text())
    except (OSError, ValueError, ValidationError):
        return None


def _scores(result: CandidateResult) -> list[Score]:
    return [
        Score(
            eval_set=ev.eval_set,
            metric=name,
            value=m.value,
            ci_low=m.ci_low,
            ci_high=m.ci_high,
            eval_set_version=None if ev.version is None else str(ev.version),
            eval_set_sha256=ev.sha256,
        )
        for ev in result.evals
        for name, m in ev.metrics.items()
    ]


def _windows(records: list[WindowRecord]) -> list[Window]:
    return [
        Window(weight=w.weight, index=w.index, verdict=w.verdict.verdict, reason=w.verdict.reason)
        for w in records
    ]


def _approvals(answers: list[Answer]) -> list[str]:
    return [f"{'approved' if a.approve else 'refused'} by {a.by}: {a.note}" for a in answers]


def _measured(line: ReleaseLineage, release: registry.Release, report: ReleaseReport | None):
    """Scores and goodput: the record's measurement of the candidate in its run, else the
    run's report."""
    measured = measurements.of_run(line.run_id, release.candidate) if line.run_id else None
    if measured is not None:
        line.scores = _scores(measured)
        if measured.load is not None and measured.load.slo is not None:
            # What the decision ranked by: the SLO the run measured against (its gates').
            good = goodput(measured.load.levels, measured.load.slo)
            line.goodput, line.goodput_tok_s = good.concurrency, good.output_tokens_per_s
    if report is not None:
        if measured is None:
            for result in report.results:
                if result.name == release.candidate:
                    line.scores = _scores(result)
                    line.from_report.append("scores")
        if line.goodput is None:
            for verdict in report.decision.verdicts:
                if verdict.name == release.candidate and verdict.goodput is not None:
                    line.goodput = verdict.goodput.concurrency
                    line.goodput_tok_s = verdict.goodput.output_tokens_per_s
                    line.from_report.append("goodput")
    if measured is None and "scores" not in line.from_report:
        line.missing.append("scores")
    if line.goodput is None:
        line.missing.append("goodput")


def _decided(line: ReleaseLineage, release: registry.Release, report: ReleaseReport | None):
    """The decision and the review's verdict: the record's judgement of the run, else the
    run's report."""
    judged = decisions.of_run(line.run_id, release.commit) if line.run_id else None
    if judged is not None:
        line.decision, line.reviewed = judged.summary, judged.approved_by
    if report is not None:
        if judged is None:
            line.decision = report.decision.summary
            line.from_report.append("decision")
        if line.reviewed is None and report.decision.reviewed is not None:
            line.reviewed = report.decision.reviewed  # judged before the record kept it
            line.from_report.append("review")
    if line.decision is None:
        line.missing.append("decision")


def _walked(
    line: ReleaseLineage, release: registry.Release, report: ReleaseReport | None, events
) -> None:
    """The canary's walk (its end, windows, approvals): the record's steps, windows and
    approval events, else the run's report."""
    try:
        walk = rollout.recorded_walk(release.release_id, events)
    except ValidationError:
        walk = None  # unreadable rows: the report, or missing, never a guess
    if walk is not None and walk.steps:
        line.rollout = walk.state
        line.steps = [
            Step(
                weight=step.weight,
                entered_at=step.entered_at,
                outcome=step.outcome,
                windows=_windows(step.windows),
            )
            for step in walk.steps
        ]
        line.windows = _windows(walk.windows)
        line.approvals = _approvals(walk.answers)
        return
    if report is not None and report.canary is not None:
        if report.canary.release_id == release.release_id:
            line.rollout = report.canary.status
            line.windows = _windows(report.canary.windows)
            line.approvals = _approvals(report.canary.answers)
            line.from_report.append("canary walk")
            return
    if walk is not None:
        line.rollout = walk.state  # the walk's status, recorded before its steps were
    if any(e.get("event") == "canary" for e in line.events):
        line.missing.append("canary walk")


def lineage(release: registry.Release, state: str, history: list[dict]) -> ReleaseLineage:
    """One release's chain, from the record (its release, measurement, judgement, walk and
    events) and its quantization record; its run's ``report.json`` for what a release
    recorded before the record kept it lacks."""
    # Recorded at deploy; a release deployed before the record kept it: its folder, read once
    folder = paths.own_model_folder(release.model_dir)  # the record's path: confined
    origin = release.origin or (origin_of(folder, release.scheme) if folder else Origin())
    line = ReleaseLineage(
        release_id=release.release_id,
        service=release.public_name,
        state=state,
        started_at=release.started_at,
        upstream_repo=release.repo_id,
        upstream_commit=release.commit,
        candidate=release.candidate,
        scheme=release.scheme,
        run_id=run_dir.name if (run_dir := registry.recorded_run_dir(release)) else None,
        recipe=origin.recipe,
        calibration_set=origin.calibration_set,
        calibration_sha256=origin.calibration_sha256,
        artifact_cache_key=origin.cache_key,
        artifact_sha256=origin.files,
        origin_recorded=release.origin is not None,
        events=[e for e in history if release.release_id in (e.get("release"), e.get("replaced"))],
    )
    for event in line.events:
        if event.get("event") == "publish":
            line.published = f"{event.get('repo')}@{event.get('commit')}"
    if not origin.recipe and release.scheme in get_args(Scheme):  # a quantized release
        line.missing.append("quantization record")
    if not origin.files:
        line.missing.append("artifact hashes")
    report = _report(registry.recorded_run_dir(release))
    _measured(line, release, report)
    _decided(line, release, report)
    _walked(line, release, report, history)
    return line


def history(service: str | None = None) -> list[ReleaseLineage]:
    """Every release in the record (of ``service`` when given), oldest first."""
    events = registry.load().history
    return [
        lineage(release, state, events)
        for release, state in registry.releases()
        if service is None or release.public_name == service
    ]


# Characters a terminal or a table acts on: C0/C1 controls (ESC starts a terminal escape),
# format characters (bidi overrides reorder a line), line and paragraph separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def shown(value: object) -> str:
    """A value read from the record (anyone with its URL writes it) as inert text for the
    terminal and one table cell: control and format characters as Python escapes
    (``\\x1b``, ``\\n``, ``\\u202e``), a backslash doubled and ``|`` as ``\\|``."""
    out = []
    for ch in str(value):
        if ch == "\\":
            out.append("\\\\")
        elif ch == "|":
            out.append("\\|")
        elif unicodedata.category(ch) in _ESCAPED_CATEGORIES:
            out.append(ch.encode("unicode_escape").decode("ascii"))
        else:
            out.append(ch)
    return "".join(out)


def to_markdown(lines: list[ReleaseLineage]) -> str:
    """One table row per release, then each release's scores and windows. Every text from
    the record goes through :func:`shown`: no terminal escape and no '|' reaches the output
    raw (``--json`` escapes them as JSON does)."""
    if not lines:
        return "no release in the record"
    rows = [
        (
            shown(ln.release_id),
            shown(ln.state),
            shown(f"{ln.upstream_repo}@{ln.upstream_commit[:12]}"),
            shown(ln.scheme),
            ln.goodput if ln.goodput is not None else "—",
            shown(ln.rollout or "—"),
            shown(", ".join(ln.missing) or "—"),
        )
        for ln in lines
    ]
    out = [
        tabulate(
            rows,
            headers=["release", "state", "upstream", "scheme", "goodput", "rollout", "missing"],
            tablefmt="github",
            disable_numparse=True,
        )
    ]
    for ln in lines:
        out.append(f"\n{shown(ln.release_id)}: {shown(ln.decision or 'no decision recorded')}")
        for s in ln.scores:
            ci = f" [{s.ci_low:.3f}, {s.ci_high:.3f}]" if s.ci_low is not None else ""
            set_id = f" (set {shown(s.eval_set_sha256[:12])})" if s.eval_set_sha256 else ""
            out.append(f"  {shown(s.eval_set)}/{shown(s.metric)} {s.value:.3f}{ci}{set_id}")
        if ln.published:
            out.append(f"  published as {shown(ln.published)}")
        if ln.artifact_cache_key:
            out.append(
                f"  quantization {shown(ln.artifact_cache_key[:16])}, "
                f"{len(ln.artifact_sha256)} files"
            )
        for step in ln.steps:
            out.append(
                f"  step {step.weight}% from {shown(step.entered_at)}: "
                f"{shown(step.outcome or 'open')}"
            )
            for w in step.windows:
                out.append(f"    window {w.index}: {shown(w.verdict)} ({shown(w.reason)})")
        if not ln.steps:
            for w in ln.windows:
                out.append(
                    f"  {w.weight}% window {w.index}: {shown(w.verdict)} ({shown(w.reason)})"
                )
        out.extend(f"  {shown(a)}" for a in ln.approvals)
    return "\n".join(out)


def to_json(lines: list[ReleaseLineage]) -> str:
    return json.dumps([ln.model_dump(mode="json") for ln in lines], indent=2)
