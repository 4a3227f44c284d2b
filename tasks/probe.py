from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_release.config import CandidateConfig, Gates, LoadProfile, ServingConfig
from llm_release.hardware import detect
from llm_release.serving.probe import HostSupport, PromptBound, check_host_support
from tasks.slots import host_slot


@task(name="probe-host", cache_policy=NO_CACHE)
def probe_host(
    model_dir: Path,
    candidates: list[CandidateConfig],
    serving: ServingConfig,
    load: LoadProfile | None = None,
    gates: Gates | None = None,
) -> HostSupport:
    """Which dtype to serve and which schemes the runtime can serve here, before building;
    with ``load`` and ``gates``, whether a candidate could meet the TTFT SLO at all."""
    bound = None
    if load is not None and gates is not None:
        bound = PromptBound(prompt_tokens=load.prompt_tokens, ttft_slo_s=gates.ttft_p95_slo_s)
    logger = get_run_logger()
    # The probe starts the serving runtime to time matmuls and try schemes: a host step.
    with host_slot("probe the host"):
        host = check_host_support(
            model_dir, candidates, serving, detect(), probe=serving.probe_schemes, bound=bound
        )
    logger.info("host: %s", host.describe())
    logger.info("served dtype %s: %s", host.served_dtype, host.dtype_reason)
    for support in host.schemes:
        log = logger.warning if support.status != "supported" else logger.info
        log(
            "%s (%s): %s%s — %s%s",
            support.candidate,
            support.scheme,
            support.status,
            " (cached)" if support.cached else f" ({support.seconds:.0f}s)",
            support.reason,
            f" (the probe server's log: {support.log})" if support.log else "",
        )
    return host
