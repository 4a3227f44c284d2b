from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from llm_release.acquire import Acquired, acquire, check_repo_contract, resolve
from llm_release.config import SourceConfig


@task(name="acquire", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def acquire_model(source: SourceConfig) -> Acquired:
    logger = get_run_logger()
    progress_id = create_progress_artifact(progress=0.0, description="model download")
    done = {"files": 0}

    def on_file(path: str, size: int) -> None:
        done["files"] += 1
        logger.info("verified %s (%d bytes)", path, size)
        update_progress_artifact(progress_id, progress=min(99.0, done["files"] * 5.0))

    acquired = acquire(source, progress=on_file)
    check_repo_contract(acquired.model_dir)
    update_progress_artifact(progress_id, progress=100.0)
    logger.info(
        "%s@%s in %s (%s, %d bytes fetched)",
        acquired.repo_id,
        acquired.commit[:12],
        acquired.model_dir,
        "reused" if acquired.reused else "downloaded",
        acquired.downloaded_bytes,
    )
    return acquired


@task(name="resolve-revision", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def resolve_revision(source: SourceConfig) -> str:
    commit, _ = resolve(source)
    return commit
