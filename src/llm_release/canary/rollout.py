"""The canary's walk on live traffic: the policy, apart from how windows are measured.

Weights follow ``RolloutConfig.steps`` (default 5 → 25 → 50 → 100). A step is cleared by
``windows_per_step`` analysis windows in a row that pass (canary versus stable, PromQL in
``canary_queries.yaml``). A failing window counts against ``failure_limit`` over the whole
rollout; one more than the limit rolls back at once. Inconclusive windows (too few canary
requests, a series with no data) never count as passes; ``inconclusive_limit`` of them in
one step ask a person. The last step, 100, is a promotion and waits for an approval; no
answer in time rolls back.

The driver takes its effects as a ``RolloutActions`` object: the Prefect flow gives it
pauses for approvals and tasks for windows; tests give it the real router and Prometheus.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Literal, Protocol

from pydantic import BaseModel, Field
from tabulate import tabulate

from llm_release import registry
from llm_release.canary.analysis import WindowVerdict
from llm_release.canary.prometheus import SCRAPE_INTERVAL_S
from llm_release.config import RolloutConfig
from llm_release.load.traffic import TrafficReport
from llm_release.record import store, walks
from llm_release.registry import RolloutStatus

log = logging.getLogger(__name__)

Question = Literal["promote", "inconclusive"]
Status = Literal["promoted", "rolled back", "held", "overridden"]


class WindowRecord(BaseModel):
    """One analysis window at one canary weight."""

    weight: int
    index: int = Field(description="the window's number within its step, from 1")
    verdict: WindowVerdict


class Answer(BaseModel):
    approve: bool
    note: str
    by: Literal["person", "config", "timeout"]


class RolloutOutcome(BaseModel):
    status: Status
    release_id: str
    reached_weight: int = Field(description="the highest weight the canary served at")
    windows: list[WindowRecord] = Field(default_factory=list)
    reason: str
    answers: list[Answer] = Field(default_factory=list)
    traffic: TrafficReport | None = Field(
        None, description="the requests the release drove through the load balancer (demo)"
    )
    finished_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat())


class RolloutActions(Protocol):
    def still_canary(self) -> bool:
        """The release is still the live canary (nobody promoted or rolled it back by hand)."""

    def crash_looping(self) -> str | None:
        """Why the canary's server crash-loops (no longer restarted); None while it serves
        or is being restarted. A crash-looping canary is rolled back at once."""

    def set_weight(self, weight: int) -> None: ...

    def warm_up(self, weight: int, seconds: float) -> None:
        """Let the canary serve ``weight`` percent for ``seconds``, unjudged."""

    def analyze(self, weight: int, index: int) -> WindowVerdict:
        """Wait one window out at ``weight``, then analyse it."""

    def ask(self, question: Question, windows: list[WindowRecord]) -> Answer: ...

    def promote(self) -> None: ...

    def rollback(self, reason: str) -> None: ...


def walk(
    config: RolloutConfig,
    release_id: str,
    actions: RolloutActions,
    current_weight: int | None = None,
) -> RolloutOutcome:
    """Walk the canary through the steps from ``current_weight`` (default: the first step,
    where a release deploys it); steps below the current weight are not walked again."""
    windows: list[WindowRecord] = []
    answers: list[Answer] = []
    failed = 0
    reached = current_weight or config.first_weight

    def done(status: Status, reason: str) -> RolloutOutcome:
        log.info("rollout of %s: %s (%s)", release_id, status, reason)
        return RolloutOutcome(
            status=status,
            release_id=release_id,
            reached_weight=reached,
            windows=windows,
            reason=reason,
            answers=answers,
        )

    def roll_back(reason: str) -> RolloutOutcome:
        actions.rollback(reason)
        return done("rolled back", reason)

    if config.mode == "hold":
        return done("held", f"rollout.mode is 'hold': the canary stays at {reached}%")
    for weight in [w for w in config.steps if w >= reached or w == 100]:
        if not actions.still_canary():
            return done("overridden", "the canary was promoted or rolled back by hand")
        if weight == 100:
            answer = actions.ask("promote", windows)
            answers.append(answer)
            if not answer.approve:
                return roll_back(f"promotion not approved: {answer.note}")
            actions.promote()
            reached = 100
            return done("promoted", f"approved ({answer.by}): {answer.note}")
        if weight != reached:
            actions.set_weight(weight)
            reached = weight
        passed = inconclusive = index = 0
        while passed < config.windows_per_step:
            if not actions.still_canary():
                return done("overridden", "the canary was promoted or rolled back by hand")
            looping = actions.crash_looping()
            if looping is not None:
                return roll_back(f"the canary's server is crash-looping at {weight}%: {looping}")
            if not windows and config.warmup_s:
                # The first window of a walk judges a warm server: measured in the demo, a
                # canary's first 90 s at 25% (36 requests, bf16 on a 2-core CPU) had a
                # TTFT p95 of 5.2 s against the stable's 2.3 s, its ITL p95 lower than
                # the stable's — the cold start, not the release, failed the window.
                actions.warm_up(weight, config.warmup_s)
            index += 1
            verdict = actions.analyze(weight, index)
            windows.append(WindowRecord(weight=weight, index=index, verdict=verdict))
            looping = actions.crash_looping()
            if looping is not None:
                return roll_back(f"the canary's server is crash-looping at {weight}%: {looping}")
            log.info(
                "canary at %d%%, window %d: %s (%s)", weight, index, verdict.verdict, verdict.reason
            )
            if verdict.verdict == "pass":
                passed += 1
            elif verdict.verdict == "fail":
                passed = 0
                failed += 1
                if failed > config.failure_limit:
                    return roll_back(
                        f"window {index} at {weight}% failed ({verdict.reason}); "
                        f"{failed} failing window(s), limit {config.failure_limit}"
                    )
            else:
                passed = 0
                inconclusive += 1
                if inconclusive >= config.inconclusive_limit:
                    answer = actions.ask("inconclusive", windows)
                    answers.append(answer)
                    if not answer.approve:
                        return roll_back(
                            f"{inconclusive} inconclusive windows at {weight}% "
                            f"({verdict.reason}); {answer.note}"
                        )
                    # A person accepted the step on the evidence there is.
                    break
    # Unreachable: steps end at 100 (validated), which returns above.
    raise AssertionError("rollout steps did not end at 100")


def longest_rollout_s(config: RolloutConfig, probe_s: float = 0.0) -> float:
    """An upper bound of the walk's analysis time (without waiting for a person);
    ``probe_s``: what the quality probes after each window may take."""
    per_window = config.analysis.window_s + settle_s(config) + probe_s
    steps = [w for w in config.steps if w < 100]
    windows = len(steps) * (config.windows_per_step + config.inconclusive_limit)
    return per_window * (windows + config.failure_limit) + config.warmup_s + 60


def settle_s(config: RolloutConfig) -> float:
    """After a window ends, Prometheus still has to scrape its last seconds: two scrape
    intervals of the project's Prometheus (another one is assumed to scrape as often)."""
    return 2.0 * SCRAPE_INTERVAL_S


