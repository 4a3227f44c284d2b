"""The release registry's state as rows, and back: what ``llm_release.registry`` keeps
(``RegistryState``: the router's port, the stable and canary releases, the canary's
weight, the walk's status, the history) in the shape of its ``model_dump(mode="json")``,
so the registry validates it with its own models and this room imports none of them.

``write_state`` writes a state read under ``store.lock_registry`` in the same
transaction: the slots take their releases (a release moving from canary to stable in one
write included), a release that left both slots keeps its row with the state it left in,
and the history gains the entries beyond the rows it has (events are never rewritten).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from llm_release.record.schema import (
    SLOTS,
    HistoryRow,
    RegistryRow,
    ReleaseRow,
    RolloutRow,
    SlotRow,
)

RELEASE_FIELDS = tuple(c for c in ReleaseRow.__table__.columns.keys() if c != "state")
ROLLOUT_FIELDS = tuple(RolloutRow.__table__.columns.keys())


def _fields(row: Any, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(row, name) for name in names}


def read_state(session: Session) -> dict[str, Any]:
    """The registry's state, as ``RegistryState.model_dump(mode="json")`` would give it."""
    registry = session.get(RegistryRow, 1)
    state: dict[str, Any] = {
        "router_port": registry.router_port,
        "canary_weight": registry.canary_weight,
    }
    for slot in SLOTS:
        row = session.get(SlotRow, slot)
        release = session.get(ReleaseRow, row.release_id) if row.release_id else None
        state[slot] = _fields(release, RELEASE_FIELDS) if release else None
    rollout = (
        session.get(RolloutRow, registry.rollout_release_id)
        if registry.rollout_release_id
        else None
    )
    state["rollout"] = _fields(rollout, ROLLOUT_FIELDS) if rollout else None
    state["history"] = [
        {"at": h.at, "event": h.event, **h.details}
        for h in session.execute(select(HistoryRow).order_by(HistoryRow.id)).scalars()
    ]
    return state


def read_releases(session: Session) -> list[tuple[dict[str, Any], str]]:
    """Every release the record holds, in the order each first served, with its state
    (stable, canary, replaced, rolled back, stopped)."""
    rows = session.execute(select(ReleaseRow).order_by(ReleaseRow.started_at)).scalars()
    return [(_fields(row, RELEASE_FIELDS), row.state) for row in rows]


def _left_as(slot: str, new: dict[str, str | None]) -> str:
    """The state a release that left ``slot`` is in: a stable is replaced by a new stable
    (or stopped with none); a canary that did not become stable was rolled back."""
    if slot == "stable":
        return "replaced" if new["stable"] else "stopped"
    return "rolled back" if new["stable"] else "stopped"


def write_state(session: Session, state: dict[str, Any]) -> None:
    """Write ``state`` (``RegistryState.model_dump(mode="json")``) over the registry."""
    registry = session.get(RegistryRow, 1)
    registry.router_port = state.get("router_port")
    registry.canary_weight = int(state.get("canary_weight") or 0)
    new = {slot: (state.get(slot) or {}).get("release_id") for slot in SLOTS}
    rows = {slot: session.get(SlotRow, slot) for slot in SLOTS}
    # Empty every slot that changes first: a release moving from canary to stable is in
    # one slot at every moment (the unique constraint on slots.release_id).
    for slot, row in rows.items():
        if row.release_id != new[slot]:
            old = row.release_id
            row.release_id = None
            if old is not None and old not in new.values():
                session.get(ReleaseRow, old).state = _left_as(slot, new)
    session.flush()
    for slot in SLOTS:
        record = state.get(slot)
        if record is None:
            continue
        session.merge(ReleaseRow(**record, state=slot))
        session.flush()
        rows[slot].release_id = record["release_id"]
    rollout = state.get("rollout")
    if rollout is not None:
        session.merge(RolloutRow(**rollout))
        session.flush()
    registry.rollout_release_id = rollout["release_id"] if rollout else None
    history = state.get("history") or []
    known = session.scalar(select(func.count()).select_from(HistoryRow)) or 0
    for event in history[known:]:
        details = {k: v for k, v in event.items() if k not in ("at", "event")}
        session.add(HistoryRow(at=event["at"], event=event["event"], details=details))
    session.flush()
