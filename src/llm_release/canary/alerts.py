"""Prometheus alerting rules for the release that serves as stable.

The thresholds are the release's own (TTFT SLO, error ceiling) and the serving limits of
the canary analysis (queue 20, KV cache 95%). Rules select ``role="stable"`` of the
service, so they keep watching whatever is stable; the release they were written for is
a label. The file is built as data with ``yaml.safe_dump`` and checked by
``promtool check rules`` before Prometheus loads it. Prometheus sends the alerts that fire
to the project's Alertmanager (``alertmanager.py``), which notifies the operator's webhook.

A service name is input: inside PromQL it is an escaped string (it can never end its
matcher), and in labels and annotations, which Prometheus expands as Go templates, every
'{' is printed by a template action of its own, so no name can open one.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

import yaml

from llm_release.canary.analysis import load_queries, promql_string_content, render_query
from llm_release.canary.prometheus import SUPERVISOR_JOB, VLLM_JOB, Prometheus, for_home
from llm_release.config import AnalysisConfig
from llm_release.errors import AlertRulesError, MetricsError
from llm_release.fileio import atomic_write_text

RULES_FILE = "llm-release.yml"
GROUP = "llm-release-stable"
# Alertmanager's inhibition names it: the errors and latency a down server causes are its.
STABLE_DOWN = "LLMReleaseStableDown"
SERVER_RESTARTED = "LLMReleaseServerRestarted"
SERVER_CRASH_LOOPING = "LLMReleaseServerCrashLooping"


def template_text(value: str) -> str:
    """``value`` as literal text in a Prometheus label or annotation template."""
    return value.replace("{", '{{ "{" }}')


def _number(value: float, what: str) -> str:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise AlertRulesError(f"{what} must be a finite number >= 0, not {value}")
    return repr(value)


def _duration(seconds: int) -> str:
    return f"{int(seconds)}s"


def render_rules(
    *,
    service: str,
    release_id: str,
    ttft_p95_slo_s: float,
    error_share_ceiling: float,
    queue_ceiling: float = 20,
    kv_cache_ceiling: float = 0.95,
    window_s: int = 300,
    for_s: int = 300,
    gauge_for_s: int = 120,
) -> str:
    """The rule file (YAML) for ``service``'s stable release ``release_id``.

    Latency and error shares are judged over ``window_s`` and must hold for ``for_s``;
    queue and KV cache are gauges, alerted when above their ceiling for ``gauge_for_s``.
    """
    queries = load_queries()

    def query(name: str) -> str:
        return render_query(queries[name].promql, service=service, role="stable", window_s=window_s)

    stable = f'service="{promql_string_content(service)}", role="stable"'
    labels = {"service": template_text(service), "release": template_text(release_id)}
    who = f"{template_text(service)} (stable release {template_text(release_id)})"

    def rule(name: str, expr: str, for_: int, severity: str, summary: str) -> dict:
        return {
            "alert": name,
            "expr": expr,
            "for": _duration(for_),
            "labels": {"severity": severity, **labels},
            "annotations": {"summary": f"{who}: {summary}"},
        }

    slo = _number(ttft_p95_slo_s, "ttft_p95_slo_s")
    errors = _number(error_share_ceiling, "error_share_ceiling")
    queue = _number(queue_ceiling, "queue_ceiling")
    kv = _number(kv_cache_ceiling, "kv_cache_ceiling")
    rules = [
        rule(
            STABLE_DOWN,
            f'absent(up{{job="{VLLM_JOB}", {stable}}} == 1)',
            60,
            "critical",
            "no stable vLLM server answers Prometheus",
        ),
        rule(
            "LLMReleaseTTFTAboveSLO",
            f"{query('ttft_p95_s')} > {slo}",
            for_s,
            "critical",
            f"TTFT p95 is {{{{ $value | humanizeDuration }}}}, above the SLO of {slo} s",
        ),
        rule(
            "LLMReleaseHTTPErrors",
            f"{query('http_error_share')} > {errors}",
            for_s,
            "critical",
            f"{{{{ $value | humanizePercentage }}}} of requests fail at HAProxy (ceiling {errors})",
        ),
        rule(
            "LLMReleaseEngineErrors",
            f"{query('engine_error_share')} > {errors}",
            for_s,
            "critical",
            f"vLLM aborts or fails {{{{ $value | humanizePercentage }}}} of requests "
            f"(ceiling {errors})",
        ),
        rule(
            "LLMReleaseQueueHigh",
            f"max(vllm:num_requests_waiting{{{stable}}}) > {queue}",
            gauge_for_s,
            "warning",
            f"{{{{ $value }}}} requests wait for the engine (ceiling {queue})",
        ),
        rule(
            "LLMReleaseKVCacheFull",
            f"max(vllm:kv_cache_usage_perc{{{stable}}}) > {kv}",
            gauge_for_s,
            "warning",
            f"KV cache {{{{ $value | humanizePercentage }}}} used (ceiling {kv})",
        ),
    ]
    rules += restart_rules(service, window_s=window_s)
    document = {"groups": [{"name": GROUP, "rules": rules}]}
    return yaml.safe_dump(document, sort_keys=False, width=1_000_000)


def restart_rules(service: str, *, window_s: int = 300) -> list[dict]:
    """A serving release's server restarted, or crash-loops (its supervisor gave up): for
    either role, the release and role taken from the supervisor's series (no static
    ``release`` label: it would name the stable release for a canary's restart)."""
    selector = f'job="{SUPERVISOR_JOB}", service="{promql_string_content(service)}"'
    labels = {"service": template_text(service)}
    who = "{{ $labels.role }} release {{ $labels.release }} of " + template_text(service)
    return [
        {
            "alert": SERVER_RESTARTED,
            "expr": f"max by (release, role) "
            f"(increase(llm_release_server_restarts_total{{{selector}}}[{_duration(window_s)}]))"
            " > 0",
            "labels": {"severity": "warning", **labels},
            "annotations": {
                "summary": f"{who}: its server died and was restarted "
                "({{ $value | humanize }} times in the last window)"
            },
        },
        {
            "alert": SERVER_CRASH_LOOPING,
            "expr": f"max by (release, role) (llm_release_server_crash_looping{{{selector}}}) > 0",
            "labels": {"severity": "critical", **labels},
            "annotations": {
                "summary": f"{who}: its server crash-loops and is no longer restarted "
                "('llm-release up' starts it again; a canary is rolled back)"
            },
        },
    ]


