"""Events an operator's automations react to (a webhook on every rollback, with its reason)."""

from __future__ import annotations

from prefect.events import emit_event
from prefect.runtime import flow_run

ROLLBACK_EVENT = "llm-release.canary.rolled-back"


def emit_rollback(release_id: str, reason: str) -> None:
    """One event per rollback: the resource is the release, the reason is in the payload
    (an automation's webhook template reads `event.payload.reason`)."""
    related = []
    run_id = flow_run.get_id()
    if run_id:
        related.append(
            {
                "prefect.resource.id": f"prefect.flow-run.{run_id}",
                "prefect.resource.role": "flow-run",
            }
        )
    emit_event(
        event=ROLLBACK_EVENT,
        resource={
            "prefect.resource.id": f"llm-release.release.{release_id}",
            "prefect.resource.name": release_id,
        },
        related=related,
        payload={"release_id": release_id, "reason": reason},
    )
