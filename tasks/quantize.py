from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State

from llm_release.decision.contenders import Contender
from llm_release.errors import ReleaseError
from llm_release.quantization.quantize import quantize
from tasks.slots import host_slot
from tasks.states import failed_with


@task(name="quantize", cache_policy=NO_CACHE, task_run_name="quantize-{contender.name}")
def build_contender(contender: Contender, base_dir: Path) -> Contender | State:
    """The contender with its quantized model folder, or a Failed task run carrying the
    contender with its failed result (the release goes on with the others)."""
    if contender.role != "quantized" or contender.outcome is not None:
        return contender
    logger = get_run_logger()
    try:
        with host_slot(f"quantize {contender.name}"):
            result = quantize(base_dir, contender.recipe)
    except ReleaseError as exc:
        logger.error("%s could not be quantized: %s", contender.name, exc)
        failed = contender.failed("failed", f"quantization failed: {exc}")
        return failed_with(failed, f"{contender.name}: quantization failed: {exc.one_line()}")
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
