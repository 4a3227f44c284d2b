"""A serving release's container in Prometheus: the Docker backend's counterpart of the
process backend's supervisor metrics (``serving/supervise.py``).

Docker restarts a serving release's container itself (its ``on-failure`` restart policy,
``docker.container_spec``), so nothing of the project sees a restart happen. This small
process, started beside each stable or canary container (``DockerServer``), reads the
container from the daemon at every scrape and serves the supervisor's series with the
same names and labels, so the same Prometheus job (the release's ``supervisor_port``) and
the same alert rules (``alerts.restart_rules``) cover both backends:

- ``llm_release_server_restarts_total``: Docker's ``RestartCount`` of the container;
- ``llm_release_server_crash_looping``: 1 once it exited with no retry left;
- ``llm_release_server_up``: 1 while it runs and its server answers ``/health``.

It exits by itself when its container is gone (stopped and removed by a rollback, a
promotion or ``down``), and ``down`` reaps it with the rest (``processes.HOME_MARK``).

    python -m llm_release.serving.container_metrics CONTAINER SERVICE RELEASE ROLE PORT HEALTH_URL
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import requests

LABELS = ["service", "release", "role"]
POLL_S = 2.0


@dataclass(frozen=True)
class ContainerReading:
    """What the daemon said of the container at one scrape (None: it is gone)."""

    status: str
    restarts: int
    looping: bool


def read_container(container_id: str) -> ContainerReading | None:
    from llm_release.serving.backends.docker import looping_reason
    from llm_release.serving.backends.docker_client import find_container

    found = find_container(container_id)
    if found is None:
        return None
    attrs = found.attrs or {}
    return ContainerReading(
        status=found.status,
        restarts=int(attrs.get("RestartCount") or 0),
        looping=looping_reason(found.status, attrs) is not None,
    )


def healthy(url: str) -> bool:
    try:
        return requests.get(url, timeout=1.0).status_code == 200
    except requests.RequestException:
        return False


class ContainerCollector:
    """prometheus_client's custom collector: one reading of the container per scrape."""

    def __init__(
        self,
        labels: tuple[str, str, str],
        read: Callable[[], ContainerReading | None],
        health: Callable[[], bool],
    ) -> None:
        self.labels = list(labels)
        self.read = read
        self.health = health

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        reading = self.read()
        if reading is None:
            return  # gone: no series rather than a made-up 0
        restarts = CounterMetricFamily(
            "llm_release_server_restarts",
            "Restarts of a serving release's server after it died",
            labels=LABELS,
        )
        restarts.add_metric(self.labels, reading.restarts)
        looping = GaugeMetricFamily(
            "llm_release_server_crash_looping",
            "1: the server crashed too often and is no longer restarted",
            labels=LABELS,
        )
        looping.add_metric(self.labels, 1.0 if reading.looping else 0.0)
        up = GaugeMetricFamily(
            "llm_release_server_up",
            "1: the container runs and its server answers /health",
            labels=LABELS,
        )
        up.add_metric(self.labels, 1.0 if reading.status == "running" and self.health() else 0.0)
        yield restarts
        yield looping
        yield up


def main(argv: list[str]) -> int:
    from prometheus_client import CollectorRegistry, start_http_server

    container, service, release, role, port, health_url = argv
    registry = CollectorRegistry()
    registry.register(
        ContainerCollector(
            (service, release, role), lambda: read_container(container), lambda: healthy(health_url)
        )
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    start_http_server(int(port), addr="127.0.0.1", registry=registry)
    print(f"container metrics for {release} ({container[:12]}) on 127.0.0.1:{port}", flush=True)
    while not stop.wait(POLL_S):
        try:
            if read_container(container) is None:
                print(f"the container of {release} is gone: exiting", flush=True)
                return 0
        except Exception as exc:  # noqa: BLE001 - the daemon restarting: try again
            print(f"reading the container of {release}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
