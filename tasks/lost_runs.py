"""A measure run whose host went away is marked Crashed by Prefect itself (issue 37, item 3).

Prefect 3.9's server does not notice a flow run whose process died with its worker: the run
stays Running for ever. Its flow engine beats, though (a ``prefect.flow-run.heartbeat``
event every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds, for runs of a deployment), and
Prefect's own answer to such "zombie" runs is an automation with a proactive trigger: a run
that has beaten once and then neither beats again nor ends within the window is moved to
Crashed (docs.prefect.io, "How to detect and respond to zombie flows"). This is that
automation, kept to the runs of the ``measure`` flow: the one a release sends to another
host and waits for. Every measure run beats every ``HEARTBEAT_S`` seconds whatever its
host's settings (the deployment's job variables in prefect.yaml set the frequency), and is
taken as lost after ``LOST_AFTER_S`` without a beat: four beats missed, far beyond a
loaded host's delay.

Made (or put back as defined here) by ``make fleet-join`` on every join; one automation per
Prefect server, found by its name.
"""

from __future__ import annotations

from datetime import timedelta

from prefect.automations import Automation
from prefect.client.schemas.objects import StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification

HEARTBEAT_S = 30  # Prefect's minimum
LOST_AFTER_S = 4 * HEARTBEAT_S
NAME = "llm-release: lost measure runs"
FLOW = "measure"
ENDED = {f"prefect.flow-run.{s}" for s in ("Completed", "Failed", "Cancelled", "Crashed")}


def why(lost_after_s: int) -> str:
    return (
        f"lost: no heartbeat for {lost_after_s} s (its host or its worker went away); "
        "the release measures this contender again on another host"
    )


def lost_run_watch(lost_after_s: int = LOST_AFTER_S) -> Automation:
    """The automation as this project defines it (a shorter window only in tests)."""
    return Automation(
        name=NAME,
        description=(
            f"A run of the '{FLOW}' flow that stops beating for {lost_after_s} s without "
            "ending is marked Crashed (docs/fleet.md: faults)."
        ),
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *ENDED},
            match=ResourceSpecification({"prefect.resource.id": "prefect.flow-run.*"}),
            match_related=ResourceSpecification(
                {"prefect.resource.role": "flow", "prefect.resource.name": FLOW}
            ),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=lost_after_s),
        ),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, message=why(lost_after_s))],
    )


def ensure_lost_run_watch(lost_after_s: int = LOST_AFTER_S) -> Automation:
    """The watch on this Prefect server, made when missing and put back when edited (a
    second one of the same name, made by two hosts joining at once, removed)."""
    from prefect.client.orchestration import get_client

    wanted = lost_run_watch(lost_after_s)
    with get_client(sync_client=True) as client:
        found = client.read_automations_by_name(name=NAME)
        if not found:
            return wanted.create()
        first, *extra = found
        for other in extra:
            client.delete_automation(other.id)
    kept = Automation(**first.model_dump())
    if (kept.trigger, kept.actions, kept.enabled) != (wanted.trigger, wanted.actions, True):
        wanted.id = kept.id
        wanted.update()
        return wanted
    return kept


def given_up_on() -> str | None:
    """Why this flow run was given up for lost (None: it was not): a run that comes back
    after the watch crashed it, e.g. from a host cut off from the Prefect API for a while,
    whose contender the release has already sent to another host. Such a run stops before
    it takes a GPU, so no contender is measured twice."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    if run_id is None:
        return None
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(run_id).state
    if state is not None and state.is_final():
        return f"{state.name} on the Prefect server: {state.message or 'no message'}"
    return None
