"""A contender measured on another host of the fleet (docs/fleet.md): a flow run of the
``measure`` deployment sent to that host's own queue (``run_deployment``, Prefect's own
dispatch: no queue of ours), nested under this task in the UI, its result read back from
the record. Only a host that joined is sent to: Prefect makes a queue nobody polls for an
unknown name, and the run would wait there for ever."""

from __future__ import annotations

from collections.abc import Sequence

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State

from llm_release.decision import measurements, remote
from llm_release.decision.remote import MeasureOrder
from llm_release.errors import ConfigError
from llm_release.fleet import QUEUE_PREFIX, checked_name
from llm_release.results import CandidateResult
from tasks.fleet import host_queues
from tasks.states import failed_with, first_line

# A measurement of a large model: start, evaluation and load test can take hours.
MEASURE_TIMEOUT_S = 6 * 3600.0


@task(
    name="measure-on-host",
    cache_policy=NO_CACHE,
    task_run_name="measure-{order.contender.name}-on-{host}",
)
def measure_on_host(
    order: MeasureOrder,
    host: str,
    elsewhere: Sequence[str] = (),
    timeout_s: float = MEASURE_TIMEOUT_S,
) -> CandidateResult | State:
    """``order`` measured by host ``host``'s worker; its recorded result, or a Failed state
    carrying a failed result that says what the run on that host ended with.

    A run lost with its host (Crashed: tasks/lost_runs.py's watch marks a run that stopped
    beating) is sent again, as a new attempt, to the next host of ``elsewhere`` that joined;
    the lost attempt stays in the UI under this task, and the result names it."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.states import Cancelling

    logger = get_run_logger()
    if checked_name(host) not in host_queues():
        raise ConfigError(
            f"host {host} has not joined the fleet: no measurement is sent to it",
            hint="list the fleet with 'make fleet'; a host joins with 'make fleet-join HOST=NAME'",
        )
    name = order.contender.name
    spare = [h for h in dict.fromkeys(elsewhere) if h != host]
    lost: list[str] = []
    attempt = 1
    while True:
        run = run_deployment(
            remote.DEPLOYMENT,
            parameters={"order": order.model_dump(mode="json")},
            work_queue_name=QUEUE_PREFIX + host,
            timeout=timeout_s,
            poll_interval=2,
            # the same attempt sent again (this task retried) finds the run already made
            idempotency_key=f"{order.run_id}/{name}/{attempt}",
        )
        state = run.state
        logger.info(
            "%s on host %s: flow run %s ended %s", name, host, run.name, state and state.name
        )
        if state is None or not state.is_crashed() or not spare:
            break
        lost.append(f"host {host}, flow run {run.name}: {first_line(state.message or '')}")
        joined = set(host_queues())
        spare = [h for h in spare if h in joined]
        if not spare:
            break
        host, spare, attempt = spare[0], spare[1:], attempt + 1
        logger.warning("%s lost (%s); measured again on host %s", name, lost[-1], host)
    if state is None or not state.is_final():
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.id, Cancelling(), force=True)
        why = (
            f"not finished after {timeout_s:.0f} s on host {host} (flow run {run.name}: cancelled)"
        )
    elif state.is_completed():
        found = measurements.of_run(order.run_id, name)
        if found is not None:
            return found.model_copy(update={"measured_on": host, "lost": lost})
        why = (
            f"host {host} completed flow run {run.name} but the record holds no measurement "
            "of it: is LLM_RELEASE_DATABASE_URL the same database on both hosts?"
        )
    else:
        why = (
            f"on host {host} (flow run {run.name}) {state.name}: {first_line(state.message or '')}"
        )
    failed = CandidateResult(
        name=name,
        role=order.contender.role,
        scheme=order.contender.scheme,
        release_id=order.contender.release_id,
        status="failed",
        error=why,
        measured_on=host,
        lost=lost,
    )
    return failed_with(failed, f"{name}: {why}")
