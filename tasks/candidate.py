from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_release.candidate import measure
from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from llm_release.results import CandidateResult


@task(name="measure-candidate", cache_policy=NO_CACHE, task_run_name="measure-{name}")
def measure_candidate(
    name: str,
    scheme: str,
    model_dir: Path,
    tokenizer_dir: Path,
    serving: ServingConfig,
    evaluation: EvalConfig,
    load: LoadProfile,
    out_dir: Path,
    public_name: str,
) -> CandidateResult:
    """Serve, evaluate, load-test and tear down one candidate."""
    result = measure(
        name=name,
        scheme=scheme,
        model_dir=model_dir,
        tokenizer_dir=tokenizer_dir,
        serving=serving,
        evaluation=evaluation,
        load=load,
        out_dir=out_dir,
        public_name=public_name,
    )
    logger = get_run_logger()
    if result.status == "measured":
        logger.info("%s measured: %s", name, result.stage_seconds)
    else:
        logger.error("%s failed: %s", name, result.error)
    return result
