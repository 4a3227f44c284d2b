"""Host slots: one global concurrency limit that every serving and quantizing step takes,
so two runs on one host (a manual release beside the nightly one, a release started as a
subflow of model-update) queue instead of skewing each other's measurements."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from llm_release.settings import settings

HOST_LIMIT = "llm-release-host"


def lease_s() -> float:
    """How long a slot outlives a holder that died (SIGKILL, a lost host).

    Prefect 3.9 takes a global-concurrency slot under a lease that a thread of the holder
    renews every 0.75 x the lease; the server's repossessor (every 15 s by default) frees a
    lease that expired. A killed run therefore leaks its slot for at most lease + 15 s. A
    short lease costs one small API call per 0.75 x lease while the slot is held.
    """
    return settings().slot_lease_s


def ensure_host_limit(slots: int = 1) -> None:
    """Create the host's limit when it is missing (an existing one is left as the operator
    set it: `prefect gcl update llm-release-host --limit N` for a host with N GPUs)."""
    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(HOST_LIMIT)
            return
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=HOST_LIMIT, limit=slots, active=True)
            )
        except ObjectAlreadyExists:
            pass  # another run created it first


@contextmanager
def host_slot(what: str) -> Iterator[None]:
    """Hold one host slot while ``what`` runs; released on every exit path, and by the
    lease's expiry when the process is killed."""
    logger = get_run_logger()
    logger.info("%s: waiting for a host slot (%s)", what, HOST_LIMIT)
    # strict: a missing limit is an error, never a silent run without one (preflight
    # creates it; a deleted limit must not let two GPU runs collide).
    with concurrency(HOST_LIMIT, occupy=1, lease_duration=lease_s(), strict=True):
        logger.info("%s: host slot taken", what)
        yield
