"""Host slots: one global concurrency limit per host, one slot per GPU (one on a CPU host), that every
serving and quantizing step takes, so two runs on one host (a manual release beside the
nightly one, a release started as a subflow of model-update) queue instead of skewing each
other's measurements. A measurement holds as many slots as it needs GPUs, so candidates are
measured side by side on disjoint GPUs (``serving.placement``); every other step holds all
of them (it has the host to itself, as quantizing on GPU 0 needs).

The limit is ``llm-release-host``; on a host of a fleet (``LLM_RELEASE_HOST_NAME``, set by
``make fleet-join``) it is ``llm-release-host-<name>``, so hosts sharing one Prefect server
count their own GPUs (docs/fleet.md)."""

from __future__ import annotations

import concurrent.futures
import logging
import random
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from llm_release.errors import ConfigError
from llm_release.serving import gpus, placement
from llm_release.settings import settings

HOST_LIMIT = "llm-release-host"


def limit_name(host: str | None = None) -> str:
    """The Prefect limit of ``host`` (default: this one, ``settings().host_name``)."""
    name = host if host is not None else settings().host_name
    return f"{HOST_LIMIT}-{name}" if name else HOST_LIMIT


def lease_s() -> float:
    """How long a slot outlives a holder that died (SIGKILL, a lost host).

    Prefect 3.9 takes a global-concurrency slot under a lease that a thread of the holder
    renews every 0.75 x the lease; the server's repossessor (every 15 s by default) frees a
    lease that expired. A killed run therefore leaks its slot for at most lease + 15 s. A
    short lease costs one small API call per 0.75 x lease while the slot is held.
    """
    return settings().slot_lease_s


def ensure_host_limit(slots: int | None = None, host: str | None = None) -> int:
    """Create the host's limit when it is missing, one slot per GPU of this host by default
    (an existing one is left as the operator set it: `prefect gcl update llm-release-host
    --limit N`, e.g. the GPUs that serving releases leave free); the limit in force.
    ``host``: another host's name (``fleet join`` makes the limit of the host it declares)."""
    if slots is None:
        slots = placement.host_slots(gpus.host_gpus())
    name = limit_name(host)
    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name).limit
        except ObjectNotFound:
            pass
        try:
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=slots, active=True)
            )
        except ObjectAlreadyExists:  # another run created it first
            return client.read_global_concurrency_limit_by_name(name).limit
    return slots


def set_host_limit(slots: int) -> None:
    """The host's limit replaced by one of ``slots`` (what a comparison of slot counts
    needs: bench/side_by_side.py; an operator runs `prefect gcl update`)."""
    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name(limit_name())
        except ObjectNotFound:
            pass
    ensure_host_limit(slots)


def host_limit() -> int:
    """The host's slots (the limit as it is now)."""
    name = limit_name()
    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name).limit
        except ObjectNotFound:
            raise ConfigError(
                f"the host's concurrency limit {name!r} is missing",
                hint=f"start a release (it creates it) or 'prefect gcl create {name} "
                "--limit <GPUs of this host>'",
            ) from None


@contextmanager
def host_slot(what: str, occupy: int | None = None) -> Iterator[None]:
    """Hold ``occupy`` host slots (default: all of them) while ``what`` runs; released on
    every exit path, and by the lease's expiry when the process is killed."""
    logger = get_run_logger()
    _quiet_taken_now()
    slots = occupy or host_limit()
    name = limit_name()
    logger.info("%s: waiting for a host slot (%d of %s)", what, slots, name)
    with ExitStack() as held:
        while True:
            # strict: a missing limit is an error, never a silent run without one (preflight
            # creates it; a deleted limit must not let two GPU runs collide). One try at a
            # time, then a wait: Prefect's client queues every wait of one process for one
            # limit behind the first, so a 4-GPU measurement waiting for its slots would
            # hold back a 1-GPU one that fits now.
            try:
                held.enter_context(
                    concurrency(
                        name,
                        occupy=slots,
                        lease_duration=lease_s(),
                        strict=True,
                        max_retries=0,
                    )
                )
                break
            except ConcurrencySlotAcquisitionError as exc:
                retry_after = _locked_retry_after(exc)
                if retry_after is None:
                    raise
                time.sleep(retry_after + random.uniform(0, 0.5))
        logger.info("%s: host slot taken (%d)", what, slots)
        yield


class _TakenNow(logging.Filter):
    """Drops Prefect's ERROR line for one try that found every slot taken (HTTP 423): with
    ``max_retries=0`` that is the expected answer while a measurement waits, not an error.
    Every other failure of the service is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if len(args) != 2 or args[0] != "ConcurrencySlotAcquisitionWithLeaseService":
            return True
        future = args[1][-1] if isinstance(args[1], tuple) and args[1] else None
        if not isinstance(future, concurrent.futures.Future) or not future.done():
            return True
        error = future.exception()
        return not (isinstance(error, httpx.HTTPStatusError) and error.response.status_code == 423)


def _quiet_taken_now() -> None:
    service_log = logging.getLogger("prefect._internal.concurrency")
    if not any(isinstance(f, _TakenNow) for f in service_log.filters):
        service_log.addFilter(_TakenNow())


def _locked_retry_after(exc: ConcurrencySlotAcquisitionError) -> float | None:
    """The server's wait when the slots are all taken now (HTTP 423), at most 3 s (Prefect
    says up to 30 s for slots held for minutes: a freed slot would idle that long); None
    for any other failure, which is raised."""
    cause = exc.__cause__
    if not isinstance(cause, httpx.HTTPStatusError) or cause.response.status_code != 423:
        return None
    try:
        return min(3.0, max(0.5, float(cause.response.headers.get("Retry-After", 1))))
    except ValueError:
        return 1.0
