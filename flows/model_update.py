"""Scheduled model update: judge a commit once; release only when upstream moved to a
commit not yet judged under the same config and eval sets."""

from __future__ import annotations

from typing import Literal

from prefect import flow, get_run_logger
from pydantic import BaseModel

from flows.cli import cli_config, run_cli
from flows.release import ReleaseOutcome, release
from llm_release import registry
from llm_release.canary.promote import release_alive
from llm_release.config import ReleaseConfig
from llm_release.decision import decisions
from llm_release.reporting.lineage import shown
from tasks.acquire import hub_access, resolve_revision
from tasks.states import completed_with_failures


class UpdateOutcome(BaseModel):
    status: Literal["up-to-date", "already-judged", "canary-live", "judged"]
    commit: str
    detail: str
    release: ReleaseOutcome | None = None


@flow(name="model-update", persist_result=True, result_serializer="json")
def model_update(config: ReleaseConfig) -> UpdateOutcome:
    """Resolve the upstream revision; release it when it is new to this service."""
    logger = get_run_logger()
    source, token = hub_access(config.source)
    commit = resolve_revision(source, token)
    state = registry.load()
    repo = config.source.repo_id

    def done(status: str, detail: str) -> UpdateOutcome:
        logger.info("%s@%s → %s: %s", repo, config.source.revision, commit[:12], detail)
        return UpdateOutcome(status=status, commit=commit, detail=detail)

    if state.canary is not None and release_alive(state.canary):
        return done(
            "canary-live",
            f"a canary is live ({state.canary.release_id} at {state.canary_weight}%): "
            "promote or roll it back first; nothing to do until then",
        )
    if any(r and r.repo_id == repo and r.commit == commit for r in (state.stable, state.canary)):
        return done("up-to-date", "already released")
    if not config.force:
        judged = decisions.find(config, commit)
        if judged is not None:
            return done(
                "already-judged",
                # the record's texts, inert (a terminal's escapes, line breaks)
                f"judged on {judged.at} in run {shown(judged.run_id)} with this config and "
                f"these eval sets: {shown(judged.verdict)} — {shown(judged.summary)} (set "
                "force: true to judge again)",
            )
    logger.info("%s@%s moved to %s: releasing", repo, config.source.revision, commit[:12])
    pinned = config.model_copy(
        update={"source": config.source.model_copy(update={"revision": commit})}
    )
    outcome = release(pinned)
    update = UpdateOutcome(status="judged", commit=commit, detail=outcome.summary, release=outcome)
    # The release's failed candidates show on this run too (the nightly run is what a team sees).
    return completed_with_failures(update, outcome.failed)


def main() -> None:
    run_cli(
        model_update,
        cli_config("Check the hub once; release a new commit (in-process)."),
        UpdateOutcome,
    )


if __name__ == "__main__":
    main()