def promtool_check(path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        raise AlertRulesError(
            "promtool is not installed",
            hint="run 'make setup' (Debian's prometheus package ships promtool)",
        )
    check = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    if check.returncode != 0:
        output = (check.stdout + check.stderr).strip()
        raise AlertRulesError(
            f"promtool rejected the alert rules:\n{output}",
            hint="the rules come from render_rules(); a threshold or name made them invalid",
        )


def install_rules(prometheus: Prometheus, text: str) -> Path:
    """Check ``text`` with promtool, put it where ``prometheus`` loads rules (atomically),
    and reload it; a rule file Prometheus refuses is taken back out. Returns its path."""
    pending = prometheus.directory / "rules.pending.yml"  # outside the rules/*.yml glob
    atomic_write_text(pending, text)
    try:
        promtool_check(pending)
    except BaseException:
        pending.unlink(missing_ok=True)
        raise
    prometheus.rules_dir.mkdir(parents=True, exist_ok=True)
    target = prometheus.rules_dir / RULES_FILE
    previous = target.read_text() if target.exists() else None
    os.replace(pending, target)
    if prometheus.running():
        try:
            prometheus.reload()
        except MetricsError as exc:
            if previous is None:
                target.unlink(missing_ok=True)
            else:
                atomic_write_text(target, previous)
            try:
                prometheus.reload()
            except MetricsError:
                pass
            raise AlertRulesError(
                f"Prometheus refused the alert rules (the previous rules are back): {exc.message}",
                hint=exc.hint or None,
            ) from None
    return target


def install_for_stable(
    release_id: str, service: str, ttft_p95_slo_s: float, analysis: AnalysisConfig
) -> Path:
    """The alert rules for the release that is stable now, loaded into the project's
    Prometheus (the analysis's ceilings are the alerts' thresholds)."""
    text = render_rules(
        service=service,
        release_id=release_id,
        ttft_p95_slo_s=analysis.ttft_p95_ceiling_s or ttft_p95_slo_s,
        error_share_ceiling=analysis.error_ceiling(),
        queue_ceiling=analysis.queue_ceiling,
        kv_cache_ceiling=analysis.kv_cache_ceiling,
    )
    return install_rules(for_home(), text)
