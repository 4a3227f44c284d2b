from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_release.config import ReleaseConfig
from llm_release.hardware import detect
from llm_release.hub.credentials import HubToken
from llm_release.serving.capacity import fleet_fits, plan_release, read_release_model
from llm_release.settings import settings
from llm_release.sizing import CapacityPlan
from tasks.fleet import check_home, fleet_hub_access, release_fleet


@task(name="plan", cache_policy=NO_CACHE)
def plan_capacity(config: ReleaseConfig, token: HubToken | None = None) -> CapacityPlan:
    """Size the release from the repo's headers (a Hugging Face hub, ModelScope or a local
    folder) before any download; refuse what cannot fit (on a host of a fleet: with every
    host's figures). A release that another host of the fleet fits may be measured there
    (with a shared record), through the fleet's hub: a fleet that has none set is refused
    here, before the download."""
    logger = get_run_logger()
    check_home()  # a run pinned to a fleet host is planned there or nowhere
    files = read_release_model(config, token)
    # on a host of a fleet, every host's card is planned too (docs/fleet.md)
    host, fleet, own = detect(), release_fleet(), settings().host_name
    plan = plan_release(config, host, files, fleet, own)
    # measured elsewhere when this host's slots are taken (a shared record brings the
    # results back): through the fleet's hub, refused now when it is not set
    if (
        fleet
        and settings().database_url is not None
        and fleet_fits(config, host, files, fleet, own)
    ):
        fleet_hub_access()
    logger.info("plan (%d bytes of headers read): %s", files.bytes_read, plan.verdict)
    for note in plan.notes:  # what it did not model; in a fleet, the other hosts it fits
        logger.info("plan: %s", note)
    if config.serving.tensor_parallel_size == "auto" and plan.recommendation:
        logger.info(
            "tensor_parallel_size auto: %d GPU(s) per server, the smallest size that fits",
            plan.recommendation.tensor_parallel_size,
        )
    return plan
