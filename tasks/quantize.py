from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_release.config import CandidateConfig
from llm_release.errors import ReleaseError
from llm_release.quantize import Quantized, quantize


@task(name="quantize", cache_policy=NO_CACHE, task_run_name="quantize-{candidate.name}")
def quantize_candidate(model_dir: Path, candidate: CandidateConfig) -> Quantized | str:
    """The quantized candidate, or the error text when llm-compressor failed for it."""
    logger = get_run_logger()
    try:
        result = quantize(model_dir, candidate)
    except ReleaseError as exc:
        logger.error("%s could not be quantized: %s", candidate.name, exc)
        return str(exc)
    logger.info(
        "%s: %s on %s in %.1fs -> %s",
        candidate.name,
        "cache hit" if result.cached else "quantized",
        result.device,
        result.seconds,
        result.model_dir,
    )
    return result
