"""The ``measure`` deployment: one contender of a release measured on the host whose worker
runs it (the fleet, docs/fleet.md). A release host sends it to a host's own queue
(``host-<name>``) with a ``MeasureOrder``; this host receives the candidate through the hub
(every file proven against the hashes the order carries; a baseline from the release's own
source, at the commit the release host acquired), probes its own runtime, then
serves, evaluates and load-tests it as the release host would. The result goes to the
record (``measurements.of_run``), where the release host reads it; a failed measurement is
this run's Failed state, with its first line."""

from __future__ import annotations

from prefect import flow
from prefect.client.schemas.objects import State
from prefect.states import Cancelled

from llm_release import paths
from llm_release.decision.remote import MeasureOrder
from llm_release.results import CandidateResult
from tasks.acquire import receive_candidate
from tasks.candidate import measure_contender
from tasks.lost_runs import given_up_on
from tasks.probe import probe_host
from tasks.stage import StageClock
from tasks.states import value_of


@flow(name="measure", flow_run_name="measure-{order.contender.name}", persist_result=False)
def measure(order: MeasureOrder) -> CandidateResult | State:
    """Receive, probe, measure: the contender's result, recorded under the release's run."""
    stage = StageClock()
    with stage("receive"):
        model_dir = receive_candidate(order.handover)
    with stage("probe"):
        host = probe_host(model_dir, [], order.contender.serving)
    with stage("measure"):
        # given up for lost meanwhile (tasks/lost_runs.py): measured elsewhere, not here too
        if (why := given_up_on()) is not None:
            return Cancelled(message=f"not measured: this run was given up for lost ({why})")
        state = measure_contender(
            order.contender_at(model_dir),
            model_dir,
            order.evaluation,
            order.load,
            host,
            paths.runs_dir() / order.run_id / "candidates" / order.contender.name,
            order.public_name,
            order.run_id,
            slo=order.slo,
            return_state=True,
        )
    # a measured failure ends this run Failed with its first line (the release host reads it)
    return state if state.is_failed() else value_of(state, CandidateResult)
