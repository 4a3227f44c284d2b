"""Where each contender is measured, and a contender measured on another host of the fleet
(docs/fleet.md): ``place_contenders`` seats every contender (``fleet.place``: here while
this host has a free slot, else the freest host whose card fits), ``send_away`` hands each
one seated elsewhere over through the fleet's hub and sends it as a flow run of the
``measure`` deployment sent to that host's own queue (``run_deployment``, Prefect's own
dispatch: no queue of ours), nested under this task in the UI, its result read back from
the record. Only a host that joined is sent to: Prefect makes a queue nobody polls for an
unknown name, and the run would wait there for ever. The candidate goes first to the fleet's
hub (``hand_over_contender``), whence the measuring host downloads it; the baseline of a
release whose source is a hub is fetched by the measuring host from that source instead
(``LLM_RELEASE_FLEET_BASELINE``). A contender queued here while every host it fits is full
waits for the first of them to free a slot (``seat_when_free``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import httpx
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture

from llm_release.config import ReleaseConfig, SourceConfig
from llm_release.decision import measurements, remote
from llm_release.decision.contenders import Contender
from llm_release.decision.remote import MeasureOrder, OrderedContender
from llm_release.errors import ConfigError, ReleaseError, StateError, one_line
from llm_release.fleet import QUEUE_PREFIX, Placement, Seat, checked_name, place, seat_queued
from llm_release.hub.acquire import Acquired
from llm_release.hub.handover import (
    FleetHub,
    Handover,
    from_upstream,
    hand_over,
    upstream_handover,
)
from llm_release.load.loadtest import slo_for
from llm_release.quantization.quantize import RECORD
from llm_release.results import CandidateResult
from llm_release.serving import gpus, placement
from llm_release.serving.capacity import fleet_fits, folder_files
from llm_release.serving.probe import HostSupport
from llm_release.settings import settings
from tasks.fleet import free_slots, host_queues, release_fleet
from tasks.states import failed_with, first_line, settled

# A measurement of a large model: start, evaluation and load test can take hours.
MEASURE_TIMEOUT_S = 6 * 3600.0
# A contender queued here: how often the fleet's free slots are read again, and for how long
# (as long as one measurement may take: by then every one that held a slot has ended or was
# given up) before it is measured here after all, where this host's slots queue it.
POLL_S = 10.0
WAIT_S = MEASURE_TIMEOUT_S

Started = PrefectFuture | State


@task(
    name="hand-over",
    cache_policy=NO_CACHE,
    retries=1,
    retry_delay_seconds=10,
    task_run_name="hand-over-{contender.name}",
)
def hand_over_contender(
    contender: Contender, hub: FleetHub, run_id: str, upstream_repo: str, upstream_commit: str
) -> Handover:
    """The contender's folder published to the fleet's hub, one repo of its own for this run
    (its quantization record left home: it names this host's paths); what the measuring
    host needs to fetch it and prove every file."""
    if contender.model_dir is None:
        raise StateError(
            f"{contender.name} has no folder to hand over",
            hint="only a built contender is measured on another host",
        )
    handover = hand_over(
        contender.model_dir,
        hub.target(upstream_repo, contender.name, run_id),
        run_id=run_id,
        candidate=contender.name,
        scheme=contender.scheme,
        upstream_repo=upstream_repo,
        upstream_commit=upstream_commit,
        exclude=(RECORD,),
    )
    get_run_logger().info(
        "%s handed over as %s@%s (%d files)",
        contender.name,
        handover.repo_id,
        handover.commit[:12],
        len(handover.files),
    )
    return handover


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


def place_contenders(
    contenders: list[Contender], acquired: Acquired, config: ReleaseConfig, host: HostSupport
) -> Placement:
    """Where each contender is measured (``fleet.place``). Outside a fleet every one is
    measured here and Prefect is asked nothing; in a fleet with a shared record (another
    host's result comes back through it), the other hosts whose card fits the release's
    settings (judged as the plan stage judges them, from the model's own headers) and every
    host's free slots now. A fleet that cannot be read leaves every contender here, with a
    warning."""
    current = settings()
    home = current.host_name
    here = Placement(home=home or "", hosts={c.name: home or "" for c in contenders})
    if home is None:
        return here
    logger = get_run_logger()
    if current.database_url is None:
        logger.warning(
            "fleet: the record is this host's own (LLM_RELEASE_DATABASE_URL unset), so no "
            "other host's measurement could be read back: every contender is measured here"
        )
        return here
    try:
        fleet = {card.name: card for card in release_fleet()}
        others = fleet_fits(
            config, host.host, folder_files(acquired.model_dir), list(fleet.values()), home
        )
        free = free_slots(home, others) if others else {}
    except (ReleaseError, ValueError, KeyError, httpx.HTTPError) as exc:
        logger.warning("fleet: not read (%s); every contender is measured on this host", exc)
        return here
    if not others:
        return here
    on_host = gpus.host_gpus()
    # each host's slots are its own GPUs': a server on every GPU holds 8 on a host of 8, 2 on
    # one of 2 (as tasks/slots.py counts them on the host that measures it)
    layouts = {name: [g.index for g in fleet[name].gpus] for name in others}
    seats = [
        Seat(
            name=c.name,
            role=c.role,
            slots=_slots_here(c, on_host),
            slots_on={
                h: max(1, placement.gpus_needed(c.serving, ids)) for h, ids in layouts.items()
            },
            settled=c.outcome is not None,
        )
        for c in contenders
    ]
    placed = place(seats, home, {c.name: [home, *others] for c in contenders}, free)
    shown = ", ".join(f"{h} {n}" for h, n in sorted(free.items()))
    for name, where in placed.away().items():
        logger.info("%s: measured on host %s (free slots: %s)", name, where, shown)
    for name in placed.queued:
        logger.warning(
            "%s: no host it fits has a free slot now (%s): queued on host %s until the "
            "first host it fits frees one",
            name,
            shown,
            placed.hosts[name],
        )
    return placed


def _slots_here(contender: Contender, on_host: Sequence[int]) -> int:
    """The slots its measurement holds on this host (one per GPU it needs; one on a CPU)."""
    return max(1, placement.gpus_needed(contender.serving, list(on_host)))


def _ended(started: Started) -> bool:
    return (started if isinstance(started, State) else started.state).is_final()


def seat_when_free(
    contenders: list[Contender],
    placed: Placement,
    started: Mapping[str, Started],
    here: Callable[[Contender], Started],
    away: Callable[[list[Contender], Placement], dict[str, Started]],
) -> dict[str, Started]:
    """Each contender queued here (``placed.waiting``) measured on whichever host it fits
    frees the slots it needs first, this host first (``fleet.seat_queued``): every host's free
    slots read again every ``POLL_S``, ``started`` (what is measured already) telling which
    of this host's measurements ended. Here it is measured as any other (``here``); on
    another host it is handed over and sent (``away``, as ``send_away`` does). A read that
    fails, or ``WAIT_S`` without a slot, measures every one still waiting here, where this
    host's slots queue it (tasks/slots.py). Nothing queued: nothing asked of Prefect."""
    if not placed.waiting:
        return {}
    logger = get_run_logger()
    by_name = {c.name: c for c in contenders}
    home = placed.home
    others = sorted({host for fits in placed.fits.values() for host in fits} - {home})
    on_host = gpus.host_gpus()
    # this host's own measurements: one that ended gives its slots back
    ours = {
        name: _slots_here(by_name[name], on_host)
        for name in started
        if placed.at_home(name) and by_name[name].outcome is None
    }
    sent: dict[str, Started] = {}
    logger.info(
        "%s wait for the first host they fit to free a slot (free slots: %s); read again "
        "every %.0f s, for at most %.0f s",
        _names(placed.waiting),
        ", ".join(f"{h} {n}" for h, n in sorted(placed.read.items())),
        POLL_S,
        WAIT_S,
    )
    deadline = time.monotonic() + WAIT_S
    while True:
        measuring = {**started, **sent}
        try:
            ended = [name for name in ours if _ended(measuring[name])]
            now = free_slots(home, others)
        except (ReleaseError, httpx.HTTPError) as exc:
            logger.warning(
                "fleet: free slots not read while waiting (%s); %s measured on this host",
                exc,
                _names(placed.waiting),
            )
            break
        seated = seat_queued(placed, now, sum(ours.pop(name) for name in ended))
        still = {seat.name for seat in seated.waiting}
        shown = ", ".join(f"{h} {n}" for h, n in sorted(now.items()))
        for seat in (seat for seat in placed.waiting if seat.name not in still):
            where = seated.hosts[seat.name]
            logger.info("%s: host %s has a free slot (%s): measured there", seat.name, where, shown)
            if where == home:
                sent[seat.name] = here(by_name[seat.name])
                ours[seat.name] = seat.needs(home)
            else:
                sent |= away([by_name[seat.name]], seated)
        placed = seated
        if not placed.waiting:
            return sent
        if time.monotonic() >= deadline:
            logger.warning(
                "%s: no host freed a slot in %.0f s; measured on this host, where it waits for one",
                _names(placed.waiting),
                WAIT_S,
            )
            break
        time.sleep(POLL_S)
    for seat in placed.waiting:
        sent[seat.name] = here(by_name[seat.name])
    return sent


def _names(seats: Sequence[Seat]) -> str:
    return ", ".join(seat.name for seat in seats)


def send_away(
    contenders: list[Contender],
    placed: Placement,
    hub: FleetHub,
    acquired: Acquired,
    config: ReleaseConfig,
    run_id: str,
    service: str,
) -> dict[str, PrefectFuture | State]:
    """Each contender placed on another host handed over through the fleet's hub (all at
    once), then sent to its host's queue (``measure_on_host``), with the other hosts it fits
    (home last) to measure it on should its host be lost. The baseline of a release whose
    source is a hub is not handed over (``from_upstream``, unless the operator keeps
    hand-overs): its host fetches it from that source at the commit acquired here, held to
    the hashes proven here (``upstream_handover``). One whose hand-over failed is a failed
    result naming why; it is not sent."""
    ordered = {c.name: OrderedContender.of(c) for c in contenders}  # held to the order's rules
    mode = settings().fleet_baseline
    upstream = {c.name for c in contenders if from_upstream(c.role, config.source.hub, mode)}
    handovers = {
        c.name: hand_over_contender.submit(c, hub, run_id, acquired.repo_id, acquired.commit)
        for c in contenders
        if c.name not in upstream
    }
    sent: dict[str, PrefectFuture | State] = {}
    for c in contenders:
        where = placed.hosts[c.name]
        if c.name in upstream:
            handover = _from_source(c, config.source, acquired, where)
        else:
            handover = _handed_over(handovers[c.name], where)
        if isinstance(handover, str):  # why it is not sent
            failed = CandidateResult(
                name=c.name,
                role=c.role,
                scheme=c.scheme,
                release_id=c.release_id,
                status="failed",
                error=handover,
            )
            sent[c.name] = failed_with(failed, f"{c.name}: {handover}")
            continue
        order = MeasureOrder(
            run_id=run_id,
            release_host=placed.home,
            contender=ordered[c.name],
            handover=handover,
            evaluation=config.evaluation,
            load=config.load,
            slo=slo_for(config.gates),
            public_name=service,
        )
        sent[c.name] = measure_on_host.submit(order, where, placed.spare.get(c.name, []))
    return sent


def _handed_over(future: PrefectFuture, host: str) -> Handover | str:
    """The contender's hand-over through the fleet's hub, or why there is none."""
    state = settled(future)
    handover = state.result(raise_on_failure=False)
    if isinstance(handover, Handover):
        return handover
    return f"not handed over to the fleet's hub for host {host}: " + (
        one_line(handover) if isinstance(handover, BaseException) else str(state.name)
    )


def _from_source(
    contender: Contender, source: SourceConfig, acquired: Acquired, host: str
) -> Handover | str:
    """The baseline's order to fetch it from the release's source (nothing uploaded), or why
    there is none."""
    try:
        handover = upstream_handover(source, acquired)
    except (ReleaseError, ValueError) as exc:
        return f"not to be fetched from the release's source by host {host}: {one_line(exc)}"
    get_run_logger().info(
        "%s: host %s fetches it from the release's source, %s@%s at %s (%d files, held to "
        "the hashes proven here); nothing handed over",
        contender.name,
        host,
        handover.repo_id,
        handover.commit[:12],
        handover.endpoint,
        len(handover.files),
    )
    return handover
