from __future__ import annotations

import threading
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE

from blocks.hub import HubCredentials
from llm_release.config import SourceConfig
from llm_release.errors import ConfigError
from llm_release.hub import credentials
from llm_release.hub.acquire import Acquired, acquire, check_repo_contract, resolve
from llm_release.hub.credentials import HubToken
from llm_release.hub.handover import Handover, receive


def hub_access(source: SourceConfig) -> tuple[SourceConfig, HubToken | None]:
    """The source's endpoint past the endpoint policy, and with a saved block the block's
    token bound to the block's own endpoint: a run form (or a measure order) that names
    another endpoint with the block is refused here, before any request. Never the
    environment."""
    name = source.credentials_block
    try:
        block = HubCredentials.load(name) if name else None
    except ValueError:  # Prefect's answer for a block that is not saved
        raise ConfigError(
            f"source.credentials_block: no HubCredentials block {name!r} is saved on this "
            "host's Prefect server",
            hint="save the block (the hub's endpoint and a read token) on the Prefect server "
            "every host of the fleet uses, or fix source.credentials_block",
        ) from None
    return bind_hub_access(source, block)


def bind_hub_access(
    source: SourceConfig, block: HubCredentials | None
) -> tuple[SourceConfig, HubToken | None]:
    if source.hub == "local":
        return source, None
    token = None
    if block is not None:
        if source.hub == "modelscope" and not block.endpoint:
            raise ConfigError(
                f"credentials block {source.credentials_block!r} names no endpoint (it is for "
                "huggingface.co) and the source is a ModelScope hub",
                hint="save a block with the ModelScope endpoint its token is for",
            )
        endpoint, token = credentials.saved_token(
            source.endpoint, block.endpoint, block.token, block=source.credentials_block or ""
        )
        source = source.model_copy(update={"endpoint": endpoint})
    if source.endpoint:
        credentials.check_hub_endpoint(source.endpoint)
    return source, token


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
    token is the one saved for that hub (``credentials.token_for``), never a parameter's.

    A baseline fetched from the release's source (``handover.upstream``) comes from there:
    the source's credentials block, named in the order, is loaded here (the fleet's Prefect
    server) and its token bound to the block's own endpoint as the release host binds it
    (``hub_access``: an order naming another endpoint with it is refused, and the endpoint
    policy applies), then the download is held to the hashes the release host proved."""
    token = None
    if handover.upstream is not None:
        _, token = hub_access(handover.source())
    folder = receive(handover, token=token)
    get_run_logger().info(
        "%s@%s %s and proven: %d files in %s",
        handover.repo_id,
        handover.commit[:12],
        f"fetched from {handover.endpoint}" if handover.upstream else "received",
        len(handover.files),
        folder,
    )
    return folder
