"""The release flow: acquire → probe the host → quantize → measure the champion and every
challenger → select (a human reviews what a gate could not decide) → promote → report."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.exceptions import ParameterTypeError
from prefect.runtime import flow_run
from pydantic import BaseModel, ValidationError

from blocks.hub import HubCredentials
from demo.demo_model import DEMO_REPO_ID
from flows.canary import install_alerts, walk_canary
from flows.review import ask_reviewer
from llm_release import paths, registry
from llm_release.canary.promote import DeployTarget
from llm_release.canary.rollout import RolloutOutcome
from llm_release.config import ReleaseConfig, SourceConfig
from llm_release.decision import decisions
from llm_release.decision.contenders import Contender, plan_contenders
from llm_release.errors import ConfigError, ReleaseError, one_line
from llm_release.fileio import atomic_write_text
from llm_release.hub import credentials
from llm_release.hub.credentials import HubToken
from llm_release.load.loadtest import slo_for
from llm_release.preflight import check
from llm_release.reporting.report import render_markdown
from llm_release.results import CandidateResult
from llm_release.serving.backends import sweep_containers
from tasks.acquire import acquire_model
from tasks.candidate import measure_contender
from tasks.decide import select_winner
from tasks.plan import plan_serving
from tasks.probe import probe_host
from tasks.promote import promote_release
from tasks.quantize import build_contender
from tasks.report import publish_report
from tasks.slots import ensure_host_limit
from tasks.states import completed_with_failures, value_of
from tasks.tune import tune_contender


class ReleaseOutcome(BaseModel):
    run_id: str
    run_dir: str
    report: str
    commit: str
    winner: str | None
    stable: str | None
    summary: str
    verdict: str
    deployment: dict[str, str | None]
    stage_seconds: dict[str, float]
    host: str
    skipped: dict[str, str | None]
    failed: dict[str, str | None] = {}
    canary: RolloutOutcome | None = None


def hub_access(source: SourceConfig) -> tuple[SourceConfig, HubToken | None]:
    """The source's endpoint past the endpoint policy, and with a saved block the block's
    token bound to the block's own endpoint: a run form that names another endpoint with
    the block is refused here, before any request. Never the environment."""
    block = HubCredentials.load(source.credentials_block) if source.credentials_block else None
    return bind_hub_access(source, block)


def bind_hub_access(
    source: SourceConfig, block: HubCredentials | None
) -> tuple[SourceConfig, HubToken | None]:
    if source.hub == "local":
        return source, None
    token = None
    if block is not None:
        if source.hub == "modelscope" and not block.endpoint:
            raise ConfigError(
                f"credentials block {source.credentials_block!r} names no endpoint (it is for "
                "huggingface.co) and the source is a ModelScope hub",
                hint="save a block with the ModelScope endpoint its token is for",
            )
        endpoint, token = credentials.saved_token(
            source.endpoint, block.endpoint, block.token, block=source.credentials_block or ""
        )
        source = source.model_copy(update={"endpoint": endpoint})
    if source.endpoint:
        credentials.check_hub_endpoint(source.endpoint)
    return source, token


# Results are persisted (as JSON, never pickle) so that a caller that started the run through
# the deployment and a worker (`--deployment`, `make demo`) reads the same typed outcome.
@flow(name="release", persist_result=True, result_serializer="json")
def release(config: ReleaseConfig) -> ReleaseOutcome:
    """Release a model: the champion and every challenger are measured alike; the winner
    goes out as a canary. A run in which a candidate failed ends "Completed with failed
    candidates", naming them; a direct call still returns the ReleaseOutcome."""
    logger = get_run_logger()
    champion, service_name = check(config)
    if config.serving.backend == "docker":
        # Containers a killed run of this home left behind (by label; never the registry's).
        for removed in sweep_containers(paths.home(), everything=False):
            logger.warning("removed a leftover %s", removed)
    ensure_host_limit()
    run_id = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{(flow_run.get_id() or 'local')[:8]}"
    run_dir = paths.runs_dir() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    def timed(stage: str, started: float) -> None:
        seconds[stage] = round(time.monotonic() - started, 1)

    source, token = hub_access(config.source)
    mark = time.monotonic()
    sizing = plan_serving(config.model_copy(update={"source": source}), token)
    timed("plan", mark)

    mark = time.monotonic()
    acquired = acquire_model(source, token)
    timed("acquire", mark)

    mark = time.monotonic()
    host = probe_host(acquired.model_dir, config.candidates, config.serving)
    timed("probe", mark)

    mark = time.monotonic()
    plan = plan_contenders(config, acquired.model_dir, acquired.commit, host, champion)
    plan = [
        value_of(build_contender(c, acquired.model_dir, return_state=True), Contender) for c in plan
    ]
    timed("quantize", mark)

    if config.tune.enabled:
        mark = time.monotonic()
        plan = [
            tune_contender(c, acquired.model_dir, config, run_dir / "candidates" / c.name / "tune")
            for c in plan
        ]
        timed("tune", mark)

    mark = time.monotonic()
    results = [
        measure_contender(
            c,
            acquired.model_dir,
            config.evaluation,
            config.load,
            host,
            run_dir / "candidates" / c.name,
            service_name,
            run_id,
            slo=slo_for(config.gates),
            return_state=True,
        )
        for c in plan
    ]
    # A failed candidate is a Failed task run; its result goes on to the decision as before.
    results = [value_of(state, CandidateResult) for state in results]
    timed("measure", mark)

    mark = time.monotonic()
    decision = select_winner(results, config.gates)
    decision = ask_reviewer(decision, results, config.review)
    timed("select", mark)

    mark = time.monotonic()
    by_name = {c.name: c for c in plan}

    def target(name: str | None) -> DeployTarget | None:
        if name is None or name not in by_name or by_name[name].role == "champion":
            return None
        c = by_name[name]
        return DeployTarget(
            candidate=c.name,
            scheme=c.scheme,
            model_dir=c.model_dir,
            repo_id=acquired.repo_id,
            commit=acquired.commit,
            serving=c.serving,
            run_dir=run_dir,
        )

    deployment: dict[str, str | None] = {}
    canary: RolloutOutcome | None = None
    stable_target, canary_target = target(decision.stable), target(decision.winner)
    if stable_target or canary_target:
        state = promote_release(
            stable_target,
            canary_target,
            service_name,
            config.rollout.first_weight,
            config.router_port,
        )
        timed("promote", mark)
        if state.canary is not None:
            mark = time.monotonic()
            canary = walk_canary(
                config.rollout, state.canary.release_id, service_name, config.gates.ttft_p95_slo_s
            )
            timed("canary", mark)
            state = registry.load()
        elif stable_target is not None and state.stable is not None:
            # A first release: the release that is stable now gets its alert rules.
            install_alerts(
                state.stable.release_id,
                state.stable.public_name,
                config.gates.ttft_p95_slo_s,
                config.rollout,
            )
        deployment = {
            "load balancer": f"http://127.0.0.1:{state.router_port}",
            "stable": state.stable.release_id if state.stable else None,
            "canary": f"{state.canary.release_id} at {state.canary_weight}%"
            if state.canary
            else None,
        }
    else:
        logger.warning("nothing deployed: %s", decision.summary)
        timed("promote", mark)

    verdict = "deployed" if deployment else ("review rejected" if decision.reviewed else "rejected")
    summary = decision.summary
    if canary is not None and canary.status in ("promoted", "rolled back"):
        verdict = canary.status
        summary = f"{summary}; canary {canary.status}: {canary.reason}"
    decisions.record(config, acquired.commit, verdict, summary, run_id)
    origin = {
        "repo_id": acquired.repo_id,
        "revision": config.source.revision,
        "commit": acquired.commit,
    }
    markdown = render_markdown(
        title=f"Release {run_id}: {acquired.repo_id}",
        source=origin,
        host=host,
        plan=sizing,
        results=results,
        decision=decision,
        stage_seconds=seconds,
        deployment=deployment,
        canary=canary,
    )
    payload = {
        "run_id": run_id,
        "source": origin,
        "plan": sizing.model_dump(mode="json") if sizing else None,
        "config": config.model_dump(mode="json"),
        "host": host.model_dump(mode="json"),
        "results": [r.model_dump(mode="json") for r in results],
        "decision": decision.model_dump(mode="json"),
        "stage_seconds": seconds,
        "deployment": deployment,
        "canary": canary.model_dump(mode="json") if canary else None,
    }
    files = publish_report(run_dir, markdown, payload, results, decision)
    outcome = ReleaseOutcome(
        run_id=run_id,
        run_dir=str(run_dir),
        report=files["markdown"],
        commit=acquired.commit,
        winner=decision.winner,
        stable=decision.stable,
        summary=summary,
        verdict=verdict,
        canary=canary,
        deployment=deployment,
        stage_seconds=seconds,
        host=host.host.describe(),
        skipped={r.name: r.error for r in results if r.status == "skipped"},
        failed={r.name: r.error for r in results if r.status == "failed"},
    )
    return completed_with_failures(outcome, outcome.failed)


