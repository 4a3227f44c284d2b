from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_release.canary.promote import deploy
from llm_release.registry import RegistryState
from llm_release.results import DeployTarget
from tasks.slots import host_slot


@task(name="promote", cache_policy=NO_CACHE)
def promote_release(
    stable_target: DeployTarget | None,
    canary_target: DeployTarget | None,
    public_name: str,
    canary_weight: int,
    router_port: int | None,
) -> RegistryState:
    # Starting the servers (a compile on first start) is a host step; serving afterwards is
    # the release's job and holds no slot.
    with host_slot("deploy"):
        state = deploy(
            stable_target,
            canary_target,
            public_name=public_name,
            canary_weight=canary_weight,
            router_port=router_port,
        )
    logger = get_run_logger()
    logger.info("stable: %s", state.stable.release_id if state.stable else None)
    logger.info(
        "canary: %s at %d%%", state.canary.release_id if state.canary else None, state.canary_weight
    )
    return state
