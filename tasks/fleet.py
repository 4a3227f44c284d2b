"""The fleet as a release reads it: every host that joined the project's work pool (its
queue ``host-<name>``) with the card it declared (a Prefect Variable), each host's free slots
now, and the fleet's hub candidates are handed over through. A card is input: anyone with
the API can edit a Variable, so one that does not validate is left out."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import httpx

from llm_release.errors import ConfigError
from llm_release.fleet import (
    HOST_NAME,
    POOL,
    QUEUE_PREFIX,
    VARIABLE_PREFIX,
    HostCard,
    wrong_home,
)
from llm_release.hub.handover import FleetHub, fleet_hub
from llm_release.settings import env_name, settings
from tasks.slots import limit_name

log = logging.getLogger(__name__)


def card_of(name: str) -> HostCard | None:
    """``name``'s card (None: none declared, one that does not validate, or one that names
    another host)."""
    from prefect.variables import Variable

    raw = Variable.get(VARIABLE_PREFIX + name, default=None)
    try:
        card = HostCard.model_validate(raw)
    except ValueError:
        return None
    return card if card.name == name else None


def host_queues() -> list[str]:
    """The names of the hosts that joined: the pool's ``host-<name>`` queues."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            queues = client.read_work_queues(work_pool_name=POOL)
        except ObjectNotFound:
            return []
    names = [q.name.removeprefix(QUEUE_PREFIX) for q in queues if q.name.startswith(QUEUE_PREFIX)]
    return sorted(n for n in names if HOST_NAME.fullmatch(n))


def check_home() -> None:
    """Refuse a release run that a worker of another host took from its home's queue
    (``llm_release.fleet.wrong_home``): measured there, its slots, GPU claims and
    hand-overs would be another host's. A run outside a deployment has no queue."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    run = context.flow_run if context else None
    queue = run.work_queue_name if run else None
    if run is not None and queue is None and run.parent_task_run_id is not None:
        queue = root_queue()  # a release inside a model-update: the queue its run came from
    why = wrong_home(queue, settings().host_name)
    if why:
        home = queue.removeprefix(QUEUE_PREFIX)
        raise ConfigError(
            why,
            hint=f"only host {home}'s worker polls {queue}: start it there with 'make "
            f"fleet-join HOST={home}', and give no other worker that queue",
        )


def root_queue() -> str | None:
    """The work queue of the flow run this subflow runs in (a subflow's own run has none)."""
    from prefect.client.orchestration import get_client
    from prefect.runtime import flow_run

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run.root_flow_run_id).work_queue_name


def release_fleet() -> list[HostCard]:
    """The cards a release on this host plans against: none on a host outside a fleet
    (``LLM_RELEASE_HOST_NAME`` unset: no Prefect call), else every host's that validates.
    A Prefect API that does not answer leaves the release to this host's figures, said once."""
    if settings().host_name is None:
        return []
    try:
        cards = [card_of(name) for name in host_queues()]
    except httpx.HTTPError as exc:
        log.warning("fleet: the hosts' cards could not be read (%s); planned for this host", exc)
        return []
    return [card for card in cards if card is not None]


def host_limits(client, hosts: Sequence[str]) -> dict[str, Any]:
    """Each host's slot limit (Prefect's global concurrency limit ``limit_name(host)``), read
    by name: a list of every limit on the server would be one page of it. None: no limit."""
    from prefect.exceptions import ObjectNotFound

    found: dict[str, Any] = {}
    for name in hosts:
        try:
            found[name] = client.read_global_concurrency_limit_by_name(limit_name(name))
        except ObjectNotFound:
            found[name] = None
    return found


def free_slots(home: str, others: Sequence[str]) -> dict[str, int]:
    """Each host's free slots now: its Prefect limit (``tasks/slots.limit_name``) less the
    slots held. 0 for a host whose limit is missing (its runs would fail on it), and for a
    host of ``others`` whose worker is not ONLINE: a run sent there would wait on a queue
    nobody polls. Home's own runs need no worker (this process measures them)."""
    from prefect.client.orchestration import get_client

    hosts = [home, *others]
    with get_client(sync_client=True) as client:
        online = {
            w.name
            for w in client.read_workers_for_work_pool(POOL)
            if w.status is not None and w.status.value == "ONLINE"
        }
        limits = host_limits(client, hosts)
    free = {}
    for name in hosts:
        limit = limits[name]
        left = limit.limit - limit.active_slots if limit is not None else 0
        free[name] = max(0, left) if name == home or name in online else 0
    return free


def fleet_hub_access() -> FleetHub:
    """The fleet's hub from the operator's settings, its write token from the HubCredentials
    block they name (bound to that block's endpoint, which must be the fleet hub's); a
    one-line ConfigError when unset."""
    from blocks.hub import HubCredentials

    name = settings().fleet_hub_credentials
    if not name:
        return fleet_hub()
    try:
        block = HubCredentials.load(name)
    except ValueError:  # Prefect's answer for a block that is not saved
        raise ConfigError(
            f"{env_name('fleet_hub_credentials')}: no HubCredentials block {name!r} is saved",
            hint="save one with the fleet hub's endpoint and a write token (docs/fleet.md), "
            f"or fix {env_name('fleet_hub_credentials')}",
        ) from None
    return fleet_hub(block.endpoint, block.token)
