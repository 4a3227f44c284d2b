from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_release.config import ReleaseConfig
from llm_release.decision.contenders import Contender
from llm_release.hardware import detect
from llm_release.serving.tune import tune_candidate
from tasks.slots import host_slot


@task(name="tune-candidate", cache_policy=NO_CACHE, task_run_name="tune-{contender.name}")
def tune_contender(
    contender: Contender, tokenizer_dir: Path, config: ReleaseConfig, out_dir: Path
) -> Contender:
    """The contender with the serving settings its tuning chose (measured and deployed with
    them); the champion keeps the settings it serves users with, and a contender that
    cannot go on is passed through."""
    if not config.tune.enabled or contender.outcome is not None or contender.role == "champion":
        return contender
    logger = get_run_logger()
    # Tuning starts servers and loads the host like a measurement: it takes a host slot.
    with host_slot(f"tune {contender.name}"):
        result, serving = tune_candidate(
            config.tune,
            model_dir=contender.model_dir,
            tokenizer_dir=tokenizer_dir,
            served_names=[contender.name],
            serving=contender.serving,
            load=config.load,
            gates=config.gates,
            host=detect(),
            out_dir=out_dir,
        )
    logger.info(
        "%s tuned: %s (goodput %d streams, %d server starts, %.0f s)",
        contender.name,
        result.chosen.label() if result.chosen else "nothing measured; settings kept",
        result.chosen_goodput,
        len(result.trials),
        result.seconds,
    )
    return contender.model_copy(update={"serving": serving, "tuning": result})
