from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_release.contenders import Contender
from llm_release.errors import ReleaseError
from llm_release.quantize import quantize


@task(name="quantize", cache_policy=NO_CACHE, task_run_name="quantize-{contender.name}")
def build_contender(contender: Contender, base_dir: Path) -> Contender:
    """The contender with its quantized model folder, or with a failed result."""
    if contender.role != "quantized" or contender.outcome is not None:
        return contender
    logger = get_run_logger()
    try:
        result = quantize(base_dir, contender.recipe)
    except ReleaseError as exc:
        logger.error("%s could not be quantized: %s", contender.name, exc)
        return contender.failed("failed", f"quantization failed: {exc}")
    logger.info(
        "%s: %s on %s (%s) in %.1fs -> %s",
        contender.name,
        "cache hit" if result.cached else "quantized",
        result.device,
        result.compute_dtype,
        result.seconds,
        result.model_dir,
    )
    return contender.model_copy(update={"model_dir": result.model_dir})
