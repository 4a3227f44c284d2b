"""Canary analysis: the canary against the stable release over one window, from Prometheus.

The PromQL lives in ``canary_queries.yaml`` (plain PromQL with ``$service``, ``$role`` and
``$window``), so a team runs the same analysis against its own Prometheus. Each check
compares the canary with the stable release -- a ratio for latencies, a difference for
shares and gauges, each with a tolerance -- and with an absolute ceiling. Only what was
measured can pass: a check without a number is inconclusive, and so is a window with too
few canary requests. A check over its ceiling or tolerance fails, whatever else holds.

The analysis reads one window ending at ``end``; it never sleeps (the caller waits the
window out, e.g. with Prefect, and may ask again).
"""

from __future__ import annotations

import json
import math
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field

from llm_release import paths, registry
from llm_release.canary import quality
from llm_release.canary.prometheus import Prometheus, PrometheusClient, for_home
from llm_release.canary.quality import CHECK_PREFIX, ProbeRun, ProbeSet, SliceScore
from llm_release.canary.router import Router
from llm_release.config import AnalysisConfig
from llm_release.errors import ConfigError, MetricsError
from llm_release.hub import credentials
from llm_release.settings import settings

QUERIES_FILE = Path(__file__).with_name("canary_queries.yaml")
ROLES = ("stable", "canary")
Outcome = Literal["pass", "fail", "inconclusive"]


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    promql: str


def load_queries(path: Path = QUERIES_FILE) -> dict[str, Query]:
    data = yaml.safe_load(Path(path).read_text())
    return {
        name: Query(name, " ".join(str(entry.get("description", "")).split()), entry["promql"])
        for name, entry in data["queries"].items()
    }


