"""The operator's buttons in the Prefect UI: promote or roll back the live canary, and
evaluate the stable release (or any model folder) without a rollout. Thin flows over the
same functions as `llm-release canary promote|rollback`."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from pydantic import BaseModel, Field
from tabulate import tabulate

from flows.canary import install_alerts
from llm_release import paths, registry
from llm_release.canary import promote
from llm_release.config import EvalConfig, RolloutConfig, ServingConfig
from llm_release.errors import ConfigError, ReleaseError, StateError
from llm_release.evaluation.evaluate import run_evaluation
from llm_release.fileio import atomic_write_text
from llm_release.hub import local_source
from llm_release.results import EvalResult
from llm_release.serving import reasoning
from llm_release.serving.factory import make_server
from tasks.notify import emit_rollback
from tasks.publish import publish_winner
from tasks.slots import ensure_host_limit, host_slot


class OperatorError(ReleaseError):
    """An operator action refused: the run's state message is this one line."""


def _one_line(exc: ReleaseError) -> OperatorError:
    # The UI shows a failed run's message in the run list: what is wrong and how to fix it,
    # on one line (a ReleaseError's str puts the hint on a line of its own).
    return OperatorError(exc.one_line())


class ReleaseSummary(BaseModel):
    release_id: str
    candidate: str
    commit: str
    public_name: str
    drain: promote.DrainResult | None = Field(
        None, description="rollback: how the server left (outcome 'unknown': not confirmed empty)"
    )


def _summary(release: registry.Release) -> ReleaseSummary:
    return ReleaseSummary(
        release_id=release.release_id,
        candidate=release.candidate,
        commit=release.commit,
        public_name=release.public_name,
    )


@flow(name="promote")
def promote_canary(
    drain_timeout_s: Annotated[float, Field(ge=0, le=3600)] = 120,
    slo_ttft_p95_s: Annotated[float, Field(gt=0)] = 3.0,
) -> ReleaseSummary:
    """Promote the live canary to 100%: the old stable release drains and stops; the new
    stable release gets its alert rules.

    Args:
        drain_timeout_s: how long the old stable release may finish its requests
        slo_ttft_p95_s: the TTFT p95 SLO of the new stable release's alert rules
    """
    try:
        new = promote.promote(drain_timeout_s=drain_timeout_s)
    except ReleaseError as exc:
        raise _one_line(exc) from None
    get_run_logger().info("promoted %s: it is now stable at 100%%", new.release_id)
    install_alerts(new.release_id, new.public_name, slo_ttft_p95_s, RolloutConfig())
    publish_winner(new)
    return _summary(new)


@flow(name="rollback")
def rollback_canary(
    reason: Annotated[str, Field(min_length=1, max_length=500)] = "rolled back from the Prefect UI",
    drain_timeout_s: Annotated[float, Field(ge=0, le=3600)] = 120,
) -> ReleaseSummary:
    """Roll the live canary back: weight 0 at once, its requests finish, its server stops.
    The reason goes into the registry's history and a `llm-release.canary.rolled-back` event.

    Args:
        reason: why; recorded in the history and sent with the rollback's notification
        drain_timeout_s: how long the canary may finish its requests before it stops
    """
    reason = " ".join(reason.split())
    try:
        result = promote.rollback(drain_timeout_s=drain_timeout_s, reason=reason)
    except ReleaseError as exc:
        raise _one_line(exc) from None
    logger = get_run_logger()
    logger.warning("rolled back %s: %s", result.release_id, reason)
    if not result.drain.confirmed_empty:
        logger.error("drain %s: %s", result.drain.outcome, result.drain.detail)
    emit_rollback(result.release_id, reason)
    return _summary(result.release).model_copy(update={"drain": result.drain})


class EvalOnlyOutcome(BaseModel):
    target: str
    run_dir: str
    report: str
    scores: dict[str, dict[str, float]] = Field(description="eval set → metric → score")