def evidence_markdown(windows: list[WindowRecord]) -> str:
    """Each window's checks, canary versus stable, for the approval form and the report."""
    if not windows:
        return "_No analysis window ran._\n"
    rows = []
    for record in windows:
        v = record.verdict
        rows.append(
            [
                f"{record.weight}%",
                record.index,
                "**verdict**",
                f"{_num(v.canary_requests)} req",
                f"{_num(v.stable_requests)} req",
                f"{v.window_s} s window",
                f"**{v.verdict}**: {_cell(v.reason)}",
            ]
        )
        for check in v.checks:
            outcome = check.outcome
            if check.outcome != "pass":
                outcome += f": {_cell(check.reason)}"
            rows.append(
                [
                    "",
                    "",
                    check.name,
                    _num(check.canary),
                    _num(check.stable),
                    _cell(check.rule),
                    outcome,
                ]
            )
    headers = ["weight", "window", "check", "canary", "stable", "rule", "outcome"]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True) + "\n"


def _num(value: float | None) -> str:
    if value is None:
        return "no data"
    return f"{value:.4g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def record(
    release_id: str,
    steps: list[int],
    weight: int,
    state: str,
    *,
    last: WindowRecord | None = None,
    reason: str | None = None,
) -> None:
    """Write where the walk stands into the registry (the CLI's status reads it there), and
    in the same transaction the record's rows of the walk (``record/walks.py``): the step at
    ``weight`` (entered now if new), the window ``last`` in its step, and the walk's end
    (promoted, rolled back, held, overridden) as its step's outcome."""
    last_window = None
    if last is not None:
        last_window = {
            "weight": last.weight,
            "index": last.index,
            "verdict": last.verdict.verdict,
            "reason": last.verdict.reason,
            "ended_at": last.verdict.ended_at,
        }
    with registry.locked_session() as (current, session):
        previous = current.rollout
        if last_window is None and previous is not None and previous.release_id == release_id:
            last_window = previous.last_window
        current.rollout = RolloutStatus(
            release_id=release_id,
            steps=steps,
            weight=weight,
            state=state,
            last_window=last_window,
            reason=reason,
        )
        walks.write_walk(
            session,
            current.rollout.model_dump(mode="json"),
            last.model_dump(mode="json") if last is not None else None,
        )


def record_answer(release_id: str, question: Question, weight: int, answer: Answer) -> None:
    """A rollout question answered, as an ``approval`` event of the registry's history:
    who answered (a person, the config, the timeout), yes or no, and the note."""
    with registry.locked() as current:
        current.log(
            "approval",
            release=release_id,
            question=question,
            weight=weight,
            approve=answer.approve,
            by=answer.by,
            note=answer.note,
        )


class RecordedStep(BaseModel):
    """A step of a walk as the record keeps it."""

    weight: int
    entered_at: str
    outcome: str | None = Field(
        None, description="cleared (the walk went on), or the walk's end; None: still open"
    )
    windows: list[WindowRecord] = Field(default_factory=list)


class RecordedWalk(BaseModel):
    """A release's walk from the record: its last status and its steps, each window whole;
    ``answers``: the rollout questions' answers (the history's ``approval`` events)."""

    state: str
    reason: str | None = None
    steps: list[RecordedStep] = Field(default_factory=list)
    answers: list[Answer] = Field(default_factory=list)

    @property
    def windows(self) -> list[WindowRecord]:
        return [w for step in self.steps for w in step.windows]


def recorded_walk(release_id: str, history: list[dict]) -> RecordedWalk | None:
    """``release_id``'s walk as the record keeps it (None: no walk recorded), its answers
    read from ``history`` (the registry's events)."""
    if store.missing():
        return None
    with store.transaction(write=False) as session:
        raw = walks.read_walk(session, release_id)
    if raw is None:
        return None
    answers = [
        Answer(approve=bool(e.get("approve")), note=str(e.get("note", "")), by=e.get("by"))
        for e in history
        if e.get("event") == "approval" and e.get("release") == release_id
    ]
    return RecordedWalk.model_validate(raw | {"answers": answers})
