from __future__ import annotations

import base64
from pathlib import Path

from prefect import task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from llm_release.reporting.plots import write_plots
from llm_release.reporting.report import candidate_rows, with_plots, write_run_files
from llm_release.results import CandidateResult, Decision


@task(name="report", cache_policy=NO_CACHE)
def publish_report(
    run_dir: Path, markdown: str, payload: dict, results: list[CandidateResult], decision: Decision
) -> dict[str, str]:
    slo = ((payload.get("config") or {}).get("gates") or {}).get("ttft_p95_slo_s")
    plots = write_plots(run_dir, results, slo)
    markdown = with_plots(markdown, plots, run_dir)
    files = write_run_files(run_dir, markdown, payload, results)
    if plots:
        # The UI cannot read the run folder: the artifact carries the PNGs inline.
        create_markdown_artifact(
            key="release-plots",
            markdown="\n\n".join(
                f"**{caption}**\n\n![{caption}](data:image/png;base64,"
                f"{base64.b64encode(path.read_bytes()).decode()})"
                for caption, path in plots.items()
            ),
            description=f"plots ({run_dir / 'plots'})",
        )
    create_table_artifact(
        key="release-candidates",
        table=candidate_rows(results, decision),
        description=decision.summary,
    )
    create_markdown_artifact(
        key="release-report", markdown=markdown, description=f"release report ({files['markdown']})"
    )
    return files
