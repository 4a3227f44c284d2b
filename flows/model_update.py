"""Scheduled model update: release only when the upstream revision moved."""

from __future__ import annotations

from prefect import flow, get_run_logger

from flows.release import release
from llm_release import registry
from llm_release.config import SourceConfig
from llm_release.demo_model import DEMO_REPO_ID
from tasks.acquire import resolve_revision


@flow(name="model-update")
def model_update(
    repo_id: str = DEMO_REPO_ID,
    revision: str = "main",
    hub_endpoint: str | None = None,
    release_parameters: dict | None = None,
) -> dict:
    """Resolve the upstream revision; when it differs from the stable release, run a release."""
    logger = get_run_logger()
    source = SourceConfig(repo_id=repo_id, revision=revision, endpoint=hub_endpoint)
    commit = resolve_revision(source)
    state = registry.load()
    released = {r.commit for r in (state.stable, state.canary) if r and r.repo_id == repo_id}
    if commit in released:
        logger.info("%s@%s is %s: already released, nothing to do", repo_id, revision, commit[:12])
        return {"status": "up-to-date", "commit": commit}
    logger.info("%s@%s moved to %s: releasing", repo_id, revision, commit[:12])
    outcome = release(
        repo_id=repo_id, revision=commit, hub_endpoint=hub_endpoint, **(release_parameters or {})
    )
    return {"status": "released", "commit": commit, **outcome}
