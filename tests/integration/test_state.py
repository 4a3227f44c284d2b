"""Release state against real processes and a real HAProxy: a reused pid is never touched,
a corrupt registry still lets `down` stop what the project started, and a rollback that
drains while a new release deploys leaves HAProxy agreeing with the registry."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from llm_release import registry
from llm_release.canary import promote
from llm_release.canary.router import Router
from llm_release.cli import main as cli
from llm_release.config import ServingConfig
from llm_release.errors import StateError
from llm_release.registry import Release
from llm_release.serving import processes
from llm_release.serving.processes import start_time
from llm_release.serving.serve import free_port

pytestmark = pytest.mark.integration


def spawn(*extra: str, home: Path | None = None) -> subprocess.Popen:
    """A process group leader that sleeps, standing in for a server process; with ``home``
    it carries that home's mark, as the servers the project starts there do."""
    code = "import time; time.sleep(60)"
    env = dict(os.environ)
    if home is not None:
        env[processes.HOME_MARK] = str(home.resolve())
    return subprocess.Popen([sys.executable, "-c", code, *extra], start_new_session=True, env=env)


def alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def release(name: str, proc: subprocess.Popen, port: int, started: float | None) -> Release:
    return Release(
        release_id=f"{name}-0123abcd-20261130000000",
        candidate=name,
        scheme="FP8_DYNAMIC",
        repo_id="a/b",
        commit="0" * 40,
        model_dir="/nonexistent",
        public_name="b",
        port=port,
        pid=proc.pid,
        pid_started=started,
        log_path="/dev/null",
        serving=ServingConfig(),
    )


@pytest.fixture()
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if alive(proc):
            proc.kill()
        proc.wait(timeout=5)


def test_a_reused_pid_is_never_killed(home, procs, capsys):
    stranger = spawn()
    procs.append(stranger)
    time.sleep(0.1)
    wrong = start_time(stranger.pid) - 30  # the recorded server started 30 s earlier
    with registry.locked() as state:
        state.stable = release("stable", stranger, free_port(), wrong)
    assert not promote.release_alive(registry.load().stable)
    assert cli(["down"]) == 0
    assert "nothing was running" in capsys.readouterr().out
    assert alive(stranger), "down killed a process that merely reused a recorded pid"
    # An old record without a start time: the command line must name the release.
    with registry.locked() as state:
        state.stable = release("stable", stranger, free_port(), None)
    promote.down()
    assert alive(stranger)
    # A record naming its real pid and start time (both readable in /proc): still not a
    # process the project started (no home mark), so nothing signals it.
    with registry.locked() as state:
        state.stable = release("stable", stranger, free_port(), start_time(stranger.pid))
    assert not promote.release_alive(registry.load().stable)
    promote.down()
    assert alive(stranger), "down killed a process a forged record named"
    # The control: a process this home's project started, recorded with its real start
    # time, is ours and stops.
    # A process of this home, recorded with its real pid and start time under another
    # release's name (say, a canary record naming the stable's server, which a rollback
    # stops): not that release's, as its command line does not name it; it is not stopped.
    # ('down' stops every process of the home, records or not.)
    other = spawn("--served-model-name", "b", "canary-0123abcd-20261130000000", home=home)
    procs.append(other)
    time.sleep(0.1)
    forged = release("stable", other, free_port(), start_time(other.pid))
    assert not promote.release_alive(forged)
    assert not promote.stop_release(forged)
    assert alive(other), "another release's server was stopped for a forged record"
    # The control: a process this home's project started for the release (its command line
    # names it, as vLLM's --served-model-name does), recorded with its real start time, is
    # ours and stops.
    ours = spawn("--served-model-name", "b", "stable-0123abcd-20261130000000", home=home)
    procs.append(ours)
    time.sleep(0.1)
    with registry.locked() as state:
        state.stable = release("stable", ours, free_port(), start_time(ours.pid))
    assert promote.release_alive(registry.load().stable)
    assert any("vLLM stable" in s for s in promote.down())
    ours.wait(timeout=15)
    assert alive(stranger)


def test_a_reused_pid_in_a_pid_file_is_never_killed(home, procs):
    pid_dir = home / "pids"
    pid_dir.mkdir()
    stale = pid_dir / "hub.pid"
    stale.write_text("0\n")
    time.sleep(1.2)
    stranger = spawn()  # started after the pid file was written: not the hub
    procs.append(stranger)
    stale.write_text(f"{stranger.pid}\n")
    stamp = time.time() - 5
    import os

    os.utime(stale, (stamp, stamp))
    assert cli(["down"]) == 0
    assert alive(stranger) and not stale.exists()


