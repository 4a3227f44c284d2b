"""Command-line plumbing shared by the flows that run from a shell (``python -m
flows.release``, ``python -m flows.model_update``): the config from a JSON file and
flags, the run in this process or through a Prefect deployment on a worker, the typed
outcome printed and written as JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from prefect.exceptions import ParameterTypeError
from pydantic import BaseModel, ValidationError

from demo.demo_model import DEMO_REPO_ID
from llm_release.config import ReleaseConfig
from llm_release.errors import ReleaseError, one_line
from llm_release.fileio import atomic_write_text
from llm_release.fleet import QUEUE_PREFIX, checked_name


class CliRun(BaseModel):
    """A command-line run: the config, where to write the outcome, and (optionally) the
    Prefect deployment that runs it on a worker instead of in this process."""

    config: ReleaseConfig
    output: Path | None = None
    deployment: str | None = None
    deployment_timeout_s: int = 4 * 3600
    home: str | None = None  # a fleet host: the run goes to its queue (host-<name>)


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
        "--home",
        metavar="HOST",
        help="with --deployment in a fleet: send the run to HOST's own queue (host-HOST), so "
        "HOST's worker runs it and HOST is the release's home (default: the pool's default "
        "queue, whichever worker polls it)",
    )
    parser.add_argument(
        "--deployment-timeout-s",
        type=int,
        default=CliRun.model_fields["deployment_timeout_s"].default,
    )
    args = parser.parse_args()
    if args.home is not None and not args.deployment:
        raise SystemExit("error: --home sends a deployment's run to a host (add --deployment)")
    try:
        if args.home is not None:
            checked_name(args.home)
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
            home=args.home,
        )
    except (ValidationError, ValueError, OSError, ReleaseError) as exc:
        raise SystemExit(f"error: {one_line(exc)}") from None


def home_queue(home: str | None) -> str | None:
    """The work queue that pins a run to fleet host ``home``: its ``host-<home>`` queue, which
    must exist (a queue named in a run that no host joined would be made empty by the server,
    and the run would wait there for a worker that never comes)."""
    if home is None:
        return None
    from tasks.fleet import host_queues

    joined = host_queues()
    if home not in joined:
        raise ReleaseError(
            f"host {home!r} has not joined the fleet (hosts: {', '.join(joined) or 'none'})",
            hint=f"on that host: make fleet-join HOST={home}",
        )
    return QUEUE_PREFIX + home


def through_deployment(
    name: str, config: ReleaseConfig, timeout_s: int, outcome_type, home: str | None = None
):
    """Start ``name`` with ``config`` as the UI's run form does (on fleet host ``home``'s
    queue when given), wait for a worker to run it, and return its typed outcome (the flow's
    persisted result)."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import FlowRunWaitTimeout
    from prefect.flow_runs import wait_for_flow_run
    from prefect.settings import PREFECT_UI_URL

    try:
        queue = home_queue(home)
        flow_run = run_deployment(
            name=name,
            parameters={"config": config.model_dump(mode="json")},
            timeout=0,
            work_queue_name=queue,
        )
    except ReleaseError:
        raise
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
            hint=f"is host {home}'s worker running? ('make fleet-join HOST={home}' on it)"
            if home
            else "is a worker running on pool 'llm-release'? ('make worker-up')",
        ) from None
    if not flow_run.state.is_completed():
        raise ReleaseError(
            f"run {flow_run.name} ended {flow_run.state.name}: {flow_run.state.message or ''}",
            hint=f"its log: {page}",
        )
    return persisted_outcome(flow_run, outcome_type)


def persisted_outcome(flow_run, outcome_type):
    """The typed outcome of a deployment's finished run: the result its worker persisted."""
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
                run.deployment, run.config, run.deployment_timeout_s, outcome_type, run.home
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
