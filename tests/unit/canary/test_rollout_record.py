"""The canary's walk on the release record: each step it entered (``rollout_steps``), each
analysis window with its whole verdict (``analysis_windows``) and each approval (an
``approval`` event of the history), written with the walk's status in one transaction.
The walk is the real policy (``rollout.walk``); its actions write the record as the flow's
``FlowActions`` do (flows/canary.py), against the default SQLite record and a real
PostgreSQL server (tests/pg.py)."""

from __future__ import annotations

from sqlalchemy import select

from llm_release import registry
from llm_release.canary import rollout
from llm_release.canary.analysis import WindowVerdict
from llm_release.canary.rollout import Answer, WindowRecord, walk
from llm_release.config import RolloutConfig
from llm_release.record import store
from llm_release.record.schema import AnalysisWindowRow, RolloutStepRow

RELEASE = "fp8-20261202"


def verdict(outcome: str, n: int) -> WindowVerdict:
    """Window ``n`` of the walk: a minute of its own."""
    start = 1_800_000_000.0 + 60 * n
    return WindowVerdict(
        service="svc",
        prometheus_url="http://127.0.0.1:9090",
        started_at=start,
        ended_at=start + 60,
        window_s=60,
        canary_requests=20.0,
        stable_requests=380.0,
        checks=[],
        verdict=outcome,
        reason=f"window {n}: {outcome}",
    )


class Recording:
    """Scripted verdicts and answers; writes the record where FlowActions does: the weight
    entered, each window, each answer, the walk's end."""

    def __init__(
        self, config: RolloutConfig, verdicts: list[str], answers: list[bool], release=RELEASE
    ):
        self.config, self.verdicts, self.answers = config, list(verdicts), list(answers)
        self.release = release
        self.weight = config.first_weight
        self.n = 0

    def _record(self, state: str, last: WindowRecord | None = None, reason: str | None = None):
        rollout.record(
            self.release, self.config.steps, self.weight, state, last=last, reason=reason
        )

    def still_canary(self) -> bool:
        return True

    def crash_looping(self) -> str | None:
        return None

    def set_weight(self, weight: int) -> None:
        self.weight = weight
        self._record("analysing")

    def warm_up(self, weight: int, seconds: float) -> None:
        self._record("warming up")

    def analyze(self, weight: int, index: int) -> WindowVerdict:
        self.n += 1
        found = verdict(self.verdicts.pop(0), self.n)
        self._record("analysing", WindowRecord(weight=weight, index=index, verdict=found))
        return found

    def ask(self, question, windows) -> Answer:
        approve = self.answers.pop(0)
        answer = Answer(approve=approve, note=f"{question}: {approve}", by="person")
        rollout.record_answer(self.release, question, self.weight, answer)
        return answer

    def promote(self) -> None:
        self.weight = 100
        self._record("promoted")

    def rollback(self, reason: str) -> None:
        self._record("rolled back", reason=reason)


def _rows():
    with store.transaction(write=False) as session:
        steps = session.scalars(select(RolloutStepRow).order_by(RolloutStepRow.weight)).all()
        windows = session.scalars(
            select(AnalysisWindowRow).order_by(AnalysisWindowRow.started_at)
        ).all()
        by_id = {s.id: s.weight for s in steps}
        return (
            [(s.release_id, s.weight, s.outcome) for s in steps],
            [(by_id[w.step_id], w.index, w.verdict, w.verdict_record) for w in windows],
            [s.entered_at for s in steps],
        )


def test_a_promoted_walk_leaves_its_steps_windows_and_approvals_on_the_record(record_url):
    # 5%: two passes; 25%: a failure (one tolerated), two passes; 50%: three inconclusive
    # windows, a person accepts the step; 100%: a person approves the promotion.
    config = RolloutConfig(windows_per_step=2, failure_limit=1)
    script = Recording(
        config,
        ["pass", "pass", "fail", "pass", "pass"] + ["inconclusive"] * 3,
        answers=[True, True],
    )
    out = walk(config, RELEASE, script)
    assert out.status == "promoted"
    steps, windows, entered = _rows()
    assert steps == [
        (RELEASE, 5, "cleared"),
        (RELEASE, 25, "cleared"),
        (RELEASE, 50, "cleared"),
        (RELEASE, 100, "promoted"),
    ]
    assert entered == sorted(entered)
    # every window, in its step, with its whole verdict
    assert [(w, i, v) for w, i, v, _ in windows] == [
        (r.weight, r.index, r.verdict.verdict) for r in out.windows
    ]
    assert [rec for *_, rec in windows] == [r.verdict.model_dump(mode="json") for r in out.windows]
    assert registry.load().rollout.state == "promoted"
    recorded = rollout.recorded_walk(RELEASE, registry.load().history)
    assert recorded.state == "promoted" and recorded.windows == out.windows
    assert recorded.answers == out.answers
    approvals = [e for e in registry.load().history if e["event"] == "approval"]
    assert [(e["question"], e["weight"], e["by"]) for e in approvals] == [
        ("inconclusive", 50, "person"),
        ("promote", 50, "person"),
    ]


def test_a_rolled_back_walk_ends_its_step_and_a_held_one_its_first(record_url):
    config = RolloutConfig(windows_per_step=2)
    out = walk(config, RELEASE, Recording(config, ["pass", "pass", "fail"], answers=[]))
    assert out.status == "rolled back"
    steps, windows, _ = _rows()
    assert steps == [(RELEASE, 5, "cleared"), (RELEASE, 25, "rolled back")]
    assert [(w, i, v) for w, i, v, _ in windows] == [
        (5, 1, "pass"),
        (5, 2, "pass"),
        (25, 1, "fail"),
    ]

    held = config.model_copy(update={"mode": "hold"})
    out = walk(held, "held-1", Recording(held, [], []))
    # flows/canary.py's walk_canary records a held or overridden walk's end
    rollout.record("held-1", held.steps, held.first_weight, out.status, reason=out.reason)
    walk_ = rollout.recorded_walk("held-1", [])
    assert [(s.weight, s.outcome, s.windows) for s in walk_.steps] == [(5, "held", [])]
    # 'canary-rollout' walks the held canary on from its weight
    progressive = held.model_copy(update={"mode": "progressive", "failure_limit": 0})
    walk(progressive, "held-1", Recording(progressive, ["pass", "pass", "fail"], [], "held-1"), 5)
    walk_ = rollout.recorded_walk("held-1", [])
    assert [(s.weight, s.outcome) for s in walk_.steps] == [(5, "cleared"), (25, "rolled back")]


def test_a_window_is_written_once_and_a_resumed_walk_numbers_on(home):
    first, again = verdict("pass", 1), verdict("pass", 2)
    for window in (first, first, again):  # the same window twice, then a resumed walk's
        rollout.record(
            RELEASE, [5, 100], 5, "analysing", last=WindowRecord(weight=5, index=1, verdict=window)
        )
    _, windows, _ = _rows()
    assert [(i, rec["started_at"]) for _, i, _, rec in windows] == [
        (1, first.started_at),
        (2, again.started_at),
    ]
