"""A drain fails closed: an in-flight count that cannot be read is unknown, never 0.

Real sockets and processes: a server whose /metrics accepts the connection and never
answers, a HAProxy runtime socket that refuses connections (a live process named by the
router's pid file, its socket file with nobody listening), and the fake OpenAI server of
tests/fake_openai.py for a server that reads empty."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from llm_release import registry
from llm_release.canary import drain, promote
from llm_release.canary.router import Router
from llm_release.cli import EXIT_DRAIN_UNCONFIRMED
from llm_release.cli import main as cli
from llm_release.config import ServingConfig
from llm_release.registry import Release
from llm_release.serving.processes import start_time
from tests.fake_openai import FakeServer
from tests.helpers import marked_env

# Accepts every connection and never answers: a /metrics endpoint that hangs.
HANGING = """
import socket, sys, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(16)
print(server.getsockname()[1], flush=True)
held = []
while True:
    conn, _ = server.accept()
    held.append(conn)
"""


def release_for(pid: int, port: int, name: str = "canary-0123abcd-20261201000000") -> Release:
    return Release(
        release_id=name,
        candidate="canary",
        scheme="none",
        repo_id="a/b",
        commit="0" * 40,
        model_dir="/nonexistent",
        public_name="svc",
        port=port,
        pid=pid,
        pid_started=start_time(pid),
        log_path="/dev/null",
        serving=ServingConfig(),
    )


@pytest.fixture()
def hanging_server(home):
    proc = subprocess.Popen(
        [sys.executable, "-c", HANGING, "canary-0123abcd-20261201000000"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=marked_env(),
    )
    port = int(proc.stdout.readline())
    yield proc, port
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    proc.stdout.close()


@pytest.fixture()
def refusing_router(tmp_path):
    """A Router whose HAProxy 'runs' (a live process whose command line names its config,
    as pid_from_file checks) while its runtime socket refuses every connection."""
    router = Router(tmp_path / "router", 1)
    router.directory.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)", str(router.config_path)],
        start_new_session=True,
    )
    router.pid_path.write_text(str(proc.pid))
    # Until it has exec'd, its /proc cmdline is the forking test's: not yet HAProxy's.
    deadline = time.monotonic() + 10
    while router.pid() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(router.socket_path))  # a socket file nobody listens on
    yield router
    bound.close()
    proc.kill()
    proc.wait(timeout=10)


def test_a_hanging_metrics_endpoint_and_a_refusing_router_are_unknown_not_drained(
    hanging_server, refusing_router
):
    proc, port = hanging_server
    release = release_for(proc.pid, port)
    assert refusing_router.running()
    with pytest.raises(ConnectionRefusedError):
        refusing_router.in_flight("canary", port)
    assert drain.running_requests(release, timeout_s=0.5) is None
    assert drain.router_in_flight(refusing_router, "canary", port) is None

    started = time.monotonic()
    result = drain.drain_and_stop(release, 1.5, router=refusing_router, slot="canary")
    waited = time.monotonic() - started
    assert result.outcome == "unknown" and not result.confirmed_empty, result
    assert (result.router_in_flight, result.server_in_flight) == (None, None)
    assert "could not confirm an empty server" in result.detail
    assert 1.5 <= waited < 10, "it waited to its deadline, and not much longer"
    assert proc.wait(timeout=10) is not None, "stopped all the same"


def test_metrics_without_vllm_gauges_or_with_an_error_status_are_unknown(tmp_path):
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from threading import Thread

    answers = iter([(500, b"oops"), (200, b"# HELP nothing here\n"), (200, b"")])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            code, body = next(answers)
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        release = release_for(1, server.server_address[1])
        assert [drain.running_requests(release, timeout_s=2) for _ in range(3)] == [None] * 3
    finally:
        server.shutdown()
        server.server_close()


def test_an_idle_server_without_a_router_drains_at_once(tmp_path):
    fake = FakeServer("idle-0123abcd-20261201000000", 0, tmp_path)
    try:
        release = release_for(fake.pid, fake.port, name="idle-0123abcd-20261201000000")
        assert drain.running_requests(release) == 0
        result = drain.drain_and_stop(release, 30)
        assert result.outcome == "drained" and result.confirmed_empty, result
        assert (result.router_in_flight, result.server_in_flight) == (0, 0)
        assert result.waited_s < 10
        # It was stopped by SIGTERM with nothing in flight (the fake records that).
        assert fake.record()["in_flight_at_stop"] == 0
    finally:
        fake.close()


def test_rollback_says_it_could_not_confirm_an_empty_server(
    home, hanging_server, capsys, monkeypatch
):
    # Prometheus following the change is beside the point here (and has its own tests).
    monkeypatch.setattr(promote, "_follow_metrics", lambda state, router: None)
    proc, port = hanging_server
    canary = release_for(proc.pid, port)
    stable = release_for(proc.pid, port, name="stable-0123abcd-20261130000000")
    registry.save(registry.RegistryState(stable=stable, canary=canary, canary_weight=5))

    assert cli(["canary", "rollback", "--drain-timeout", "1"]) == EXIT_DRAIN_UNCONFIRMED
    err = capsys.readouterr().err
    assert "drain unknown: could not confirm an empty server" in err, err
    state = registry.load()
    assert state.canary is None
    drains = [e for e in state.history if e["event"] == "drain"]
    assert drains and drains[-1]["outcome"] == "unknown"
    assert drains[-1]["release"] == canary.release_id


def test_running_requests_sums_every_series_and_a_page_that_does_not_parse_is_unknown():
    from http.server import BaseHTTPRequestHandler, HTTPServer
    from threading import Thread

    gauges = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="svc"} 2\n'
        'vllm:num_requests_running{model_name="svc-0123"} 1\n'
        'vllm:num_requests_waiting{model_name="svc"} 4 1700000000000\n'
        "vllm:num_requests_total 99\n"
    )
    answers = iter([gauges, gauges + "a line that is not a sample\n"])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = next(answers).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    try:
        release = release_for(1, server.server_address[1])
        assert drain.running_requests(release, timeout_s=2) == 7
        assert drain.running_requests(release, timeout_s=2) is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_recorded_port_another_process_holds_is_not_asked_and_not_called_empty(tmp_path):
    """The release's row names its own live server but a port a stranger listens on: the
    drain sends no key there, says it could not confirm an empty server, and stops the
    recorded server all the same (issue 36, found by a review)."""
    fake = FakeServer("idle-0123abcd-20261201000000", 0, tmp_path)
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    stranger.settimeout(0.5)
    try:
        release = release_for(
            fake.pid, stranger.getsockname()[1], name="idle-0123abcd-20261201000000"
        )
        result = drain.drain_and_stop(release, 30)
        assert result.outcome == "unknown" and not result.confirmed_empty, result
        assert "not its server: not asked" in result.detail and result.waited_s < 10
        with pytest.raises(TimeoutError):
            stranger.accept()  # nobody came with the key
        assert fake.record()["in_flight_at_stop"] == 0  # the recorded server was stopped
    finally:
        stranger.close()
        fake.close()
