"""Canary analysis: the verdict from measured values, and the queries it sends."""

import math

import pytest
from pydantic import ValidationError

from llm_release.canary.analysis import analyze_window, judge, load_queries, render_query
from llm_release.config import AnalysisConfig
from llm_release.errors import ConfigError

CONFIG = AnalysisConfig()
SLO = 3.0


def healthy(**changes) -> dict[str, float | None]:
    values = {
        "requests": 40.0,
        "ttft_p95_s": 0.8,
        "itl_p95_s": 0.04,
        "http_error_share": 0.0,
        "engine_error_share": 0.0,
        "queue_max": 0.0,
        "kv_cache_usage_max": 0.1,
    }
    values.update(changes)
    return values


def outcome(canary=None, stable=None, config=CONFIG):
    values = {"canary": canary or healthy(), "stable": stable or healthy(requests=700.0)}
    checks, verdict, reason = judge(values, config, SLO)
    return {c.name: c for c in checks}, verdict, reason


def test_a_canary_like_the_stable_passes():
    checks, verdict, reason = outcome()
    assert verdict == "pass", reason
    assert {c.outcome for c in checks.values()} == {"pass"}
    assert set(checks) == set(load_queries()) - {"requests"}


def test_a_slower_canary_fails_on_the_ratio():
    checks, verdict, reason = outcome(canary=healthy(ttft_p95_s=1.1))
    assert verdict == "fail" and "ttft_p95_s" in reason
    assert checks["ttft_p95_s"].outcome == "fail"
    assert "1.1 s exceeds 1 s allowed (stable 0.8 s)" in checks["ttft_p95_s"].reason
    assert (
        checks["ttft_p95_s"].rule == "canary <= stable x 1.25 (or stable + 0.05 s); canary <= 3 s"
    )


def test_tiny_latency_differences_pass_by_the_slack():
    # 30 ms against 20 ms is 1.5x, but within 50 ms: bucket noise, not a regression.
    checks, verdict, _ = outcome(canary=healthy(itl_p95_s=0.03), stable=healthy(itl_p95_s=0.02))
    assert checks["itl_p95_s"].outcome == "pass" and verdict == "pass"


def test_the_slo_is_an_absolute_ceiling_even_without_a_stable_value():
    checks, verdict, _ = outcome(canary=healthy(ttft_p95_s=3.5), stable=healthy(ttft_p95_s=None))
    assert (
        checks["ttft_p95_s"].outcome == "fail"
        and "above the ceiling 3 s" in checks["ttft_p95_s"].reason
    )
    assert verdict == "fail"


def test_error_share_queue_and_kv_are_compared_by_difference_and_ceiling():
    over_stable = healthy(engine_error_share=0.02)
    checks, verdict, _ = outcome(
        canary=healthy(engine_error_share=0.009 + 0.02), stable=over_stable
    )
    assert checks["engine_error_share"].outcome == "fail"  # 0.029 > the 0.01 ceiling
    checks, _, _ = outcome(canary=healthy(queue_max=12), stable=healthy(queue_max=5))
    assert checks["queue_max"].outcome == "fail"  # 12 > 5 + 5
    checks, _, _ = outcome(
        canary=healthy(kv_cache_usage_max=0.96), stable=healthy(kv_cache_usage_max=0.9)
    )
    assert checks["kv_cache_usage_max"].outcome == "fail"
    assert "above the ceiling 0.95" in checks["kv_cache_usage_max"].reason


def test_too_few_canary_requests_is_inconclusive_not_a_pass():
    checks, verdict, reason = outcome(canary=healthy(requests=5.0, ttft_p95_s=9.0))
    assert verdict == "inconclusive"
    assert reason == "5 canary requests in the window; at least 20 needed"
    # A p95 of five requests is their slowest: neither a pass nor a fail.
    assert checks["ttft_p95_s"].outcome == "inconclusive"
    assert checks["queue_max"].outcome == "pass"


def test_errors_fail_a_thin_window():
    _, verdict, reason = outcome(canary=healthy(requests=4.0, http_error_share=0.5))
    assert verdict == "fail" and reason.startswith("http_error_share: canary 0.5 is above")


