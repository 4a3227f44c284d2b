"""Demo traffic against a small OpenAI-protocol server on 127.0.0.1, with the real openai
client: bounded by its duration and its count, steady at its rate, stoppable early,
failures counted by kind, and no thread left behind."""

from __future__ import annotations

import json
import threading
import time

import pytest

from llm_release.load.traffic import Traffic
from llm_release.serving.serve import free_port
from tests.fake_openai import FakeServer

pytestmark = pytest.mark.integration


@pytest.fixture()
def server(tmp_path):
    fake = FakeServer("svc", 0.05, tmp_path)
    yield fake
    fake.close()


def traffic_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("traffic-")]


def test_a_stream_is_steady_at_its_rate_and_ends_at_its_duration(server):
    started = time.monotonic()
    report = Traffic(
        f"http://127.0.0.1:{server.port}", "svc", rate_rps=20, duration_s=1.5, concurrency=4
    ).run()
    elapsed = time.monotonic() - started
    assert report.failed == 0 and report.succeeded == report.sent
    assert 24 <= report.sent <= 31, report  # 20/s for 1.5 s: one request every 50 ms
    assert 1.4 <= report.duration_s < 2.5 and elapsed < 4
    assert report.achieved_rate_rps == pytest.approx(20, rel=0.15)
    assert 0.05 <= report.latency_p50_s <= report.latency_p95_s < 1
    assert report.output_tokens == report.succeeded  # the fake answers one token
    assert traffic_threads() == []


def test_stop_ends_it_early_and_leaves_no_thread(server):
    with Traffic(
        f"http://localhost:{server.port}", "svc", rate_rps=50, duration_s=60, concurrency=3
    ) as traffic:
        time.sleep(0.5)
        assert traffic.running() and len(traffic_threads()) == 3
        stopping = time.monotonic()
        report = traffic.stop()
    assert time.monotonic() - stopping < 1
    assert report.stopped_early and 10 <= report.sent <= 30 and report.failed == 0
    assert traffic_threads() == []
    assert traffic.stop() is report


def test_max_requests_bounds_a_fast_stream(server):
    report = Traffic(
        f"http://127.0.0.1:{server.port}",
        "svc",
        rate_rps=1000,
        duration_s=30,
        concurrency=4,
        max_requests=25,
    ).run()
    assert report.sent == 25 and report.failed == 0


def test_failures_are_counted_by_kind_and_end_nothing(tmp_path):
    flaky = FakeServer("flaky", 0.0, tmp_path, fail_every=3)
    try:
        report = Traffic(
            f"http://127.0.0.1:{flaky.port}", "flaky", rate_rps=100, duration_s=5, max_requests=30
        ).run()
    finally:
        flaky.close()
    assert report.sent == 30 and report.errors == {"http_500": 10} and report.succeeded == 20
    assert "injected failure" in report.error_samples["http_500"]
    # Nothing listens here: each request fails at once, none is retried by the client.
    refused = Traffic(
        f"http://127.0.0.1:{free_port()}", "m", rate_rps=100, duration_s=5, max_requests=5
    ).run()
    assert refused.errors == {"connection": 5} and refused.succeeded == 0


def test_the_cli_prints_the_report_as_json(server, capsys):
    from llm_release.cli import main as cli

    url = f"http://127.0.0.1:{server.port}"
    argv = ["traffic", "--url", url, "--model", "svc", "--rate", "20", "--duration", "0.5"]
    assert cli([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0 and 8 <= report["sent"] <= 11
    assert report["base_url"] == f"{url}/v1"
