"""A canary's walk as rows: each step it entered (``rollout_steps``) and each analysis
window of a step (``analysis_windows``, the whole verdict in ``verdict_record``), written
in the transaction that writes the walk's status (``rollouts``), and read back for the
release's lineage. Like ``state.py`` it works on ``model_dump(mode="json")`` dicts
(``registry.RolloutStatus``, ``rollout.WindowRecord``), so this room imports no model of
the rooms above it.

A step is entered the first time the walk's status names its weight; entering a step
clears the steps below it that were still open (``cleared``). The walk's end (promoted,
rolled back, held, overridden) is the outcome of the step it ended at; a held walk walked on
later (``canary-rollout``) opens its step again.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from llm_release.record.schema import AnalysisWindowRow, RolloutRow, RolloutStepRow

# RolloutStatus.state values that end a walk: each is the outcome of the step it ended at.
ENDS = ("promoted", "rolled back", "held", "overridden")
# The outcome of a step the walk went on from.
CLEARED = "cleared"


def _step(session: Session, release_id: str, weight: int, at: str) -> RolloutStepRow:
    step = session.scalar(
        select(RolloutStepRow).where(
            RolloutStepRow.release_id == release_id, RolloutStepRow.weight == weight
        )
    )
    if step is not None:
        return step
    below = select(RolloutStepRow).where(
        RolloutStepRow.release_id == release_id,
        RolloutStepRow.weight < weight,
        RolloutStepRow.outcome.is_(None),
    )
    for earlier in session.scalars(below):
        earlier.outcome = CLEARED
    step = RolloutStepRow(release_id=release_id, weight=weight, entered_at=at)
    session.add(step)
    session.flush()
    return step


def _window(session: Session, step: RolloutStepRow, window: dict[str, Any]) -> None:
    verdict = window["verdict"]
    rows = session.scalars(
        select(AnalysisWindowRow).where(AnalysisWindowRow.step_id == step.id)
    ).all()
    if any(
        (r.started_at, r.ended_at) == (verdict["started_at"], verdict["ended_at"]) for r in rows
    ):
        return  # written already
    index = int(window["index"])
    if any(r.index == index for r in rows):
        # A walk resumed at this weight (canary-rollout after an interruption) numbers its
        # windows from 1 again: the record keeps both, this one after the last.
        index = 1 + (
            session.scalar(
                select(func.max(AnalysisWindowRow.index)).where(
                    AnalysisWindowRow.step_id == step.id
                )
            )
            or 0
        )
    session.add(
        AnalysisWindowRow(
            step_id=step.id,
            index=index,
            verdict=verdict["verdict"],
            reason=verdict["reason"],
            started_at=float(verdict["started_at"]),
            ended_at=float(verdict["ended_at"]),
            verdict_record=verdict,
        )
    )


def write_walk(
    session: Session, rollout: dict[str, Any], window: dict[str, Any] | None = None
) -> None:
    """Write the walk's status ``rollout`` (``RolloutStatus.model_dump(mode="json")``): its
    row, the step at its weight (entered now if new), ``window`` (a ``WindowRecord`` dump:
    weight, index, verdict) in its step, and the walk's end as its step's outcome."""
    session.merge(RolloutRow(**rollout))
    session.flush()
    release_id, at = rollout["release_id"], rollout["updated_at"]
    if window is not None:
        _window(session, _step(session, release_id, int(window["weight"]), at), window)
    step = _step(session, release_id, int(rollout["weight"]), at)
    if rollout["state"] in ENDS:
        step.outcome = rollout["state"]
    elif step.outcome in ENDS:
        step.outcome = None  # a held walk walked on (canary-rollout): the step is open again
    session.flush()


def read_walk(session: Session, release_id: str) -> dict[str, Any] | None:
    """A release's walk: its last status (state, reason) and its steps by weight, each with
    its windows by index (None: the record holds no walk of this release)."""
    rollout = session.get(RolloutRow, release_id)
    if rollout is None:
        return None
    steps = []
    for step in session.scalars(
        select(RolloutStepRow)
        .where(RolloutStepRow.release_id == release_id)
        .order_by(RolloutStepRow.weight)
    ):
        windows = session.scalars(
            select(AnalysisWindowRow)
            .where(AnalysisWindowRow.step_id == step.id)
            .order_by(AnalysisWindowRow.index)
        )
        steps.append(
            {
                "weight": step.weight,
                "entered_at": step.entered_at,
                "outcome": step.outcome,
                "windows": [
                    {"weight": step.weight, "index": w.index, "verdict": w.verdict_record}
                    for w in windows
                ],
            }
        )
    return {"state": rollout.state, "reason": rollout.reason, "steps": steps}
