"""The canary on live traffic, inside the release flow: each analysis window is a task; the
final step (and a step too inconclusive to call) pauses the run for a person with the
evidence and a typed form in the Prefect UI; no answer in time rolls back."""

from __future__ import annotations

import contextlib
import time

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import Field

from flows.review import POLL_S
from llm_release import registry
from llm_release.canary import alerts, analysis, promote, quality, rollout
from llm_release.canary.analysis import WindowVerdict
from llm_release.canary.quality import ProbeSet
from llm_release.canary.rollout import Answer, Question, RolloutOutcome, WindowRecord
from llm_release.config import RolloutConfig
from llm_release.errors import ReleaseError, StateError, one_line
from llm_release.load.traffic import Traffic
from llm_release.serving import reasoning
from llm_release.settings import settings
from tasks.notify import emit_rollback
from tasks.publish import publish_winner


class CanaryAnswer(RunInput):
    approve: bool = Field(
        False, description="approve: go on (to 100% for the final step); reject: roll back"
    )
    comment: str = Field("", max_length=500, description="why; recorded in the report")


@task(
    name="analysis-window", cache_policy=NO_CACHE, task_run_name="canary {weight}% window {index}"
)
def analysis_window(
    config: RolloutConfig,
    service: str,
    slo_ttft_p95_s: float,
    weight: int,
    index: int,
    probe_set: ProbeSet | None = None,
    no_probe_set: str | None = None,
) -> WindowVerdict:
    """Wait one window out at ``weight`` percent, then compare canary and stable over it:
    their numbers from Prometheus, then their answers to the release's probe set."""
    # The window starts now, after the weight change: it holds only the new split.
    start = time.time()
    time.sleep(config.analysis.window_s + rollout.settle_s(config))
    end = start + config.analysis.window_s
    try:
        verdict = analysis.analyze_window(
            None, config.analysis, service=service, slo_ttft_p95_s=slo_ttft_p95_s, end=end
        )
    except ReleaseError as exc:
        # No numbers is no evidence either way: the policy counts it as inconclusive.
        verdict = analysis.unanswered(config.analysis, service, start, end, exc.one_line())
    # The probes go out after the window's end: its numbers hold none of them, and the
    # next window starts when they are answered.
    try:
        verdict = analysis.probe_window(
            verdict, probe_set, probe_route(service), why_not=no_probe_set
        )
    except ReleaseError as exc:
        verdict = analysis.with_quality(verdict, [], None, why_not=exc.one_line())
    get_run_logger().info(
        "canary at %d%%, window %d: %s (%s)", weight, index, verdict.verdict, verdict.reason
    )
    return verdict


def probe_route(service: str) -> quality.ProbeRoute:
    """The load balancer's loopback listener, with the project's key, for the probes."""
    state = registry.load()
    router = promote.router_for(state)
    return quality.ProbeRoute(
        url=router.url,
        api_key=router.api_key,
        service=service,
        # The thinking switch as the demo traffic sends it (see walk_canary).
        request_body=reasoning.releases_request_body([state.stable, state.canary]),
    )


class FlowActions:
    """The rollout's effects inside a Prefect flow run."""

    def __init__(self, config: RolloutConfig, release_id: str, service: str, slo: float) -> None:
        self.config, self.release_id, self.service, self.slo = config, release_id, service, slo
        self.weight = config.first_weight
        self.logger = get_run_logger()
        # The release's probe set, fixed for the whole walk; without one every window's
        # quality check is inconclusive (never a pass).
        self.probe_set: ProbeSet | None = None
        self.no_probe_set: str | None = None
        found = settings()
        try:
            self.probe_set = quality.build_probe_set(
                release_id,
                items_per_set=found.quality_probe_items,
                min_per_slice=found.quality_probe_min_items,
            )
        except ReleaseError as exc:
            self.no_probe_set = exc.one_line()
            self.logger.error("no quality probes for %s: %s", release_id, self.no_probe_set)

    def _record(self, state: str, last: WindowRecord | None = None, reason: str | None = None):
        rollout.record(
            self.release_id, self.config.steps, self.weight, state, last=last, reason=reason
        )

    def still_canary(self) -> bool:
        state = registry.load()
        return state.canary is not None and state.canary.release_id == self.release_id

    def crash_looping(self) -> str | None:
        canary = registry.load().canary
        if canary is None or canary.release_id != self.release_id:
            return None
        return promote.crash_looping(canary)

    def set_weight(self, weight: int) -> None:
        promote.set_canary_weight(weight)
        self.weight = weight
        self.logger.info("canary %s now takes %d%% of requests", self.release_id, weight)
        self._record("analysing")

    def warm_up(self, weight: int, seconds: float) -> None:
        self.logger.info(
            "canary %s warms up at %d%% for %.0f s before the first analysis window",
            self.release_id,
            weight,
            seconds,
        )
        self._record("warming up")
        time.sleep(seconds)

    def analyze(self, weight: int, index: int) -> WindowVerdict:
        verdict = analysis_window(
            self.config,
            self.service,
            self.slo,
            weight,
            index,
            self.probe_set,
            self.no_probe_set,
        )
        self._record("analysing", WindowRecord(weight=weight, index=index, verdict=verdict))
        return verdict

    def ask(self, question: Question, windows: list[WindowRecord]) -> Answer:
        answer = self._ask(question, windows)
        # Who approved (or refused), how and why, on the record (the history's events).
        rollout.record_answer(self.release_id, question, self.weight, answer)
        return answer

    def _ask(self, question: Question, windows: list[WindowRecord]) -> Answer:
        if question == "promote" and self.config.approval == "approve":
            note = "approved without asking (rollout.approval is 'approve' in the release config)"
            self.logger.warning("promotion of %s: %s", self.release_id, note)
            return Answer(approve=True, note=note, by="config")
        what = (
            f"Promote {self.release_id} to 100%?"
            if question == "promote"
            else f"{self.release_id}: the analysis could not decide at {self.weight}%. "
            "Approve to go on to the next step, reject to roll back."
        )
        evidence = f"{what}\n\n{rollout.evidence_markdown(windows)}"
        create_markdown_artifact(
            key="canary-approval", markdown=evidence, description=f"canary {question}"
        )
        self._record("awaiting approval", reason=what)
        self.logger.warning(
            "%s resume this run in the Prefect UI (approve / reject) within %d s",
            what,
            self.config.approval_timeout_s,
        )
        try:
            answer = pause_flow_run(
                wait_for_input=CanaryAnswer.with_initial_data(description=evidence),
                timeout=self.config.approval_timeout_s,
                poll_interval=POLL_S,
            )
        except FlowPauseTimeout:
            return Answer(
                approve=False,
                note=f"no answer within {self.config.approval_timeout_s} s",
                by="timeout",
            )
        verdict = "approved" if answer.approve else "rejected"
        return Answer(approve=answer.approve, note=answer.comment.strip() or verdict, by="person")

    def promote(self) -> None:
        new = promote.promote()
        self.weight = 100
        self._record("promoted")
        install_alerts(new.release_id, new.public_name, self.slo, self.config)
        publish_winner(new)

    def rollback(self, reason: str) -> None:
        self.logger.error("rolling back %s: %s", self.release_id, reason)
        result = promote.rollback(reason=reason)
        if not result.drain.confirmed_empty:
            self.logger.error("drain %s: %s", result.drain.outcome, result.drain.detail)
        self._record("rolled back", reason=reason)
        emit_rollback(self.release_id, reason)


