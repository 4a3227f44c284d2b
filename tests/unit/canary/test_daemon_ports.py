"""The port files of Prometheus, Alertmanager and HAProxy's exporter are state files: the
credentials their clients send go to a recorded port only while the daemon itself holds it
(issue 36, found by a review)."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from llm_release.canary.alertmanager import Alertmanager
from llm_release.canary.prometheus import Prometheus
from llm_release.canary.router import Router
from llm_release.errors import AlertmanagerError, MetricsError

# A stand-in daemon: its command line names its config as the real one's does, and it
# listens on the port it prints (its own), as a started server would.
LISTENER = """
import socket, sys, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
print(server.getsockname()[1], flush=True)
time.sleep(120)
"""


@pytest.fixture()
def stand_in():
    started = []

    def start(cmdline_arg: str) -> tuple[subprocess.Popen, int]:
        proc = subprocess.Popen(
            [sys.executable, "-c", LISTENER, cmdline_arg], stdout=subprocess.PIPE, text=True
        )
        started.append(proc)
        return proc, int(proc.stdout.readline())

    yield start
    for proc in started:
        proc.kill()
        proc.wait(10)
        proc.stdout.close()


@pytest.fixture()
def stranger():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    yield sock.getsockname()[1]
    sock.close()


@pytest.mark.parametrize(
    ("daemon", "error"), [(Alertmanager, AlertmanagerError), (Prometheus, MetricsError)]
)
def test_a_port_file_naming_a_port_the_daemon_does_not_hold_is_refused(
    tmp_path, stand_in, stranger, daemon, error
):
    found = daemon(tmp_path)
    proc, own = stand_in(f"--config.file={found.config_path}")
    found.pid_path.write_text(f"{proc.pid}\n")
    found.port_path.write_text(f"{own}\n")
    assert daemon(tmp_path).port == own  # its own port: as recorded
    found.port_path.write_text(f"{stranger}\n")
    with pytest.raises(error, match=f"names port {stranger} held by pid .*not its server's"):
        daemon(tmp_path)


def test_haproxys_exporter_port_held_by_another_process_is_not_scraped(
    tmp_path, stand_in, stranger
):
    router = Router(tmp_path / "router", 1)
    router.directory.mkdir()
    proc, own = stand_in(str(router.config_path))
    router.pid_path.write_text(f"{proc.pid}\n")
    router.metrics_port_path.write_text(f"{own}\n")
    assert router.metrics_port == own
    router.metrics_port_path.write_text(f"{stranger}\n")
    assert router.metrics_port is None
