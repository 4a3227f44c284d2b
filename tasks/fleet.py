"""The fleet's cards as a release reads them: every host that joined the project's work pool
(its queue ``host-<name>``) with the card it declared (a Prefect Variable). A card is input:
anyone with the API can edit a Variable, so one that does not validate is left out."""

from __future__ import annotations

import logging

import httpx

from llm_release.fleet import HOST_NAME, POOL, QUEUE_PREFIX, VARIABLE_PREFIX, HostCard
from llm_release.settings import settings

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
