"""A recorded port is routed to (HAProxy, Prometheus: both send the servers' key) only when the
release's own server holds it, or nobody does: a record edited to name another process's
port is refused before anything is sent there (issue 36)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llm_release import registry
from llm_release.canary import promote
from llm_release.config import ServingConfig
from llm_release.errors import StateError
from llm_release.registry import Release
from llm_release.serving import backends, processes
from llm_release.serving.serve import free_port

pytestmark = pytest.mark.integration
RELEASE_ID = "stable-0123abcd-20261205000000"

# Listens on argv[1]; with argv[2] == "child", a child of it listens instead (a supervisor
# and its vLLM).
LISTENER = """
import socket, subprocess, sys, time
port, how = int(sys.argv[1]), sys.argv[2]
if how == "child":
    subprocess.Popen([sys.executable, __file__, str(port), "self", *sys.argv[3:]])
else:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
time.sleep(60)
"""


def listen(tmp_path: Path, port: int, how: str, home: Path | None) -> subprocess.Popen:
    script = tmp_path / "listener.py"
    script.write_text(LISTENER)
    env = dict(os.environ)
    if home is not None:
        env[processes.HOME_MARK] = str(home.resolve())
    # The release's id on its command line, as vLLM's --served-model-name puts it there.
    proc = subprocess.Popen(
        [sys.executable, str(script), str(port), how, RELEASE_ID], start_new_session=True, env=env
    )
    deadline = time.monotonic() + 20
    while not processes.listeners(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes.listeners(port), "the stand-in never listened"
    return proc


def release(pid: int, port: int) -> Release:
    return Release(
        release_id=RELEASE_ID,
        candidate="stable",
        scheme="none",
        repo_id="a/b",
        commit="0" * 40,
        model_dir="/nonexistent",
        public_name="b",
        port=port,
        pid=pid,
        pid_started=processes.start_time(pid),
        log_path="/dev/null",
        serving=ServingConfig(),
    )


@pytest.fixture()
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=5)


def test_the_releases_own_server_or_its_child_holds_the_port(home, procs, tmp_path):
    for how in ("self", "child"):
        port = free_port()
        server = listen(tmp_path, port, how, home)
        procs.append(server)
        assert backends.port_problems(release(server.pid, port)) == []


def test_a_free_port_is_no_problem(home, procs, tmp_path):
    server = listen(tmp_path, free_port(), "self", home)
    procs.append(server)
    assert backends.port_problems(release(server.pid, free_port())) == []


def test_another_processs_port_is_refused_before_haproxy_starts(home, procs, tmp_path):
    own, port = free_port(), free_port()
    server = listen(tmp_path, own, "self", home)
    stranger = listen(tmp_path, port, "self", None)  # not of this home: never the release's
    procs += [server, stranger]
    edited = release(server.pid, port)
    (problem,) = backends.port_problems(edited)
    assert problem == f"port {port} is held by pid {stranger.pid}"
    # A recorded pid that is not this home's server owns nothing, not even its own port.
    assert backends.port_problems(release(stranger.pid, port)) == [problem]
    state = registry.RegistryState(stable=edited, router_port=free_port())
    router = promote.router_for(state)
    with pytest.raises(StateError, match=f"port {port} is held by pid {stranger.pid}"):
        promote._apply(router, state)
    assert not router.running()
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass  # the stranger still listens, and nothing was sent to it by HAProxy
