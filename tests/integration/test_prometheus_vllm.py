"""A real Prometheus scraping two real vLLM CPU servers (stable and canary, deployed by
promote.deploy behind a real HAProxy) and HAProxy's own exporter: the analysis queries
name metrics the live servers expose, return numbers for both roles, alert rules load,
targets follow a rollback, and the TSDB outlives a restart."""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from llm_release import registry, server_key
from llm_release.canary import alertmanager, prometheus, promote
from llm_release.canary.alerts import install_rules, render_rules
from llm_release.canary.analysis import analyze_window, load_queries
from llm_release.config import AnalysisConfig, ServingConfig
from llm_release.serving.serve import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "tiny"
REQUESTS = 10  # at 50/50, about 5 per role


def wait_for(what: str, condition, timeout_s: float = 60, every_s: float = 0.5):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out waiting for {what}")


def sample_names(url: str, values: bool = False):
    """(sample name, its labels) of a /metrics page; with ``values``, mapped to the values."""
    text = requests.get(url, headers=server_key.headers(), timeout=10).text
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return samples if values else set(samples)


@pytest.fixture(scope="module")
def stack(tiny_model_dir):
    home = Path(tempfile.mkdtemp(prefix="llmr-", dir="/tmp"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLM_RELEASE_HOME", str(home))
        mp.setenv("LLM_RELEASE_PROMETHEUS_PORT", str(free_port()))
        mp.setenv("LLM_RELEASE_ALERTMANAGER_PORT", "auto")
        serving = ServingConfig(
            enforce_eager=True, max_model_len=512, max_num_seqs=4, dtype="float32"
        )

        def target(name: str) -> promote.DeployTarget:
            return promote.DeployTarget(
                name, "FP8_DYNAMIC", tiny_model_dir, "t/tiny", "0" * 40, serving
            )

        try:
            started = time.monotonic()
            state = promote.deploy(
                target("baseline"),
                target("canary"),
                public_name=SERVICE,
                canary_weight=50,
                router_port=free_port(),
            )
            print(f"deploy of two tiny servers: {time.monotonic() - started:.1f} s")
            yield state, promote.router_for(state), prometheus.for_home()
        finally:
            promote.down()


def test_prometheus_scrapes_both_roles_and_haproxy(stack):
    state, router, prom = stack
    assert prom.running() and prom.url.startswith("http://127.0.0.1:")
    # Every target up before any request, so the counters' rates start from zero.
    up = 'up{service="tiny"} == 1'
    found = wait_for(
        "5 targets up", lambda: len(prom.query(up)) == 5 and prom.query(up), timeout_s=30
    )
    # each release's vLLM and its supervisor (restarts, crash loop), and HAProxy
    assert {(s.labels["job"], s.labels.get("role")) for s in found} == {
        ("vllm", "stable"),
        ("vllm", "canary"),
        ("supervisor", "stable"),
        ("supervisor", "canary"),
        ("haproxy", None),
    }
    assert {s.labels.get("release") for s in found} == {
        state.stable.release_id,
        state.canary.release_id,
        None,
    }
    # What a scrape costs (the scrape interval's reason, in SCRAPE_INTERVAL_S's comment).
    for metric in ("scrape_duration_seconds", "scrape_samples_scraped"):
        rows = prom.query(f'{metric}{{service="tiny"}}')
        print(metric, {(r.labels["job"], r.labels.get("role")): r.value for r in rows})
    size = len(
        requests.get(
            f"http://127.0.0.1:{state.canary.port}/metrics",
            headers=server_key.headers(),
            timeout=5,
        ).content
    )
    print(f"vLLM /metrics: {size} bytes")


def test_metric_names_of_the_queries_exist_on_the_live_servers(stack):
    state, router, prom = stack
    text = "\n".join(q.promql for q in load_queries().values())
    vllm_names = set(re.findall(r"\b(vllm:[a-z_:]+)\{", text))
    haproxy_names = set(re.findall(r"\b(haproxy_[a-z_]+)\{", text))
    assert len(vllm_names) == 5 and len(haproxy_names) == 4

    live = sample_names(f"http://127.0.0.1:{state.canary.port}/metrics")
    assert vllm_names <= {name for name, _ in live}, vllm_names - {name for name, _ in live}
    reasons = {
        dict(labels)["finished_reason"]
        for name, labels in live
        if name == "vllm:request_success_total"
    }
    assert {"abort", "error"} <= reasons, reasons

    exporter = sample_names(f"http://127.0.0.1:{router.metrics_port}/metrics")
    assert haproxy_names <= {name for name, _ in exporter}
    codes = {
        dict(labels).get("code")
        for name, labels in exporter
        if name == "haproxy_server_http_responses_total" and dict(labels)["server"] == "canary"
    }
    assert "5xx" in codes
    # Loopback only, the servers' key, and nothing but /metrics on the exporter's frontend.
    root = f"http://127.0.0.1:{router.metrics_port}/"
    assert requests.get(root, timeout=5).status_code == 401
    assert requests.get(root, headers=server_key.headers(), timeout=5).status_code == 403


def finished_on(port: int) -> float:
    """Requests a vLLM server finished, from its own /metrics (exact)."""
    samples = sample_names(f"http://127.0.0.1:{port}/metrics", values=True)
    return sum(
        value for (name, _), value in samples.items() if name == "vllm:request_success_total"
    )


def test_the_analysis_returns_numbers_for_both_roles(stack):
    state, router, prom = stack
    wait_for("5 targets up", lambda: len(prom.query('up{service="tiny"} == 1')) == 5)
    ports = {"stable": state.stable.port, "canary": state.canary.port}
    before = {role: finished_on(port) for role, port in ports.items()}
    time.sleep(prom.scrape_interval_s)  # a scrape of the counts before the requests
    body = {"model": SERVICE, "prompt": "Torque for M8 bolts:", "max_tokens": 8}
    body |= {"ignore_eos": True, "temperature": 0}
    for _ in range(REQUESTS):
        reply = requests.post(
            f"{router.url}/v1/completions", json=body, headers=router.auth_headers, timeout=60
        )
        assert reply.status_code == 200, reply.text
    after = {role: finished_on(port) for role, port in ports.items()}
    sent = {role: after[role] - before[role] for role in ports}
    # Weighted roundrobin after runtime weight changes splits near, not exactly, 50/50.
    assert sum(sent.values()) == REQUESTS and min(sent.values()) >= 2, sent

    def scraped() -> dict[str, float]:
        rows = prom.query('sum by (role) (vllm:request_success_total{service="tiny"})')
        return {s.labels["role"]: s.value for s in rows}

    wait_for("the requests scraped", lambda: scraped() == after)
    time.sleep(prom.scrape_interval_s)  # HAProxy's exporter is scraped on its own schedule

    config = AnalysisConfig(min_canary_requests=2)
    verdict = analyze_window(None, config, service=SERVICE, slo_ttft_p95_s=30.0)
    print(verdict.model_dump_json(indent=2))
    assert verdict.prometheus_url == prom.url
    assert (verdict.canary_requests, verdict.stable_requests) == (sent["canary"], sent["stable"])
    checks = {c.name: c for c in verdict.checks}
    for name in ("ttft_p95_s", "itl_p95_s", "http_error_share", "engine_error_share"):
        assert checks[name].canary is not None and checks[name].stable is not None, checks[name]
    for name in ("ttft_p95_s", "itl_p95_s"):
        assert 0 < checks[name].canary < 30 and 0 < checks[name].stable < 30
    for name in ("http_error_share", "engine_error_share", "queue_max"):
        assert (checks[name].canary, checks[name].stable) == (0.0, 0.0)
    assert 0 <= checks["kv_cache_usage_max"].canary <= 1
    # Same model, same load: no check may be left without a number.
    assert verdict.verdict in ("pass", "fail") and all(
        c.outcome != "inconclusive" for c in verdict.checks
    ), verdict.reason

    # A team's own Prometheus is named by URL; an unreachable one is an error, not a pass.
    elsewhere = AnalysisConfig(prometheus_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(Exception, match="did not answer"):
        analyze_window(None, elsewhere, service=SERVICE, slo_ttft_p95_s=30.0)


def test_alert_rules_load_and_watch_the_stable_release(stack):
    state, router, prom = stack
    text = render_rules(
        service=SERVICE,
        release_id=state.stable.release_id,
        ttft_p95_slo_s=3.0,
        error_share_ceiling=0.01,
    )
    path = install_rules(prom, text)
    assert path.parent == prom.rules_dir

    def evaluated():
        groups = requests.get(f"{prom.url}/api/v1/rules", auth=prom.http_auth(), timeout=5).json()[
            "data"
        ]["groups"]
        rules = {r["name"]: r for g in groups for r in g["rules"]}
        return (
            len(rules) == 8  # incl. the supervisors' restart and crash-loop rules
            and all(r["lastEvaluation"][:4] != "0001" for r in rules.values())
            and rules
        )

    rules = wait_for("the rules evaluated", evaluated, timeout_s=30)
    assert all(r["health"] == "ok" for r in rules.values()), rules
    # The stable server answers Prometheus: its 'down' alert is not pending.
    assert rules["LLMReleaseStableDown"]["state"] == "inactive"
    # The deploy started the project's Alertmanager beside Prometheus, which sends it alerts.
    alerts = alertmanager.for_home()
    assert alerts.running()

    def alertmanagers():
        data = requests.get(
            f"{prom.url}/api/v1/alertmanagers", auth=prom.http_auth(), timeout=5
        ).json()["data"]
        return [a["url"] for a in data["activeAlertmanagers"]]

    # (its discovery updates at most every 5 s, and the rules' reload just restarted it)
    active = wait_for("Prometheus's Alertmanager", alertmanagers, timeout_s=30)
    assert active == [f"{alerts.url}/api/v2/alerts"]


def test_targets_follow_a_rollback_and_the_data_outlives_a_restart(stack):
    state, router, prom = stack
    promote.rollback(drain_timeout_s=10)
    assert [t["labels"]["role"] for t in prometheus.render_targets(registry.load(), None)[0]] == [
        "stable"
    ]

    def active_roles():
        data = requests.get(f"{prom.url}/api/v1/targets", auth=prom.http_auth(), timeout=5).json()[
            "data"
        ]
        return sorted(t["labels"].get("role", "-") for t in data["activeTargets"])

    # the stable release's vLLM and supervisor, and HAProxy ("-")
    wait_for(
        "the canary target gone",
        lambda: active_roles() == ["-", "stable", "stable"],
        timeout_s=30,
    )

    # The canary is no longer scraped; its history stays queryable.
    history = 'sum(max_over_time(vllm:request_success_total{service="tiny", role="canary"}[10m]))'
    before = prom.query(history)
    assert before and before[0].value >= 2
    assert prom.stop() and not prom.running()
    started = time.monotonic()
    prom.start()
    print(f"Prometheus restart on its TSDB: {time.monotonic() - started:.2f} s")
    after = prom.query(history)
    assert after and after[0].value == before[0].value
