from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State

from llm_release.config import EvalConfig, LoadProfile
from llm_release.decision import measurements
from llm_release.decision.candidate import measure
from llm_release.decision.contenders import Contender
from llm_release.results import CandidateResult, Slo
from llm_release.serving import gpus, placement
from llm_release.serving.probe import HostSupport
from tasks.slots import host_limit, host_slot
from tasks.states import failed_with, first_line


@task(name="measure-candidate", cache_policy=NO_CACHE, task_run_name="measure-{contender.name}")
def measure_contender(
    contender: Contender,
    tokenizer_dir: Path,
    evaluation: EvalConfig,
    load: LoadProfile,
    host: HostSupport,
    out_dir: Path,
    public_name: str,
    run_id: str,
    slo: Slo | None = None,
) -> CandidateResult | State:
    """Serve, evaluate, load-test and tear down one contender; the champion's measurement
    is reused when nothing it depends on changed (measurements.fingerprint). A candidate
    that failed ends as a Failed task run carrying its result (a skipped one, which this
    host cannot serve, is no failure)."""
    logger = get_run_logger()
    if contender.outcome is not None:
        logger.warning(
            "%s: %s — %s", contender.name, contender.outcome.status, contender.outcome.error
        )
        if contender.outcome.status == "failed":
            return failed_with(
                contender.outcome, f"{contender.name}: {first_line(contender.outcome.error)}"
            )
        return contender.outcome
    fingerprint = measurements.fingerprint(
        contender.model_dir, contender.serving, evaluation, load, host
    )
    identity = {
        "name": contender.name,
        "role": contender.role,
        "scheme": contender.scheme,
        "release_id": contender.release_id,
        "fingerprint": fingerprint,
        "tuning": contender.tuning,
    }
    if contender.role == "champion":
        found = measurements.find(fingerprint)
        if found is not None:
            stored, from_run = found
            logger.info(
                "%s: measurement of run %s reused (nothing changed)", contender.name, from_run
            )
            return stored.model_copy(update=identity | {"reused_from": from_run})
    # As many host slots as GPUs it needs: candidates are measured side by side on disjoint
    # GPUs, and one that needs more GPUs than are free waits (one slot on a CPU host).
    occupy = placement.slots_for(contender.serving, gpus.host_gpus(), host_limit())
    with host_slot(f"measure {contender.name}", occupy):
        result = measure(
            name=contender.name,
            scheme=contender.scheme,
            model_dir=contender.model_dir,
            tokenizer_dir=tokenizer_dir,
            serving=contender.serving,
            evaluation=evaluation,
            load=load,
            out_dir=out_dir,
            public_name=public_name,
            run_id=run_id,
            slo=slo,
        ).model_copy(update=identity)
    if result.status == "measured":
        measurements.save(result, run_id)
        logger.info("%s measured: %s", contender.name, result.stage_seconds)
    else:
        logger.error("%s failed: %s", contender.name, result.error)
        return failed_with(result, f"{contender.name}: {first_line(result.error)}")
    return result