def test_corrupt_registry_is_one_line_and_down_still_stops_the_servers(home, procs, capsys):
    # A server started under the home (its command line names a model there) and HAProxy.
    server = spawn("vllm.entrypoints.openai.api_server", "--model", f"{home}/models/x")
    procs.append(server)
    router = Router(home / "router", free_port())
    router.start(None, None)
    haproxy = router.pid()
    assert haproxy
    registry.registry_path().write_text('{"stable": {"release_id": ')
    assert cli(["canary", "status"]) != 0
    err = capsys.readouterr().err
    assert str(registry.registry_path()) in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err
    assert cli(["down"]) == 1
    captured = capsys.readouterr()
    assert "HAProxy" in captured.out and f"pid {server.pid}" in captured.out
    assert "corrupt" in captured.err and len(captured.err.strip().splitlines()) == 1
    server.wait(timeout=15)
    assert router.pid() is None
    registry.registry_path().unlink()


class Backend:
    """An HTTP server that answers like a vLLM server: /health, /metrics, any request."""

    def __init__(self, name: str) -> None:
        self.hits = 0
        self.metrics_polled = threading.Event()
        self.drained = threading.Event()
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path == "/metrics":
                    backend.metrics_polled.set()
                    running = 0 if backend.drained.is_set() else 1
                    body = f'vllm:num_requests_running{{model_name="b"}} {running}\n'.encode()
                else:
                    if self.path != "/health":
                        backend.hits += 1
                    body = name.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_rollback_draining_while_a_release_deploys_leaves_haproxy_and_registry_agreeing(
    home, procs, monkeypatch
):
    """vLLM's start is replaced by a sleeping process plus an HTTP backend (a real vLLM
    takes minutes here); the registry, its lock, the drain and HAProxy are the real ones."""
    backends = {name: Backend(name) for name in ("stable", "old", "new")}

    def start_release(target, public_name, role):
        proc = spawn(f"{target.candidate}-0123abcd-20261130000000", home=home)
        procs.append(proc)
        time.sleep(0.05)
        return release(
            target.candidate, proc, backends[target.candidate].port, start_time(proc.pid)
        )

    monkeypatch.setattr(promote, "_start_release", start_release)
    # The backends answer from threads of this process, not from the recorded sleepers:
    # the port check (tests/integration/test_port_ownership.py) would refuse the record.
    monkeypatch.setattr(promote.backends, "port_problems", lambda release: [])

    def target(name: str) -> promote.DeployTarget:
        return promote.DeployTarget(
            name, "FP8_DYNAMIC", Path("/x"), "a/b", "0" * 40, ServingConfig()
        )

    port = free_port()
    try:
        promote.deploy(
            target("stable"), target("old"), public_name="b", canary_weight=5, router_port=port
        )
        rollback = threading.Thread(target=promote.rollback, kwargs={"drain_timeout_s": 30})
        rollback.start()
        # The rollback set the old canary's weight to 0 and is now draining it, unlocked.
        assert backends["old"].metrics_polled.wait(10)
        promote.deploy(None, target("new"), public_name="b", canary_weight=5)
        backends["old"].drained.set()
        rollback.join(30)
        assert not rollback.is_alive()
        state = registry.load()
        assert state.canary is not None and state.canary.candidate == "new"
        router = promote.router_for(state)
        stats = router.stats()
        assert stats["canary"]["weight"] == "5" and stats["canary"]["status"] != "MAINT"
        answers = [
            requests.get(f"{router.url}/x", headers=router.auth_headers, timeout=5).text
            for _ in range(100)
        ]
        # ~5% reach the new canary (roundrobin after weight changes is within one or two).
        assert 2 <= answers.count("new") <= 8 and answers.count("old") == 0
    finally:
        for backend in backends.values():
            backend.close()
        for proc in procs:
            if alive(proc):
                proc.send_signal(signal.SIGTERM)


def test_a_restart_from_an_edited_registry_serves_nothing_outside_the_home(home, procs):
    gone = spawn()
    gone.kill()
    gone.wait()
    with registry.locked() as state:
        state.stable = release("stable", gone, free_port(), None)  # model_dir /nonexistent
        state.router_port = free_port()
    before = registry.load()
    with pytest.raises(StateError, match="model_dir '/nonexistent' is outside"):
        promote.deploy(None, None, public_name="b", canary_weight=5)
    assert registry.load() == before
    assert not (home / "servers").exists()