def _model_folder(model_dir: str) -> Path:
    """``model_dir`` (a run parameter) when a run may serve it: inside the project's model
    folders or the operator's LLM_RELEASE_LOCAL_ROOTS (``local_source.served_folder``), and
    holding a config.json."""
    path = local_source.served_folder(model_dir)
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{path} is not a model folder (no config.json)",
            hint="give a folder that holds config.json and the weights",
        )
    return path


def _markdown(target: str, results: list[EvalResult], report: Path) -> str:
    lines = [
        f"# Evaluation of {target}",
        "",
        f"Report: `{report}`",
        "",
    ]
    rows = []
    for ev in results:
        for name, score in ev.metrics.items():
            ci = (
                f"{score.ci_low:.3f} – {score.ci_high:.3f}"
                if score.ci_low is not None and score.ci_high is not None
                else "–"
            )
            rows.append([ev.eval_set, name, f"{score.value:.3f}", ci, ev.num_items])
    headers = ["eval set", "metric", "score", "95% CI", "items"]
    lines.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    return "\n".join(lines) + "\n"


@flow(name="eval-only")
def eval_only(
    evaluation: EvalConfig,
    model_dir: str | None = None,
    serving: ServingConfig | None = None,
) -> EvalOnlyOutcome:
    """Run the eval sets against the stable release's live server, or against a model folder
    served for the occasion; nothing is rolled out. The scores are a markdown artifact.

    Args:
        evaluation: the eval sets, concurrency and item limit
        model_dir: a model folder (absolute path on the worker's host) to serve and
            evaluate, inside the project's model folders or LLM_RELEASE_LOCAL_ROOTS;
            empty: the live stable release
        serving: vLLM settings for model_dir; empty: the defaults
    """
    logger = get_run_logger()
    try:
        # A run's folder is checked before any work (no slot, no run folder).
        folder = _model_folder(model_dir) if model_dir else None
    except ReleaseError as exc:
        raise _one_line(exc) from None
    ensure_host_limit()
    run_id = (
        f"eval-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{(flow_run.get_id() or 'local')[:8]}"
    )
    run_dir = paths.runs_dir() / run_id
    try:
        if folder is not None:
            target = str(folder)
            with host_slot(f"evaluate {folder.name}"):
                server = make_server(
                    folder, ["eval-only"], serving or ServingConfig(), run_dir / "vllm.log"
                )
                with server:
                    results = run_evaluation(
                        server.base_url,
                        "eval-only",
                        evaluation.eval_sets,
                        run_dir / "eval",
                        num_concurrent=evaluation.concurrency(server.serving),
                        limit=evaluation.limit,
                        request_body=reasoning.request_body(folder, server.serving.thinking),
                    )
        else:
            stable = registry.load().stable
            if stable is None or not promote.release_alive(stable):
                raise StateError(
                    "there is no live stable release to evaluate",
                    hint="give model_dir, or run a release first ('llm-release canary status')",
                )
            target = f"stable release {stable.release_id}"
            # The live server: the evaluation shares the host with users, and with any
            # measurement another run would make, so it takes a host slot too.
            with host_slot(f"evaluate {stable.release_id}"):
                results = run_evaluation(
                    f"http://127.0.0.1:{stable.port}",
                    stable.public_name,
                    evaluation.eval_sets,
                    run_dir / "eval",
                    num_concurrent=evaluation.concurrency(None),
                    limit=evaluation.limit,
                    request_body=reasoning.request_body(
                        Path(stable.model_dir), stable.serving.thinking
                    ),
                )
    except ReleaseError as exc:
        raise _one_line(exc) from None
    report = run_dir / "eval-report.md"
    markdown = _markdown(target, results, report)
    atomic_write_text(report, markdown)
    atomic_write_text(
        run_dir / "eval-report.json",
        json.dumps([r.model_dump(mode="json") for r in results], indent=2) + "\n",
    )
    create_markdown_artifact(key="eval-only", markdown=markdown, description=f"eval of {target}")
    scores = {ev.eval_set: {m: s.value for m, s in ev.metrics.items()} for ev in results}
    logger.info("%s: %s", target, scores)
    return EvalOnlyOutcome(target=target, run_dir=str(run_dir), report=str(report), scores=scores)
