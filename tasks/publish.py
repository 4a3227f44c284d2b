"""Publish the release that reached 100% to the operator's hub (off unless
LLM_RELEASE_PUBLISH_REPO is set). A failure is logged, never raised: the release is
already serving, and publishing can be run again."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from llm_release.canary.publish import publish_release
from llm_release.errors import ReleaseError, one_line
from llm_release.hub.publish import Published
from llm_release.registry import Release


@task(name="publish", cache_policy=NO_CACHE)
def publish_winner(release: Release) -> Published | None:
    logger = get_run_logger()
    try:
        published = publish_release(release, progress=logger.info)
    except ReleaseError as exc:
        logger.error("%s not published: %s", release.release_id, one_line(exc))
        return None
    if published is None:
        return None
    create_markdown_artifact(
        key="published",
        markdown=f"**{release.release_id}** published as `{published.repo_id}` commit "
        f"`{published.commit}` on {published.endpoint} ({len(published.files)} files, "
        "model card included)",
        description=f"{release.release_id} published",
    )
    return published
