"""A human decides an inconclusive gate: the release flow pauses with the evidence and a
typed form (approve / reject, comment) in the Prefect UI; no answer in time rejects."""

from __future__ import annotations

from prefect import get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import Field

from llm_release.config import ReviewConfig
from llm_release.decision.select import apply_review
from llm_release.reporting.report import review_evidence
from llm_release.results import CandidateResult, Decision

# How often the paused flow asks the API whether it was resumed.
POLL_S = 2


class ReviewAnswer(RunInput):
    approve: bool = Field(False, description="approve the candidate for the canary")
    comment: str = Field("", max_length=500, description="why; recorded in the report")


def ask_reviewer(
    decision: Decision, results: list[CandidateResult], review: ReviewConfig
) -> Decision:
    if decision.review is None:
        return decision
    logger = get_run_logger()
    if review.auto is not None:
        note = f"automatic {review.auto} (review.auto is set in the release config)"
        logger.warning("%s: %s", decision.review, note)
        return apply_review(decision, review.auto == "approve", note)
    evidence = review_evidence(decision, results)
    create_markdown_artifact(
        key="release-review", markdown=evidence, description=f"review {decision.review}"
    )
    logger.warning(
        "%s awaits review: resume this run in the Prefect UI (approve / reject) within %d s",
        decision.review,
        review.timeout_s,
    )
    try:
        answer = pause_flow_run(
            wait_for_input=ReviewAnswer.with_initial_data(description=evidence),
            timeout=review.timeout_s,
            poll_interval=POLL_S,
        )
    except FlowPauseTimeout:
        return apply_review(decision, False, f"no answer within {review.timeout_s} s")
    verdict = "approved" if answer.approve else "rejected"
    return apply_review(decision, answer.approve, answer.comment.strip() or verdict)
