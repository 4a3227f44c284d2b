"""The operator's buttons in the Prefect UI: promote or roll back the live canary, and
evaluate the stable release (or any model folder) without a rollout. Thin flows over the
same functions as `llm-release canary promote|rollback`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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
from llm_release.canary.drain import DrainResult
from llm_release.config import EvalConfig, RolloutConfig, ServingConfig
from llm_release.errors import ConfigError, ReleaseError, StateError
from llm_release.evaluation.evaluate import run_evaluation
from llm_release.fileio import atomic_write_text
from llm_release.hub import local_source
from llm_release.results import EvalResult
from llm_release.serving import backends, reasoning
from llm_release.serving.factory import make_server
from tasks.notify import emit_rollback
from tasks.publish import publish_winner
from tasks.slots import ensure_host_limit, host_slot
from tasks.stage import StageClock


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
    drain: DrainResult | None = Field(
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
    with operator_errors():
        new = promote.promote(drain_timeout_s=drain_timeout_s)
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
    with operator_errors():
        result = promote.rollback(drain_timeout_s=drain_timeout_s, reason=reason)
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
    with operator_errors():
        target = eval_target(model_dir)  # before any work: no slot, no run folder
    ensure_host_limit()
    run_dir = paths.runs_dir() / eval_run_id()
    stage = StageClock()
    with stage("evaluate"), operator_errors():
        results = evaluate_target(target, evaluation, serving or ServingConfig(), run_dir)
    with stage("report"):
        return report_evaluation(target, results, run_dir)


@contextmanager
def operator_errors() -> Iterator[None]:
    """A ReleaseError leaves the flow as one line (the run's state message)."""
    try:
        yield
    except ReleaseError as exc:
        raise _one_line(exc) from None


@dataclass(frozen=True)
class EvalTarget:
    """What an eval-only run evaluates: a model folder to serve, or the live stable release."""

    label: str
    folder: Path | None = None
    stable: registry.Release | None = None


def eval_target(model_dir: str | None) -> EvalTarget:
    if model_dir:
        folder = _model_folder(model_dir)
        return EvalTarget(label=str(folder), folder=folder)
    stable = registry.load().stable
    if stable is None or not promote.release_alive(stable):
        raise StateError(
            "there is no live stable release to evaluate",
            hint="give model_dir, or run a release first ('llm-release canary status')",
        )
    problems = backends.port_problems(stable)  # lm-eval sends the servers' key there
    if problems:
        raise StateError(
            f"the stable release {stable.release_id}'s recorded {'; '.join(problems)}, not "
            "its server: it is not evaluated there (the servers' key is not sent)",
            hint="'make down' then 'make up' serves it again on ports of its own; check who "
            "edited the record",
        )
    return EvalTarget(label=f"stable release {stable.release_id}", stable=stable)


def eval_run_id() -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"eval-{stamp}-{(flow_run.get_id() or 'local')[:8]}"


def evaluate_target(
    target: EvalTarget, evaluation: EvalConfig, serving: ServingConfig, run_dir: Path
) -> list[EvalResult]:
    """The eval sets against the target, holding a host slot: a folder is served for the
    occasion; the live server shares the host with users and with any measurement another
    run would make."""
    if target.folder is not None:
        with host_slot(f"evaluate {target.folder.name}"):
            server = make_server(target.folder, ["eval-only"], serving, run_dir / "vllm.log")
            with server:
                return run_evaluation(
                    server.base_url,
                    "eval-only",
                    evaluation.eval_sets,
                    run_dir / "eval",
                    num_concurrent=evaluation.concurrency(server.serving),
                    limit=evaluation.limit,
                    request_body=reasoning.request_body(target.folder, server.serving.thinking),
                )
    stable = target.stable
    assert stable is not None
    with host_slot(f"evaluate {stable.release_id}"):
        return run_evaluation(
            f"http://127.0.0.1:{stable.port}",
            stable.public_name,
            evaluation.eval_sets,
            run_dir / "eval",
            num_concurrent=evaluation.concurrency(None),
            limit=evaluation.limit,
            request_body=reasoning.request_body(
                registry.recorded_model_dir(stable, "the stable release"), stable.serving.thinking
            ),
        )


def report_evaluation(
    target: EvalTarget, results: list[EvalResult], run_dir: Path
) -> EvalOnlyOutcome:
    """The scores as a report in the run folder (markdown and JSON) and a UI artifact."""
    report = run_dir / "eval-report.md"
    markdown = _markdown(target.label, results, report)
    atomic_write_text(report, markdown)
    atomic_write_text(
        run_dir / "eval-report.json",
        json.dumps([r.model_dump(mode="json") for r in results], indent=2) + "\n",
    )
    create_markdown_artifact(
        key="eval-only", markdown=markdown, description=f"eval of {target.label}"
    )
    scores = {ev.eval_set: {m: s.value for m, s in ev.metrics.items()} for ev in results}
    get_run_logger().info("%s: %s", target.label, scores)
    return EvalOnlyOutcome(
        target=target.label, run_dir=str(run_dir), report=str(report), scores=scores
    )
