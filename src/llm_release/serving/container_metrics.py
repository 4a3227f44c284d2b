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

It also watches for a hung server, as the supervisor does: Docker restarts a container that
exits, not one whose vLLM is alive and answers nothing. A server that answered ``/health``
once and then none for ``HANG_AFTER_S`` (the supervisor's ``hang_after_s``) has every process
of the container but its init killed (``docker exec``: a kill through the daemon's API counts
as stopped by hand, and the restart policy would leave it down); the init (tini) exits with
the server's status, so the restart policy starts it again and the restart is counted (and
its crash loop, if it keeps hanging) like any other.

It exits by itself when its container is gone (stopped and removed by a rollback, a
promotion or ``down``), and ``down`` reaps it with the rest (``processes.HOME_MARK``).

    python -m llm_release.serving.container_metrics CONTAINER SERVICE RELEASE ROLE PORT HEALTH_URL [HANG_AFTER_S]
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

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


class HangWatch:
    """When a running container's server is hung: it answered /health once (since the
    container last started) and none for ``hang_after_s`` since. A restart (the count moved,
    or the container is not running) starts the watch over."""

    def __init__(self, hang_after_s: float) -> None:
        self.hang_after_s = hang_after_s
        self.last_answer: float | None = None
        self.restarts: int | None = None

    def reset(self) -> None:
        self.last_answer = None

    def hung(self, reading: ContainerReading, answered: bool, now: float) -> bool:
        if reading.status != "running" or reading.restarts != self.restarts:
            self.restarts = reading.restarts
            self.reset()
            if reading.status != "running":
                return False
        if answered:
            self.last_answer = now
            return False
        return self.last_answer is not None and now - self.last_answer >= self.hang_after_s


# Every process of the container but its init (tini, PID 1) and this one: vLLM and its
# engine processes. Python is in the project's image and in vLLM's official one.
KILL_SERVER = ["python3", "-c", "import os, signal; os.kill(-1, signal.SIGKILL)"]


def kill_server(container_id: str) -> None:
    """Kill the container's server from inside it: its init then exits with the server's
    status, which the ``on-failure`` restart policy restarts (a kill or stop through the
    daemon's API is one by hand, which it does not)."""
    from llm_release.serving.backends.docker_client import find_container

    found = find_container(container_id)
    if found is not None:
        found.exec_run(KILL_SERVER, detach=True)


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
    from prometheus_client import CollectorRegistry

    from llm_release import server_key
    from llm_release.serving import locked_exporter

    container, service, release, role, port, health_url, *rest = argv
    # The 8th: the servers' key file (Prometheus sends that key; an exporter without one
    # answers nobody). A path, never the key: argv is every local user's to read.
    key = server_key.read(Path(rest[1])) if len(rest) > 1 else ""
    if rest:
        hang_after_s = float(rest[0])
    else:
        from llm_release.serving.supervise import RestartPolicy

        hang_after_s = RestartPolicy.from_settings().hang_after_s
    watch = HangWatch(hang_after_s)
    registry = CollectorRegistry()
    registry.register(
        ContainerCollector(
            (service, release, role), lambda: read_container(container), lambda: healthy(health_url)
        )
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    locked_exporter.serve(int(port), registry, key)
    print(f"container metrics for {release} ({container[:12]}) on 127.0.0.1:{port}", flush=True)
    while not stop.wait(POLL_S):
        try:
            reading = read_container(container)
            if reading is None:
                print(f"the container of {release} is gone: exiting", flush=True)
                return 0
            answered = reading.status == "running" and healthy(health_url)
            if watch.hung(reading, answered, time.monotonic()):
                print(
                    f"the server of {release} answered no /health for {hang_after_s:g} s: "
                    "hung; killing it (the restart policy starts it again)",
                    flush=True,
                )
                kill_server(container)
                watch.reset()
        except Exception as exc:  # noqa: BLE001 - the daemon restarting: try again
            print(f"reading the container of {release}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
