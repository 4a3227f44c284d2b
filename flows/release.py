"""The release flow, the runbook: plan → acquire → probe the host → quantize → (tune) →
measure the champion and every challenger → select (a human reviews what a gate could not
decide) → promote → walk the canary → report. A direct call of ``release`` returns its
ReleaseOutcome whatever failed; a deployment's run carries it as its persisted result."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.client.schemas.objects import State
from prefect.futures import PrefectFuture
from prefect.runtime import flow_run
from pydantic import BaseModel

from flows.canary import install_alerts, walk_canary
from flows.cli import cli_config, run_cli
from flows.review import ask_reviewer
from llm_release import paths, registry
from llm_release.canary.rollout import RolloutOutcome
from llm_release.config import ReleaseConfig
from llm_release.decision import decisions
from llm_release.decision.contenders import Contender, list_contenders
from llm_release.decision.select import deploy_targets
from llm_release.fleet import Placement
from llm_release.hub.acquire import Acquired
from llm_release.load.loadtest import slo_for
from llm_release.preflight import check
from llm_release.registry import RegistryState, Release
from llm_release.reporting.report import Deployment, Origin, ReleaseReport
from llm_release.results import CandidateResult, Decision, DeployTarget
from llm_release.serving.backends import sweep_containers
from llm_release.serving.capacity import as_planned
from llm_release.serving.probe import HostSupport
from tasks.acquire import acquire_model, hub_access
from tasks.candidate import measure_contender
from tasks.decide import select_winner
from tasks.dispatch import place_contenders, seat_when_free, send_away
from tasks.fleet import fleet_hub_access
from tasks.plan import plan_capacity
from tasks.probe import probe_host
from tasks.promote import promote_release
from tasks.quantize import build_contender
from tasks.report import publish_lineage, publish_report
from tasks.slots import ensure_host_limit
from tasks.stage import StageClock
from tasks.states import completed_with_failures, settled, value_of
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
    deployment: Deployment | None = None
    stage_seconds: dict[str, float]
    host: str
    skipped: dict[str, str | None]
    failed: dict[str, str | None] = {}
    canary: RolloutOutcome | None = None

    @classmethod
    def of(cls, report: ReleaseReport, run_dir: Path, markdown: str) -> ReleaseOutcome:
        results = report.results
        return cls(
            run_id=report.run_id,
            run_dir=str(run_dir),
            report=markdown,
            commit=report.source.commit,
            winner=report.decision.winner,
            stable=report.decision.stable,
            summary=report.summary,
            verdict=report.verdict,
            deployment=report.deployment,
            stage_seconds=report.stage_seconds,
            host=report.host.host.describe(),
            skipped={r.name: r.error for r in results if r.status == "skipped"},
            failed={r.name: r.error for r in results if r.status == "failed"},
            canary=report.canary,
        )


# Results are persisted (as JSON, never pickle) so that a caller that started the run through
# the deployment and a worker (`--deployment`, `make demo`) reads the same typed outcome.
@flow(name="release", persist_result=True, result_serializer="json")
def release(config: ReleaseConfig) -> ReleaseOutcome:
    """The champion and every challenger measured alike; the winner goes out as a canary. A
    candidate that failed ends the run "Completed with failed candidates", naming it."""
    champion, service = check(config)
    run_id, run_dir = start_run(config)
    stage = StageClock()
    source, token = hub_access(config.source)
    with stage("plan"):
        sizing = plan_capacity(config.model_copy(update={"source": source}), token)
    config = as_planned(config, sizing)  # tensor_parallel_size 'auto': the plan's
    with stage("acquire"):
        acquired = acquire_model(source, token)
    with stage("probe"):
        host = probe_host(
            acquired.model_dir, config.candidates, config.serving, config.load, config.gates
        )
    with stage("quantize"):
        contenders = quantize_contenders(config, acquired, host, champion)
    if config.tune.enabled:
        with stage("tune"):
            contenders = tune_contenders(contenders, acquired, config, run_dir)
    with stage("measure"):
        results = measure_contenders(contenders, acquired, config, host, run_id, run_dir, service)
    with stage("select"):
        decision = ask_reviewer(select_winner(results, config.gates), results, config.review)
    targets = deploy_targets(decision, contenders, acquired.repo_id, acquired.commit, run_dir)
    with stage("promote"):
        state = promote(*targets, decision, service, config)
    rollout = None
    if state is not None and state.canary is not None:
        with stage("canary"):
            rollout = walk(state.canary, service, config)
    report = ReleaseReport(
        run_id=run_id,
        source=Origin(repo_id=source.repo_id, revision=source.revision, commit=acquired.commit),
        plan=sizing,
        config=config,
        host=host,
        results=results,
        decision=decision,
        stage_seconds=stage.seconds,
        deployment=Deployment.of(registry.load()) if state is not None else None,
        canary=rollout,
    )
    outcome = record_run(report, run_dir, acquired.commit)
    return completed_with_failures(outcome, outcome.failed)


def record_run(report: ReleaseReport, run_dir: Path, commit: str) -> ReleaseOutcome:
    """The run's judgement on the record (the nightly run answers the same question from
    it), its report in the run folder and the UI, and the lineage of what it deployed."""
    decisions.record(
        report.config,
        commit,
        report.verdict,
        report.summary,
        report.run_id,
        approved_by=report.decision.reviewed,
    )
    outcome = ReleaseOutcome.of(report, run_dir, publish_report(run_dir, report)["markdown"])
    publish_lineage(report.run_id)
    return outcome


def start_run(config: ReleaseConfig) -> tuple[str, Path]:
    """The run's id and folder, once the host is ready for it: containers a killed run of
    this home left behind are removed (by label; never the registry's), and the host's
    limit of concurrent measurements is set."""
    if config.serving.backend == "docker":
        for removed in sweep_containers(paths.home(), everything=False):
            get_run_logger().warning("removed a leftover %s", removed)
    ensure_host_limit()
    run_id = f"{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{(flow_run.get_id() or 'local')[:8]}"
    run_dir = paths.runs_dir() / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_id, run_dir


def quantize_contenders(
    config: ReleaseConfig, acquired: Acquired, host: HostSupport, champion: Release | None
) -> list[Contender]:
    """Who is measured (the champion, the baseline, every candidate), each candidate built;
    one that failed to build carries its failure (a Failed task run in the UI)."""
    planned = list_contenders(config, acquired.model_dir, acquired.commit, host, champion)
    return [
        value_of(build_contender(c, acquired.model_dir, return_state=True), Contender)
        for c in planned
    ]


def tune_contenders(
    contenders: list[Contender], acquired: Acquired, config: ReleaseConfig, run_dir: Path
) -> list[Contender]:
    return [
        tune_contender(c, acquired.model_dir, config, run_dir / "candidates" / c.name / "tune")
        for c in contenders
    ]


def measure_contenders(
    contenders: list[Contender],
    acquired: Acquired,
    config: ReleaseConfig,
    host: HostSupport,
    run_id: str,
    run_dir: Path,
    service: str,
) -> list[CandidateResult]:
    """Every contender served, evaluated and load-tested alike, side by side as far as the
    host's slots allow (one per GPU: tasks/slots.py). On a host of a fleet, a challenger
    this host has no free slot for goes to another host whose card fits the plan and whose
    slots are free, handed over through the fleet's hub (docs/fleet.md); with every such
    host full it waits for the first of them to free a slot, this host included. Outside a
    fleet every one is measured here, as always. A failed candidate is a Failed task run;
    its result goes on to the decision as a measured one does."""
    placed = place_contenders(contenders, acquired, config, host)
    # the fleet's hub refused here, before any measurement starts, when it is not set (one
    # queued here may yet go to another host)
    hub = fleet_hub_access() if placed.away() or placed.waiting else None
    slo = slo_for(config.gates)
    alike = (acquired.model_dir, config.evaluation, config.load, host)

    def here(c: Contender) -> PrefectFuture | State:
        out_dir = run_dir / "candidates" / c.name
        return measure_contender.submit(c, *alike, out_dir, service, run_id, slo=slo)

    def away(sent: list[Contender], where: Placement) -> dict[str, PrefectFuture | State]:
        return send_away(sent, where, hub, acquired, config, run_id, service)

    queued = {seat.name for seat in placed.waiting}
    started = {
        c.name: here(c) for c in contenders if placed.at_home(c.name) and c.name not in queued
    }
    if hub is not None:
        started |= away([c for c in contenders if not placed.at_home(c.name)], placed)
    started |= seat_when_free(contenders, placed, started, here, away)
    return [
        value_of(s if isinstance(s, State) else settled(s), CandidateResult)
        for s in (started[c.name] for c in contenders)
    ]


def promote(
    stable: DeployTarget | None,
    canary: DeployTarget | None,
    decision: Decision,
    service: str,
    config: ReleaseConfig,
) -> RegistryState | None:
    """The decision's targets behind the load balancer (None: nothing goes out). A first
    release with no canary gives the release that is stable now its alert rules."""
    if stable is None and canary is None:
        get_run_logger().warning("nothing deployed: %s", decision.summary)
        return None
    state = promote_release(
        stable, canary, service, config.rollout.first_weight, config.router_port
    )
    if state.canary is None and stable is not None and state.stable is not None:
        install_alerts(
            state.stable.release_id,
            state.stable.public_name,
            config.gates.ttft_p95_slo_s,
            config.rollout,
        )
    return state


def walk(canary: Release, service: str, config: ReleaseConfig) -> RolloutOutcome:
    """The live canary walked to 100% or back to 0 (flows/canary.py)."""
    return walk_canary(config.rollout, canary.release_id, service, config.gates.ttft_p95_slo_s)


def main() -> None:
    run_cli(release, cli_config("Run one release (the flow, in-process)."), ReleaseOutcome)


if __name__ == "__main__":
    main()
