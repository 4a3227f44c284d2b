"""The release flow: acquire → quantize → measure every candidate → select → promote → report."""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.exceptions import ParameterTypeError
from prefect.runtime import flow_run
from pydantic import ValidationError

from blocks.hub import HubCredentials
from llm_release import paths, registry
from llm_release.config import (
    BASELINE,
    CandidateConfig,
    EvalConfig,
    Gates,
    LoadProfile,
    ReleaseConfig,
    ServingConfig,
    SourceConfig,
)
from llm_release.demo_model import DEMO_REPO_ID
from llm_release.errors import ReleaseError, one_line
from llm_release.fileio import atomic_write_text
from llm_release.preflight import check
from llm_release.promote import DeployTarget, default_router_port
from llm_release.quantize import Quantized
from llm_release.report import render_markdown
from llm_release.results import CandidateResult
from tasks.acquire import acquire_model
from tasks.candidate import measure_candidate
from tasks.decide import select_winner
from tasks.probe import probe_host
from tasks.promote import promote_release
from tasks.quantize import quantize_candidate
from tasks.report import publish_report

DEFAULT_CANDIDATES = ReleaseConfig.model_fields["candidates"].default_factory()


@flow(name="release")
def release(
    repo_id: str = DEMO_REPO_ID,
    revision: str = "main",
    hub_endpoint: str | None = None,
    candidates: list[CandidateConfig] = DEFAULT_CANDIDATES,  # noqa: B006 - Prefect form default
    serving: ServingConfig = ServingConfig(),  # noqa: B008
    evaluation: EvalConfig = EvalConfig(),  # noqa: B008
    load: LoadProfile = LoadProfile(),  # noqa: B008
    gates: Gates = Gates(),  # noqa: B008
    canary_weight: int = 5,
    router_port: int | None = None,
    hub_credentials_block: str | None = None,
) -> dict:
    """Release a model: every candidate is measured, the winner goes out as a canary.

    ``hub_credentials_block`` names a saved ``HubCredentials`` block (endpoint + token) for
    gated repos or a mirror; the token never enters parameters, logs or the report.
    """
    logger = get_run_logger()
    token = None
    if hub_credentials_block:
        # Endpoint and token go to the acquire stage itself, never into the environment.
        hub = HubCredentials.load(hub_credentials_block)
        hub_endpoint, token = hub_endpoint or hub.endpoint, hub.token
    config = ReleaseConfig(
        source=SourceConfig(repo_id=repo_id, revision=revision, endpoint=hub_endpoint),
        candidates=candidates,
        serving=serving,
        evaluation=evaluation,
        load=load,
        gates=gates,
        canary_weight=canary_weight,
    )
    router_port = router_port or default_router_port()
    check(config, router_port)
    run_id = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{(flow_run.get_id() or 'local')[:8]}"
    run_dir = paths.runs_dir() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}

    mark = time.monotonic()
    acquired = acquire_model(config.source, token)
    seconds["acquire"] = time.monotonic() - mark

    mark = time.monotonic()
    host = probe_host(acquired.model_dir, config.candidates, config.serving)
    serving = config.serving.model_copy(update={"dtype": host.served_dtype})
    seconds["probe"] = time.monotonic() - mark

    results: list[CandidateResult] = []
    buildable = []
    for c in config.candidates:
        reason = host.skip_reason(c.name)
        if reason:
            results.append(
                CandidateResult(name=c.name, scheme=c.scheme, status="skipped", error=reason)
            )
        else:
            buildable.append(c)
    mark = time.monotonic()
    built: dict[str, Quantized | str] = {
        c.name: quantize_candidate(acquired.model_dir, c) for c in buildable
    }
    seconds["quantize"] = time.monotonic() - mark

    public_name = config.source.repo_id.split("/")[-1]
    schemes = {BASELINE: f"unquantized ({serving.dtype})"} | {
        c.name: c.scheme for c in config.candidates
    }
    serving_for = {BASELINE: serving} | {
        c.name: serving.model_copy(update={"extra_args": serving.extra_args + c.extra_serving_args})
        for c in config.candidates
    }
    dirs: dict[str, Path] = {BASELINE: acquired.model_dir}
    for name, outcome in built.items():
        if isinstance(outcome, Quantized):
            dirs[name] = outcome.model_dir
        else:
            results.append(
                CandidateResult(
                    name=name,
                    scheme=schemes[name],
                    status="failed",
                    error=f"quantization failed: {outcome}",
                )
            )
    mark = time.monotonic()
    for name, model_dir in dirs.items():
        results.append(
            measure_candidate(
                name,
                schemes[name],
                model_dir,
                acquired.model_dir,
                serving_for[name],
                config.evaluation,
                config.load,
                run_dir / "candidates" / name,
                public_name,
            )
        )
    seconds["measure"] = time.monotonic() - mark
    order = [BASELINE] + [c.name for c in config.candidates]
    results.sort(key=lambda r: order.index(r.name))

    mark = time.monotonic()
    current = registry.load()
    first_release = current.stable is None
    decision = select_winner(results, config.gates, BASELINE if first_release else None)
    seconds["select"] = time.monotonic() - mark

    mark = time.monotonic()

    def target(name: str) -> DeployTarget:
        return DeployTarget(
            candidate=name,
            scheme=schemes[name],
            model_dir=dirs[name],
            repo_id=acquired.repo_id,
            commit=acquired.commit,
            serving=serving_for[name],
            run_dir=run_dir,
        )

    baseline_ok = any(r.name == BASELINE and r.status == "measured" for r in results)
    stable_target = target(BASELINE) if first_release and baseline_ok else None
    deployment: dict = {}
    if decision.winner or stable_target:
        canary_target = target(decision.winner) if decision.winner else None
        state = promote_release(
            stable_target, canary_target, public_name, config.canary_weight, router_port
        )
        deployment = {
            "load balancer": f"http://127.0.0.1:{state.router_port}",
            "stable": state.stable.release_id if state.stable else None,
            "canary": f"{state.canary.release_id} at {state.canary_weight}%"
            if state.canary
            else "none",
        }
    else:
        logger.warning("nothing deployed: no winner and no baseline to make stable")
    seconds["promote"] = time.monotonic() - mark

    source = {"repo_id": acquired.repo_id, "revision": revision, "commit": acquired.commit}
    markdown = render_markdown(
        title=f"Release {run_id}: {acquired.repo_id}",
        source=source,
        host=host,
        results=results,
        decision=decision,
        stage_seconds={k: round(v, 1) for k, v in seconds.items()},
        deployment=deployment,
    )
    payload = {
        "run_id": run_id,
        "source": source,
        "config": config.model_dump(),
        "host": host.model_dump(),
        "results": [r.model_dump() for r in results],
        "decision": decision.model_dump(),
        "stage_seconds": seconds,
        "deployment": deployment,
    }
    files = publish_report(run_dir, markdown, payload, results, decision)
    return {
        "run_dir": str(run_dir),
        "report": files["markdown"],
        "winner": decision.winner,
        "summary": decision.summary,
        "deployment": deployment,
        "stage_seconds": seconds,
        "host": host.host.describe(),
        "skipped": {r.name: r.error for r in results if r.status == "skipped"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Run one release (the flow, in-process).")
    parser.add_argument("--repo-id", default=DEMO_REPO_ID)
    parser.add_argument("--revision", default="main")
    parser.add_argument("--hub-endpoint", default=None)
    parser.add_argument("--config", type=Path, help="JSON file with flow parameters")
    parser.add_argument("--output", type=Path, help="write the flow's result (JSON) here")
    args = parser.parse_args()
    params = json.loads(args.config.read_text()) if args.config else {}
    params.setdefault("repo_id", args.repo_id)
    params.setdefault("revision", args.revision)
    if args.hub_endpoint:
        params.setdefault("hub_endpoint", args.hub_endpoint)
    try:
        result = release(**params)
    except (ReleaseError, ValidationError, ParameterTypeError) as exc:
        # Bad input ends in one line (Prefect's run log keeps the traceback).
        raise SystemExit(f"error: {one_line(exc)}") from None
    outcome = json.dumps(result, indent=2, default=str)
    if args.output:
        atomic_write_text(args.output, outcome + "\n")
    print(outcome)


if __name__ == "__main__":
    main()