def promql_string_content(value: str) -> str:
    """``value`` escaped for the inside of a double-quoted PromQL string.

    PromQL strings take Go's escapes, and JSON's are a subset of them: a quote, a
    backslash or a newline in a service name stays part of the label value and can never
    end the matcher (e.g. ``x"} or vector(1) #`` matches a service of that name, only).
    """
    if not isinstance(value, str) or not value:
        raise ConfigError(f"a label value must be a non-empty string, not {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError("a label value must be valid UTF-8 text") from None
    return json.dumps(value, ensure_ascii=False)[1:-1]


def render_query(promql: str, *, service: str, role: str, window_s: int) -> str:
    """A query of ``canary_queries.yaml`` with its placeholders filled in, as plain PromQL."""
    if int(window_s) <= 0:
        raise ConfigError(f"the window must be a positive number of seconds, not {window_s}")
    # Template substitutes once: a '$' inside a value is never read as a placeholder.
    return string.Template(promql).substitute(
        service=promql_string_content(service),
        role=promql_string_content(role),
        window=f"{int(window_s)}s",
    )


class CheckResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    canary: float | None
    stable: float | None
    rule: str
    outcome: Outcome
    reason: str


class WindowVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    service: str
    prometheus_url: str
    started_at: float  # Unix seconds; the window is (started_at, ended_at]
    ended_at: float
    window_s: int
    canary_requests: float | None  # finished in the window, as scraped (see the queries)
    stable_requests: float | None
    checks: list[CheckResult]
    verdict: Outcome
    reason: str
    quality: list[SliceScore] = Field(
        default_factory=list, description="the quality probes' slices (quality.py)"
    )
    probes: ProbeRun | None = Field(
        None, description="the quality probes sent after the window, answers left out"
    )


@dataclass(frozen=True)
class CheckSpec:
    """One comparison: ``ratio``: canary <= stable x tolerance (or stable + slack);
    ``difference``: canary <= stable + tolerance. Both: canary <= ceiling when set."""

    name: str
    compare: Literal["ratio", "difference"]
    tolerance: float
    ceiling: float | None
    unit: str = ""
    slack: float = 0.0
    # A p95 of fewer requests than the minimum is their maximum: not judged at all.
    needs_requests: bool = False


def check_specs(config: AnalysisConfig, slo_ttft_p95_s: float | None) -> list[CheckSpec]:
    ttft_ceiling = config.ttft_p95_ceiling_s or slo_ttft_p95_s
    latency = {"compare": "ratio", "tolerance": config.latency_max_ratio, "unit": " s"}
    latency |= {"slack": config.latency_slack_s, "needs_requests": True}
    errors = {"compare": "difference", "tolerance": config.error_share_tolerance}
    errors |= {"ceiling": config.error_ceiling()}
    return [
        CheckSpec("ttft_p95_s", ceiling=ttft_ceiling, **latency),
        CheckSpec("itl_p95_s", ceiling=config.itl_p95_ceiling_s, **latency),
        CheckSpec("http_error_share", **errors),
        CheckSpec("engine_error_share", **errors),
        CheckSpec("queue_max", "difference", config.queue_tolerance, config.queue_ceiling),
        CheckSpec(
            "kv_cache_usage_max", "difference", config.kv_cache_tolerance, config.kv_cache_ceiling
        ),
    ]


def _fmt(value: float | None, unit: str = "") -> str:
    return "none" if value is None else f"{value:.4g}{unit}"


def describe(spec: CheckSpec) -> str:
    if spec.compare == "ratio":
        rule = f"canary <= stable x {spec.tolerance:g}"
        if spec.slack:
            rule += f" (or stable + {spec.slack:g}{spec.unit})"
    else:
        rule = f"canary <= stable + {spec.tolerance:g}{spec.unit}"
    if spec.ceiling is not None:
        rule += f"; canary <= {spec.ceiling:g}{spec.unit}"
    return rule


def evaluate_check(
    spec: CheckSpec, canary: float | None, stable: float | None, *, enough_requests: bool
) -> CheckResult:
    def result(outcome: Outcome, reason: str) -> CheckResult:
        return CheckResult(
            name=spec.name,
            canary=canary,
            stable=stable,
            rule=describe(spec),
            outcome=outcome,
            reason=reason,
        )

    u = spec.unit
    if canary is None:
        return result("inconclusive", "no canary value in the window (no data)")
    if spec.needs_requests and not enough_requests:
        return result("inconclusive", "too few canary requests for a p95")
    if spec.ceiling is not None and canary > spec.ceiling:
        return result("fail", f"canary {_fmt(canary, u)} is above the ceiling {spec.ceiling:g}{u}")
    if stable is None:
        return result("inconclusive", "no stable value in the window to compare with")
    if spec.compare == "ratio":
        allowed = max(stable * spec.tolerance, stable + spec.slack)
    else:
        allowed = stable + spec.tolerance
    if canary > allowed:
        return result(
            "fail",
            f"canary {_fmt(canary, u)} exceeds {_fmt(allowed, u)} allowed "
            f"(stable {_fmt(stable, u)})",
        )
    return result("pass", f"canary {_fmt(canary, u)}, stable {_fmt(stable, u)}")


def judge(
    values: dict[str, dict[str, float | None]],
    config: AnalysisConfig,
    slo_ttft_p95_s: float | None,
) -> tuple[list[CheckResult], Outcome, str]:
    """Checks and verdict from measured ``values[role][query]`` (None: no data).

    Any failed check fails the window. Otherwise a window with fewer canary requests than
    ``min_canary_requests``, or any check without a verdict, is inconclusive; else pass.
    """
    canary_requests = values["canary"].get("requests")
    enough = canary_requests is not None and canary_requests >= config.min_canary_requests
    checks = [
        evaluate_check(
            spec,
            values["canary"].get(spec.name),
            values["stable"].get(spec.name),
            enough_requests=enough,
        )
        for spec in check_specs(config, slo_ttft_p95_s)
    ]
    failed = [c for c in checks if c.outcome == "fail"]
    if failed:
        return checks, "fail", "; ".join(f"{c.name}: {c.reason}" for c in failed)
    if not enough:
        return (
            checks,
            "inconclusive",
            f"{_fmt(canary_requests)} canary requests in the window; "
            f"at least {config.min_canary_requests} needed",
        )
    open_checks = [c for c in checks if c.outcome == "inconclusive"]
    if open_checks:
        return checks, "inconclusive", "; ".join(f"{c.name}: {c.reason}" for c in open_checks)
    return checks, "pass", f"all {len(checks)} checks passed on {canary_requests:.0f} requests"


def own_ports() -> set[int]:
    """The ports the project's services hold now, beyond their settings: the registry's vLLM
    servers and their supervisors, the load balancer's listener and HAProxy's recorded
    metrics port, the running Alertmanager's port."""
    from llm_release.canary import alertmanager  # it imports this module (via alerts)

    state = registry.load()
    ports = {
        port
        for release in (state.stable, state.canary)
        if release is not None
        for port in (release.port, release.supervisor_port)
        if port is not None
    }
    listen = state.router_port or settings().router_port
    router = Router(paths.router_dir(), listen)
    ports |= {p for p in (listen, router.metrics_port, alertmanager.for_home().port) if p}
    return ports


def prometheus_url(config: AnalysisConfig) -> str:
    """The Prometheus the analysis asks: ``config.prometheus_url`` (a run parameter) past
    the endpoint policy (``credentials.check_prometheus_url``: no metadata address, none of
    the project's other services), else the project's own. ConfigError in one line."""
    if config.prometheus_url is None:
        return for_home().url
    return credentials.check_prometheus_url(config.prometheus_url, own_ports=own_ports())


def client_for(config: AnalysisConfig) -> PrometheusClient:
    """The Prometheus named by ``config.prometheus_url``, checked again (a name may resolve
    elsewhere by now), else the project's own."""
    own = for_home()
    if config.prometheus_url is None:  # the project's own: its credentials go with it
        return PrometheusClient(own.url, timeout_s=config.query_timeout_s, auth=own.http_auth())
    url, address = credentials.pinned_prometheus_url(config.prometheus_url, own_ports=own_ports())
    if _names_own(url, own):  # the project's own, by its loopback address and port
        return PrometheusClient(own.url, timeout_s=config.query_timeout_s, auth=own.http_auth())
    # the queries go to the address checked, not to what the name resolves to later
    return PrometheusClient(url, timeout_s=config.query_timeout_s, pinned=address)


def _names_own(url: str, own: Prometheus) -> bool:
    """``url`` is the project's running Prometheus (a loopback address, its port): the
    credentials go only to the process the project started there."""
    parts = urlsplit(url)
    loopback = parts.hostname in ("127.0.0.1", "localhost", "::1")
    return loopback and parts.port == own.port and own.running() and own.locked()


def measure(
    client: PrometheusClient, *, service: str, window_s: int, end: float
) -> dict[str, dict[str, float | None]]:
    """Every query of the file for both roles, at the same instant over the same window."""
    values: dict[str, dict[str, float | None]] = {}
    for role in ROLES:
        values[role] = {}
        for name, query in load_queries().items():
            promql = render_query(query.promql, service=service, role=role, window_s=window_s)
            try:
                value = client.value(promql, end)
            except MetricsError as exc:
                # The query's name, not its text: the reason stays one short line.
                raise MetricsError(f"{name} ({role}): {exc.message}", hint=exc.hint) from None
            values[role][name] = None if value is None or math.isnan(value) else value
    return values


def analyze_window(
    client: PrometheusClient | None,
    config: AnalysisConfig,
    *,
    service: str,
    slo_ttft_p95_s: float | None,
    end: float | None = None,
) -> WindowVerdict:
    """Judge the canary of ``service`` over the window of ``config.window_s`` seconds that
    ends at ``end`` (now if None). ``client`` None: ``client_for(config)``."""
    client = client or client_for(config)
    end = time.time() if end is None else end
    values = measure(client, service=service, window_s=config.window_s, end=end)
    checks, verdict, reason = judge(values, config, slo_ttft_p95_s)
    return WindowVerdict(
        service=service,
        prometheus_url=client.url,
        started_at=end - config.window_s,
        ended_at=end,
        window_s=config.window_s,
        canary_requests=values["canary"].get("requests"),
        stable_requests=values["stable"].get("requests"),
        checks=checks,
        verdict=verdict,
        reason=reason,
    )


def unanswered(
    config: AnalysisConfig, service: str, started_at: float, ended_at: float, why: str
) -> WindowVerdict:
    """A window whose numbers could not be read: inconclusive, never a pass."""
    return WindowVerdict(
        service=service,
        prometheus_url=config.prometheus_url or for_home().url,
        started_at=started_at,
        ended_at=ended_at,
        window_s=config.window_s,
        canary_requests=None,
        stable_requests=None,
        checks=[],
        verdict="inconclusive",
        reason=f"no numbers: {why}",
    )


def quality_check(score: SliceScore) -> CheckResult:
    """A slice of the quality probes as one check of the window."""
    return CheckResult(
        name=score.slice,
        canary=score.canary,
        stable=score.stable,
        rule=f"canary >= stable - {score.max_drop:g} "
        "(paired; beyond it with the interval above 0 fails)",
        outcome=score.outcome,
        reason=score.reason,
    )


def with_quality(
    verdict: WindowVerdict,
    scores: list[SliceScore],
    run: ProbeRun | None,
    *,
    why_not: str | None = None,
) -> WindowVerdict:
    """The window's verdict with its quality check: a failing slice fails the window as a
    failing latency check does; a slice without enough answers makes a window that would
    pass inconclusive. ``scores`` empty: the probes could not run (the check is open)."""
    checks = [quality_check(s) for s in scores]
    if not checks:
        why = f"the quality probes did not run: {why_not or 'no probe set'}"
        if run is not None and any(run.errors.values()):
            why += f" ({_first_errors(run)})"
        checks = [
            CheckResult(
                name=CHECK_PREFIX,
                canary=None,
                stable=None,
                rule="every critical slice of the probe set",
                outcome="inconclusive",
                reason=why,
            )
        ]
    failed = [c for c in checks if c.outcome == "fail"]
    open_checks = [c for c in checks if c.outcome == "inconclusive"]
    outcome, reason = verdict.verdict, verdict.reason
    if failed:
        quality = "; ".join(f"{c.name}: {c.reason}" for c in failed)
        reason = f"{reason}; {quality}" if outcome == "fail" else quality
        outcome = "fail"
    elif outcome != "fail" and open_checks:
        quality = "; ".join(f"{c.name}: {c.reason}" for c in open_checks)
        reason = f"{reason}; {quality}" if outcome == "inconclusive" else quality
        outcome = "inconclusive"
    elif outcome == "pass":
        reason = f"{reason}; {len(checks)} quality slices passed"
    stripped = run.model_copy(update={"answers": {}}) if run is not None else None
    return verdict.model_copy(
        update={
            "checks": verdict.checks + checks,
            "verdict": outcome,
            "reason": reason,
            "quality": scores,
            "probes": stripped,
        }
    )


def _first_errors(run: ProbeRun) -> str:
    return "; ".join(f"{role}: {errors[0]}" for role, errors in run.errors.items() if errors)


def probe_window(
    verdict: WindowVerdict,
    probe_set: ProbeSet | None,
    route: quality.ProbeRoute | None,
    *,
    why_not: str | None = None,
) -> WindowVerdict:
    """Send the release's probe set to canary and stable (after the window: its numbers
    hold no probe) and add the quality check to ``verdict``. No probe set or no route: the
    check is inconclusive, with ``why_not``."""
    if probe_set is None or route is None:
        return with_quality(verdict, [], None, why_not=why_not)
    found = settings()
    run = quality.send_probes(
        probe_set,
        route,
        concurrency=found.quality_probe_concurrency,
        timeout_s=found.quality_probe_timeout_s,
    )
    return with_quality(verdict, quality.judge(probe_set, run, found.quality_probe_min_items), run)
