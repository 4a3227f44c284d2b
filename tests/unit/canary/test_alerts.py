"""Alert rules through the real promtool: they load, they fire for the service they name
(and only for it) whatever its name, and a rule file promtool refuses is never installed."""

import subprocess

import pytest
import yaml

from llm_release.canary.alerts import install_rules, render_rules
from llm_release.canary.analysis import load_queries, promql_string_content, render_query
from llm_release.canary.prometheus import Prometheus
from llm_release.errors import AlertRulesError
from tests.helpers import require_tool


@pytest.fixture(autouse=True)
def _promtool():
    require_tool("promtool")  # a missing promtool fails these tests; 'make setup' installs it


HOSTILE = 'x"} or vector(1) or up{a="{{ $value }}" \\'


def promtool(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], capture_output=True, text=True, cwd=cwd)


def rules(service: str = HOSTILE) -> str:
    return render_rules(
        service=service,
        release_id="fp8-dynamic-0123abcd-1",
        ttft_p95_slo_s=3.0,
        error_share_ceiling=0.01,
    )


def test_rules_for_a_hostile_service_name_pass_promtool(tmp_path):
    path = tmp_path / "rules.yml"
    path.write_text(rules())
    check = promtool("check", "rules", str(path))
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 8 rules found" in check.stdout


def test_the_queue_alert_fires_for_its_service_only_with_its_name_as_written(tmp_path):
    (tmp_path / "rules.yml").write_text(rules())
    stable = f'service="{promql_string_content(HOSTILE)}", role="stable"'
    other = 'service="other", role="stable"'
    labels = {"severity": "warning", "service": HOSTILE, "release": "fp8-dynamic-0123abcd-1"}
    summary = f"{HOSTILE} (stable release fp8-dynamic-0123abcd-1): 25 requests wait for the engine (ceiling 20.0)"
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": f"vllm:num_requests_waiting{{{stable}}}", "values": "25x10"},
                ],
                "alert_rule_test": [
                    {"eval_time": "1m", "alertname": "LLMReleaseQueueHigh", "exp_alerts": []},
                    {
                        "eval_time": "5m",
                        "alertname": "LLMReleaseQueueHigh",
                        "exp_alerts": [
                            {"exp_labels": labels, "exp_annotations": {"summary": summary}}
                        ],
                    },
                ],
            },
            {
                # Another service's queue: the hostile name matches nothing but itself.
                "interval": "1m",
                "input_series": [
                    {"series": f"vllm:num_requests_waiting{{{other}}}", "values": "25x10"}
                ],
                "alert_rule_test": [
                    {"eval_time": "5m", "alertname": "LLMReleaseQueueHigh", "exp_alerts": []}
                ],
            },
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    run = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_restart_and_a_crash_loop_alert_with_the_release_and_role_that_had_them(tmp_path):
    (tmp_path / "rules.yml").write_text(rules("tiny"))
    canary = 'job="supervisor", service="tiny", release="canary-1", role="canary"'
    stable = 'job="supervisor", service="tiny", release="stable-1", role="stable"'
    who = {"service": "tiny", "release": "canary-1", "role": "canary"}
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    # The canary's server restarts at minute 3, then crash-loops at 6.
                    {
                        "series": f"llm_release_server_restarts_total{{{canary}}}",
                        "values": "0 0 0 1 1 1 2 2 2 2 2 2 2 2 2",
                    },
                    {
                        "series": f"llm_release_server_crash_looping{{{canary}}}",
                        "values": "0 0 0 0 0 0 1 1 1 1",
                    },
                    # The stable's never restarts: no alert names it.
                    {"series": f"llm_release_server_restarts_total{{{stable}}}", "values": "0x14"},
                    {"series": f"llm_release_server_crash_looping{{{stable}}}", "values": "0x14"},
                ],
                "alert_rule_test": [
                    {"eval_time": "2m", "alertname": "LLMReleaseServerRestarted", "exp_alerts": []},
                    {
                        "eval_time": "4m",
                        "alertname": "LLMReleaseServerRestarted",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning", **who},
                                "exp_annotations": {
                                    "summary": "canary release canary-1 of tiny: its server "
                                    "died and was restarted (1 times in the last window)"
                                },
                            }
                        ],
                    },
                    # No restart in the last 5 minutes: resolved.
                    {
                        "eval_time": "14m",
                        "alertname": "LLMReleaseServerRestarted",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "5m",
                        "alertname": "LLMReleaseServerCrashLooping",
                        "exp_alerts": [],
                    },
                    {
                        "eval_time": "7m",
                        "alertname": "LLMReleaseServerCrashLooping",
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "critical", **who},
                                "exp_annotations": {
                                    "summary": "canary release canary-1 of tiny: its server "
                                    "crash-loops and is no longer restarted ('llm-release up' "
                                    "starts it again; a canary is rolled back)"
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    run = promtool("test", "rules", "tests.yml", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr


def test_every_analysis_query_parses(tmp_path):
    # Each query as a recording rule: promtool parses its PromQL, hostile name included.
    group = {
        "name": "analysis",
        "rules": [
            {
                "record": f"analysis:{name}",
                "expr": render_query(q.promql, service=HOSTILE, role=role, window_s=60),
            }
            for name, q in load_queries().items()
            for role in ("stable", "canary")
        ],
    }
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    check = promtool("check", "rules", str(path))
    assert check.returncode == 0, check.stdout + check.stderr


def test_install_rules_refuses_what_promtool_refuses(tmp_path):
    prometheus = Prometheus(tmp_path / "prometheus", port=1)  # not running: no reload
    good = install_rules(prometheus, rules("svc"))
    assert good == prometheus.rules_dir / "llm-release.yml"
    assert yaml.safe_load(good.read_text())["groups"][0]["rules"][0]["labels"]["service"] == "svc"
    bad = "groups:\n- name: g\n  rules:\n  - alert: A\n    expr: sum(\n"
    with pytest.raises(AlertRulesError, match="promtool rejected the alert rules") as caught:
        install_rules(prometheus, bad)
    assert "parse error" in str(caught.value)
    # The installed file is still the good one; nothing half-written is left behind.
    assert "svc" in good.read_text()
    assert sorted(p.name for p in prometheus.directory.rglob("*") if p.is_file()) == [
        "llm-release.yml"
    ]
