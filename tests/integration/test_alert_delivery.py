"""The project's alert rules, through a real Prometheus and a real Alertmanager, reach a
recording webhook on 127.0.0.1: a rule that fires pages once, with its labels; a warning of
the same service that follows is inhibited and pages nobody; a config amtool refuses never
reaches the running Alertmanager; Prometheus sends with Alertmanager's basic auth (nobody
gets in without it); 'down' stops it. The 'vLLM server' is an exporter the
test serves (every request it finishes aborts), so the rule's input is the test's to set."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from llm_release import paths
from llm_release.canary import promote
from llm_release.canary.alertmanager import Alertmanager, Routing
from llm_release.canary.alerts import install_rules, render_rules
from llm_release.canary.prometheus import Prometheus
from llm_release.config import ServingConfig
from llm_release.errors import AlertmanagerError
from llm_release.registry import RegistryState, Release
from llm_release.serving import processes
from tests.helpers import require_tool

SERVICE = "svc"
RELEASE = "fp8-dynamic-0123abcd-20261202000000"
# Small intervals keep the test fast; the grouping and inhibition are the production ones.
ROUTING = Routing(group_wait_s=1, group_interval_s=1, repeat_interval_s=3600)
SCRAPE_S = 0.5
FIRST_PAGE_WITHIN_S = 45


@pytest.fixture(autouse=True)
def _tools():
    for tool in ("prometheus", "promtool", "prometheus-alertmanager", "amtool"):
        require_tool(tool)  # a missing one fails the test; 'make setup' installs them


class Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture()
def receiver():
    """A webhook on 127.0.0.1 that records every body posted to it."""
    bodies: list[dict] = []

    class Handler(Quiet):
        def do_POST(self):  # noqa: N802 - http.server's name
            length = int(self.headers.get("Content-Length", 0))
            bodies.append(json.loads(self.rfile.read(length)))
            self.send_response(200)
            self.end_headers()

    server = serve(Handler)
    yield f"http://127.0.0.1:{server.server_port}/alerts", bodies
    server.shutdown()
    server.server_close()


@pytest.fixture()
def exporter():
    """A stable server's vLLM metrics: every request it finishes aborts (ten a second);
    its queue is the test's to set."""
    registry = CollectorRegistry()
    finished = Counter(
        "vllm:request_success", "requests finished", ["finished_reason"], registry=registry
    )
    waiting = Gauge("vllm:num_requests_waiting", "requests waiting", registry=registry)

    class Metrics(Quiet):
        # The text format, as vLLM serves it: prometheus_client's OpenMetrics output (what
        # Prometheus asks for first) would escape the names' ':' to '_'.
        def do_GET(self):  # noqa: N802 - http.server's name
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = serve(Metrics)
    stop = threading.Event()

    def abort() -> None:
        while not stop.wait(0.1):
            finished.labels("abort").inc()

    thread = threading.Thread(target=abort, daemon=True)
    thread.start()
    yield server.server_port, waiting
    stop.set()
    thread.join()
    server.shutdown()
    server.server_close()


def stable(port: int) -> Release:
    return Release(
        release_id=RELEASE,
        candidate="fp8-dynamic",
        scheme="FP8_DYNAMIC",
        repo_id="a/b",
        commit="0" * 40,
        model_dir="/m",
        public_name=SERVICE,
        port=port,
        pid=1,
        log_path="/dev/null",
        serving=ServingConfig(),
    )


def wait_for(what: str, condition, timeout_s: float, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def test_a_firing_rule_pages_once_with_its_labels_and_down_stops_alertmanager(
    home, receiver, exporter
):
    webhook, bodies = receiver
    exporter_port, waiting = exporter
    alerts = Alertmanager(paths.alertmanager_dir(), routing=ROUTING)
    alerts.start()
    # The operator names the webhook while it runs: the new config is checked and reloaded.
    alerts.save_webhook_url(webhook)
    assert webhook in alerts.config_path.read_text()

    prometheus = Prometheus(paths.prometheus_dir(), scrape_interval_s=SCRAPE_S)
    prometheus.targets_dir.mkdir(parents=True)
    prometheus.write_targets(RegistryState(stable=stable(exporter_port)), None)
    prometheus.write_alertmanagers([alerts.address])
    prometheus.start()
    started = time.monotonic()
    install_rules(
        prometheus,
        render_rules(
            service=SERVICE,
            release_id=RELEASE,
            ttft_p95_slo_s=3.0,
            error_share_ceiling=0.01,
            window_s=5,
            for_s=1,
            gauge_for_s=1,
        ),
    )

    # Every request aborts: the engine-error rule fires and reaches the webhook.
    wait_for("the first notification", lambda: bodies, FIRST_PAGE_WITHIN_S)
    print(f"rule installed -> webhook: {time.monotonic() - started:.1f} s")
    [page] = bodies
    assert page["receiver"] == "llm-release-notify"
    assert page["status"] == "firing"
    assert page["groupLabels"] == {"service": SERVICE}
    assert [a["labels"] for a in page["alerts"]] == [
        {
            "alertname": "LLMReleaseEngineErrors",
            "severity": "critical",
            "service": SERVICE,
            "release": RELEASE,
        }
    ]
    assert page["alerts"][0]["annotations"]["summary"].startswith(
        f"{SERVICE} (stable release {RELEASE}): vLLM aborts or fails 100% of requests"
    )

    # The queue grows too: its warning fires, joins the group, and is inhibited by the
    # critical alert of the same service, so nobody is paged again.
    waiting.set(25)

    def queue_alert():
        listed = requests.get(
            f"{alerts.url}/api/v2/alerts", auth=alerts.http_auth(), timeout=5
        ).json()
        return next((a for a in listed if a["labels"]["alertname"] == "LLMReleaseQueueHigh"), None)

    queue = wait_for("the queue alert at Alertmanager", queue_alert, FIRST_PAGE_WITHIN_S)
    assert queue["status"]["state"] == "suppressed" and queue["status"]["inhibitedBy"], queue
    time.sleep(4 * ROUTING.group_interval_s + 2 * SCRAPE_S)
    assert len(bodies) == 1, bodies

    # A config amtool refuses never reaches the running Alertmanager, which keeps its own.
    before = alerts.config_path.read_text()
    with pytest.raises(AlertmanagerError, match="amtool rejected"):
        alerts.install_config("route:\n  receiver: nobody\nreceivers: []\n")
    assert alerts.config_path.read_text() == before
    assert requests.get(f"{alerts.url}/-/ready", auth=alerts.http_auth(), timeout=5).ok
    # Prometheus paged through it with the credentials; nobody gets in without them.
    assert requests.get(f"{alerts.url}/api/v2/status", timeout=5).status_code == 401

    assert promote.status()["alertmanager"] == {
        "url": alerts.url,
        "running": True,
        "notifies": "127.0.0.1",
        "user": "llm-release",
        "password_file": str(alerts.credentials.password_path),
        "amtool": ["amtool", *alerts.amtool_args()],
    }
    pid = alerts.pid()
    # Found by its command line too, should the records be lost.
    assert pid in processes.under_home(home)
    stopped = promote.down()
    assert "Alertmanager" in stopped and "Prometheus" in stopped, stopped
    assert not alerts.running() and not processes.is_alive(pid)
    # Its notification log stays under the home: a restart does not page again.
    assert any((paths.alertmanager_dir() / "data").iterdir())
