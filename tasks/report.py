from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from llm_release.report import candidate_rows, write_run_files
from llm_release.results import CandidateResult, Decision


@task(name="report", cache_policy=NO_CACHE)
def publish_report(
    run_dir: Path, markdown: str, payload: dict, results: list[CandidateResult], decision: Decision
) -> dict[str, str]:
    files = write_run_files(run_dir, markdown, payload, results)
    create_table_artifact(
        key="release-candidates",
        table=candidate_rows(results, decision),
        description=decision.summary,
    )
    create_markdown_artifact(
        key="release-report", markdown=markdown, description=f"release report ({files['markdown']})"
    )
    return files
