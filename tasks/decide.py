from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from llm_release.config import Gates
from llm_release.decision.select import decide
from llm_release.results import CandidateResult, Decision


@task(name="select", cache_policy=NO_CACHE)
def select_winner(results: list[CandidateResult], gates: Gates) -> Decision:
    decision = decide(results, gates)
    get_run_logger().info(decision.summary)
    return decision