def install_alerts(release_id: str, service: str, slo: float, config: RolloutConfig) -> None:
    """Alert rules for the release that is stable now; a failure is logged, not raised:
    the release is already serving."""
    logger = get_run_logger()
    try:
        path = alerts.install_for_stable(release_id, service, slo, config.analysis)
    except ReleaseError as exc:
        logger.error("alert rules for %s not loaded: %s", release_id, exc.one_line())
        return
    logger.info("alert rules for the stable release %s loaded from %s", release_id, path)


def walk_canary(
    config: RolloutConfig,
    release_id: str,
    service: str,
    slo_ttft_p95_s: float,
    current_weight: int | None = None,
) -> RolloutOutcome:
    """Walk the live canary to 100% or back to 0, driving demo traffic if configured."""
    actions = FlowActions(config, release_id, service, slo_ttft_p95_s)
    actions.weight = current_weight or config.first_weight
    traffic = demo_traffic(config, service)
    try:
        outcome = walk_or_roll_back(config, release_id, actions, current_weight)
    finally:
        report = traffic.stop() if traffic is not None else None
    if report is not None:
        outcome.traffic = report
        get_run_logger().info("demo traffic: %d requests, %d failed", report.sent, report.failed)
    if outcome.status in ("held", "overridden"):
        actions._record(outcome.status, reason=outcome.reason)
    create_markdown_artifact(
        key="canary-rollout",
        markdown=f"**{outcome.status}**: {outcome.reason}\n\n"
        + rollout.evidence_markdown(outcome.windows),
        description=f"canary {release_id}: {outcome.status}",
    )
    return outcome


def demo_traffic(config: RolloutConfig, service: str) -> Traffic | None:
    """The configured demo traffic through the router, started; None when there is none.
    Bounded: long enough for every window the policy can ask for, stopped at the walk's end."""
    if config.mode != "progressive" or config.traffic is None:
        return None
    state = registry.load()
    router = promote.router_for(state)
    traffic = Traffic(
        router.url,
        service,
        rate_rps=config.traffic.rate_rps,
        # A window's probes (2 x items, a few at a time) take far less than one probe's
        # timeout on the demo's model; the traffic stops with the walk anyway.
        duration_s=rollout.longest_rollout_s(config, probe_s=settings().quality_probe_timeout_s),
        concurrency=config.traffic.concurrency,
        max_tokens=config.traffic.max_tokens,
        # Thinking off (unless serving.thinking) for the stable's and canary's models
        request_body=reasoning.releases_request_body([state.stable, state.canary]),
        api_key=router.api_key,
    )
    traffic.start()
    return traffic


def walk_or_roll_back(
    config: RolloutConfig, release_id: str, actions: FlowActions, current_weight: int | None
) -> RolloutOutcome:
    """The policy's walk; one that cannot go on leaves no canary unwatched: back to 0."""
    try:
        return rollout.walk(config, release_id, actions, current_weight)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            if actions.still_canary():
                actions.rollback(f"rollout interrupted: {one_line(exc)}")
        raise


@flow(name="canary-rollout")
def canary_rollout(rollout_config: RolloutConfig, slo_ttft_p95_s: float = 3.0) -> RolloutOutcome:
    """Walk the live canary (for a release deployed with ``rollout.mode: hold``, or one
    whose walk was interrupted): the same steps, windows, approval and rollback."""
    state = registry.load()
    if state.canary is None:
        raise StateError(
            "there is no live canary to roll out",
            hint="run a release first; 'llm-release canary status' shows the current releases",
        )
    config = rollout_config.model_copy(update={"mode": "progressive"})
    analysis.prometheus_url(config.analysis)  # a run's Prometheus URL, before any step
    return walk_canary(
        config,
        state.canary.release_id,
        state.canary.public_name,
        slo_ttft_p95_s,
        current_weight=state.canary_weight,
    )
