from __future__ import annotations

import base64
from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from llm_release.errors import ReleaseError
from llm_release.reporting import lineage
from llm_release.reporting.plots import write_plots
from llm_release.reporting.report import ReleaseReport, candidate_rows, with_plots


@task(name="report", cache_policy=NO_CACHE)
def publish_report(run_dir: Path, report: ReleaseReport) -> dict[str, str]:
    """``report.md`` (with the plots), ``report.json`` and ``items.csv`` in ``run_dir``, and
    the same as Prefect artifacts; the files' paths by kind."""
    plots = write_plots(run_dir, report.results, report.config.gates.ttft_p95_slo_s)
    markdown = with_plots(report.to_markdown(), plots, run_dir)
    files = report.write_files(run_dir, markdown)
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
        table=candidate_rows(report.results, report.decision),
        description=report.decision.summary,
    )
    create_markdown_artifact(
        key="release-report", markdown=markdown, description=f"release report ({files['markdown']})"
    )
    return files


@task(name="lineage", cache_policy=NO_CACHE)
def publish_lineage(run_id: str) -> list[str]:
    """The lineage of the releases this run deployed, read back from the record (what
    ``llm-release history SERVICE`` prints), as the run's ``release-lineage`` artifact; the
    release ids (none: nothing deployed, no artifact)."""
    try:
        lines = [line for line in lineage.history() if line.run_id == run_id]
    except ReleaseError as exc:
        # The release is done and recorded; a record that cannot be read back costs the
        # artifact, not the run.
        get_run_logger().warning("no lineage artifact: %s", exc.one_line())
        return []
    if lines:
        services = sorted({line.service for line in lines})
        command = " or ".join(f"`llm-release history {s} --json`" for s in services)
        create_markdown_artifact(
            key="release-lineage",
            markdown=f"{lineage.to_markdown(lines)}\n\nThe whole record: {command}.",
            description="where the deployed releases came from and why (the release record)",
        )
    return [line.release_id for line in lines]