def test_a_missing_value_is_inconclusive_never_a_pass():
    checks, verdict, reason = outcome(canary=healthy(itl_p95_s=None))
    assert checks["itl_p95_s"].outcome == "inconclusive"
    assert verdict == "inconclusive"
    assert reason == "itl_p95_s: no canary value in the window (no data)"
    checks, verdict, _ = outcome(stable=healthy(kv_cache_usage_max=None))
    assert checks["kv_cache_usage_max"].outcome == "inconclusive" and verdict == "inconclusive"
    _, verdict, reason = outcome(canary=healthy(requests=None))
    assert verdict == "inconclusive" and reason.startswith("none canary requests")


def test_queries_render_as_plain_promql():
    queries = load_queries()
    assert render_query(
        queries["ttft_p95_s"].promql, service="SmolLM2-135M-Instruct", role="canary", window_s=60
    ) == (
        "histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket"
        '{service="SmolLM2-135M-Instruct", role="canary"}[60s])))'
    )
    assert all(
        "$" not in render_query(q.promql, service="s", role="stable", window_s=60)
        for q in queries.values()
    )


def test_a_hostile_service_name_stays_inside_its_string():
    promql = render_query(
        load_queries()["queue_max"].promql,
        service='x"} or vector(1) # $role \\',
        role="canary",
        window_s=60,
    )
    assert promql == (
        "max(max_over_time(vllm:num_requests_waiting"
        '{service="x\\"} or vector(1) # $role \\\\", role="canary"}[60s]))'
    )
    with pytest.raises(ConfigError):
        render_query("up", service="", role="canary", window_s=60)
    with pytest.raises(ConfigError):
        render_query("up", service="s", role="canary", window_s=0)


def test_analysis_config_is_strict():
    with pytest.raises(ValidationError, match="extra"):
        AnalysisConfig.model_validate({"window": 60})
    with pytest.raises(ValidationError, match="must not carry credentials"):
        AnalysisConfig(prometheus_url="http://user:secret@prom:9090")
    assert AnalysisConfig(prometheus_url="http://prom.internal:9090/").prometheus_url == (
        "http://prom.internal:9090"
    )


class RecordingClient:
    """Answers each query from a table (by metric of the query and role) and records them."""

    url = "http://prometheus.test"

    def __init__(self, table):
        self.table = table
        self.asked: list[tuple[str, float | None]] = []

    def value(self, promql, at=None):
        self.asked.append((promql, at))
        role = "canary" if 'role="canary"' in promql else "stable"
        for needle, by_role in self.table.items():
            if needle in promql:
                return by_role[role]
        raise AssertionError(promql)


def test_analyze_window_asks_both_roles_at_one_instant_over_one_window():
    table = {
        'finished_reason=~"abort|error"': {"canary": 0.0, "stable": 0.0},
        "vllm:request_success_total": {"canary": 30.0, "stable": 500.0},
        "time_to_first_token": {"canary": 0.5, "stable": 0.6},
        "inter_token_latency": {"canary": math.nan, "stable": 0.03},
        "haproxy_server": {"canary": 0.0, "stable": 0.0},
        "num_requests_waiting": {"canary": 0.0, "stable": 1.0},
        "kv_cache_usage_perc": {"canary": 0.05, "stable": 0.2},
    }
    client = RecordingClient(table)
    verdict = analyze_window(
        client, AnalysisConfig(window_s=90), service="svc", slo_ttft_p95_s=SLO, end=1000.0
    )
    assert len(client.asked) == 2 * len(load_queries())
    assert {at for _, at in client.asked} == {1000.0}
    assert all("[90s]" in promql for promql, _ in client.asked)
    assert (verdict.started_at, verdict.ended_at, verdict.window_s) == (910.0, 1000.0, 90)
    assert (verdict.canary_requests, verdict.stable_requests) == (30.0, 500.0)
    # NaN (a quantile of nothing) is no data: inconclusive.
    assert verdict.verdict == "inconclusive" and verdict.reason.startswith("itl_p95_s: no canary")
