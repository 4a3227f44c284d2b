from __future__ import annotations

import threading
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from llm_release.config import SourceConfig
from llm_release.hub.acquire import Acquired, acquire, check_repo_contract, resolve
from llm_release.hub.credentials import HubToken
from llm_release.hub.handover import Handover, receive


@task(name="acquire", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def acquire_model(source: SourceConfig, token: HubToken | None = None) -> Acquired:
    """``token`` (a block's, bound to its endpoint) stays a SecretStr until the hub client
    gets it: Prefect shows it masked."""
    logger = get_run_logger()
    progress_id = create_progress_artifact(progress=0.0, description="model download")
    seen = {"bytes": 0, "total": 0, "reported": 0.0}
    lock = threading.Lock()

    def on_start(total: int, files: int) -> None:
        seen["total"] = total
        logger.info("fetching and verifying %d files, %.1f MB", files, total / 1e6)

    def on_bytes(_path: str, count: int) -> None:
        with lock:
            seen["bytes"] += count
            percent = 100.0 * seen["bytes"] / seen["total"] if seen["total"] else 0.0
            # An artifact update is an API call: one per 5% is plenty.
            if percent - seen["reported"] >= 5:
                seen["reported"] = percent
                update_progress_artifact(progress_id, progress=min(percent, 99.0))

    acquired = acquire(
        source,
        progress=on_bytes,
        on_start=on_start,
        token=token,
    )
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
def resolve_revision(source: SourceConfig, token: HubToken | None = None) -> str:
    commit, _ = resolve(source, token=token)
    return commit


@task(name="receive", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def receive_candidate(handover: Handover) -> Path:
    """A candidate another host handed over through the hub, on this host: its commit
    downloaded (every file proven), then held to the hashes the hand-over carried. The
    token is the one saved for that hub (``credentials.token_for``), never a parameter's."""
    folder = receive(handover)
    get_run_logger().info(
        "%s@%s received and proven: %d files in %s",
        handover.repo_id,
        handover.commit[:12],
        len(handover.files),
        folder,
    )
    return folder