class CliRun(BaseModel):
    """A command-line run: the config, where to write the outcome, and (optionally) the
    Prefect deployment that runs it on a worker instead of in this process."""

    config: ReleaseConfig
    output: Path | None = None
    deployment: str | None = None
    deployment_timeout_s: int = 4 * 3600


def cli_config(description: str) -> CliRun:
    """The release config of a command-line run: a JSON file plus --repo-id/--revision."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repo-id", default=DEMO_REPO_ID)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--hub-endpoint", default=None)
    parser.add_argument(
        "--hub",
        choices=["huggingface", "modelscope"],
        default=None,
        help="the hub the model is on, over the config's source.hub (default: the config's, "
        "else huggingface; modelscope: --hub-endpoint, MODELSCOPE_ENDPOINT or modelscope.cn)",
    )
    parser.add_argument("--config", type=Path, help="JSON file: a ReleaseConfig (source optional)")
    parser.add_argument("--output", type=Path, help="write the flow's result (JSON) here")
    parser.add_argument(
        "--serving-backend",
        choices=["process", "docker"],
        help="override serving.backend of the config (make demo SERVING_BACKEND=docker)",
    )
    parser.add_argument(
        "--deployment",
        help="run through this Prefect deployment (FLOW/DEPLOYMENT, e.g. release/release) on "
        "a worker, as the UI does, and wait for it; default: run the flow in this process",
    )
    parser.add_argument(
        "--deployment-timeout-s",
        type=int,
        default=CliRun.model_fields["deployment_timeout_s"].default,
    )
    args = parser.parse_args()
    try:
        data = json.loads(args.config.read_text()) if args.config else {}
        if args.serving_backend:
            data["serving"] = data.get("serving", {}) | {"backend": args.serving_backend}
        source = {"repo_id": args.repo_id, "revision": args.revision}
        if args.hub_endpoint:
            source["endpoint"] = args.hub_endpoint
        data["source"] = source | data.get("source", {})
        if args.hub:  # named on the command line: it wins over the config's
            data["source"]["hub"] = args.hub
        return CliRun(
            config=ReleaseConfig.model_validate(data),
            output=args.output,
            deployment=args.deployment,
            deployment_timeout_s=args.deployment_timeout_s,
        )
    except (ValidationError, ValueError, OSError) as exc:
        raise SystemExit(f"error: {one_line(exc)}") from None


def through_deployment(name: str, config: ReleaseConfig, timeout_s: int, outcome_type):
    """Start ``name`` with ``config`` as the UI's run form does, wait for a worker to run it,
    and return its typed outcome (the flow's persisted result)."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import FlowRunWaitTimeout
    from prefect.flow_runs import wait_for_flow_run
    from prefect.settings import PREFECT_UI_URL

    try:
        flow_run = run_deployment(
            name=name,
            parameters={"config": config.model_dump(mode="json")},
            timeout=0,
        )
    except Exception as exc:  # noqa: BLE001 - a missing deployment or API, in one line
        raise ReleaseError(
            f"could not start deployment {name!r}: {one_line(exc)}",
            hint="'make prefect-up worker-up' deploys prefect.yaml and starts a worker",
        ) from exc
    ui = PREFECT_UI_URL.value()
    page = f"{ui}/runs/flow-run/{flow_run.id}" if ui else f"flow run {flow_run.id}"
    print(f"Prefect run {flow_run.name}: {page}", flush=True)
    try:
        flow_run = asyncio.run(wait_for_flow_run(flow_run.id, timeout=timeout_s))
    except FlowRunWaitTimeout:
        raise ReleaseError(
            f"run {flow_run.name} is not finished after {timeout_s} s",
            hint="is a worker running on pool 'llm-release'? ('make worker-up')",
        ) from None
    if not flow_run.state.is_completed():
        raise ReleaseError(
            f"run {flow_run.name} ended {flow_run.state.name}: {flow_run.state.message or ''}",
            hint=f"its log: {page}",
        )
    result = flow_run.state.result()
    if isinstance(result, dict) and set(result) == {"__class__", "data"}:
        # Prefect's JSON serializer names the class by the module the worker loaded the flow
        # file as ('model_update.UpdateOutcome'), which this process may not import: the
        # fields are under 'data', validated here as the type the caller expects.
        result = result["data"]
    return outcome_type.model_validate(result if isinstance(result, dict) else result.model_dump())


def run_cli(flow_fn, run: CliRun, outcome_type) -> None:
    try:
        if run.deployment:
            outcome = through_deployment(
                run.deployment, run.config, run.deployment_timeout_s, outcome_type
            )
        else:
            outcome = flow_fn(run.config)
    except (ReleaseError, ValidationError, ParameterTypeError, ValueError, OSError) as exc:
        # Bad input ends in one line (Prefect's run log keeps the traceback).
        raise SystemExit(f"error: {one_line(exc)}") from None
    text = outcome.model_dump_json(indent=2)
    if run.output:
        atomic_write_text(run.output, text + "\n")
    print(text)


def main() -> None:
    run_cli(release, cli_config("Run one release (the flow, in-process)."), ReleaseOutcome)


if __name__ == "__main__":
    main()
