"""The process backend's supervisor with a real process tree (tests/fake_vllm_tree.py:
a server that starts a child, as vLLM starts its EngineCore): a server killed with
SIGKILL is reaped as a whole group and comes back, the restart counted in its /metrics;
too many crashes are a crash loop, said in its state file and metrics; and 'down' leaves
no process of the home behind, orphans whose parent died included (by process listing).
A real vLLM killed and back through the router: tests/e2e/test_canary_e2e.py."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import requests

from llm_release import registry, server_key
from llm_release.config import ServingConfig
from llm_release.serving import processes
from llm_release.serving.backends.process import release_alive
from llm_release.serving.serve import Owner, free_port, server_env
from llm_release.serving.supervise import SupervisedServer, crash_looping, read_state

pytestmark = pytest.mark.integration

FAKE = Path(__file__).resolve().parents[1] / "fake_vllm_tree.py"


def pids(record: Path, kind: str) -> list[int]:
    if not record.exists():
        return []
    return [
        int(line.split()[1]) for line in record.read_text().splitlines() if line.startswith(kind)
    ]


def until(check, timeout_s: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def metric(port: int, name: str) -> float:
    url = f"http://127.0.0.1:{port}/metrics"
    assert requests.get(url, timeout=5).status_code == 401  # the servers' key, or nothing
    text = requests.get(url, headers=server_key.headers(), timeout=5).text
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{")
    ]
    assert len(values) == 1, text
    return values[0]


def supervised_fake(home: Path, name: str) -> tuple[SupervisedServer, Path]:
    port = free_port()
    record = home / f"{name}.pids"
    server = SupervisedServer(
        home,
        ["fake", name],
        ServingConfig(),
        home / "servers" / f"stable-{name}.log",
        port=port,
        owner=Owner(role="stable", release_id=name),
    )
    server.log_path.parent.mkdir(parents=True, exist_ok=True)
    server._launch(
        [sys.executable, str(FAKE), str(port), str(record)], server_env(ServingConfig(), "stable")
    )
    server.wait_healthy(timeout_s=30)
    return server, record


def running_again(server: SupervisedServer) -> None:
    """Its supervisor says the restarted server is healthy, and it answers /health."""
    until(
        lambda: (
            (read_state(server.log_path) or 0) and read_state(server.log_path).state == "running"
        ),
        what="healthy again",
    )
    assert requests.get(f"{server.base_url}/health", timeout=5).status_code == 200


def marked(home: Path) -> list[int]:
    """Every process of this user whose environment carries the home's mark."""
    found = []
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"].real != os.getuid() or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get(processes.HOME_MARK) == str(home.resolve()):
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def test_a_killed_server_is_reaped_whole_and_restarted_then_a_crash_loop_stops(home, monkeypatch):
    from llm_release.canary.promote import down

    monkeypatch.setenv("LLM_RELEASE_RESTART_BACKOFF_S", "0.2")
    monkeypatch.setenv("LLM_RELEASE_RESTART_LIMIT", "1")
    server, record = supervised_fake(home, "rel-a")
    try:
        [parent], [child] = pids(record, "parent"), pids(record, "child")
        assert os.getpgid(child) == parent != os.getpgid(server.pid())
        assert metric(server.supervisor_port, "llm_release_server_restarts_total") == 0

        # Killed as the OOM killer would: its child (the EngineCore) dies with its group.
        os.kill(parent, signal.SIGKILL)
        until(lambda: len(pids(record, "parent")) == 2, what="a second start")
        until(lambda: not processes.is_alive(child), 10, "the orphaned child reaped")
        running_again(server)
        assert metric(server.supervisor_port, "llm_release_server_restarts_total") == 1
        assert metric(server.supervisor_port, "llm_release_server_up") == 1
        state = read_state(server.log_path)
        assert state.restarts == 1 and state.last_exit_code == -signal.SIGKILL

        # A second crash within the window is one more than the limit (1): a crash loop.
        [_, parent2], [_, child2] = pids(record, "parent"), pids(record, "child")
        os.kill(parent2, signal.SIGKILL)
        until(lambda: crash_looping(server.log_path) is not None, what="crash-looping")
        assert "2 crashes" in crash_looping(server.log_path)
        until(lambda: not processes.is_alive(child2), 10, "the second child reaped")
        assert len(pids(record, "parent")) == 2  # not started again
        assert metric(server.supervisor_port, "llm_release_server_crash_looping") == 1
        assert server.exit_code() is None  # the supervisor stays, to be seen and stopped

        # A second supervised server; its supervisor and its server's parent die at once:
        # the server's child is an orphan with nothing of the home on its command line.
        other, other_record = supervised_fake(home, "rel-b")
        [orphan] = pids(other_record, "child")
        os.kill(other.pid(), signal.SIGKILL)
        os.kill(pids(other_record, "parent")[0], signal.SIGKILL)
        until(lambda: psutil.Process(orphan).ppid() != pids(other_record, "parent")[0], 10)
        assert str(home) not in " ".join(psutil.Process(orphan).cmdline())
        assert orphan in marked(home) and server.pid() in marked(home)

        stopped = down()
        assert any("process group" in s for s in stopped), stopped
        until(lambda: not marked(home), 15, "no process of the home left")
        assert not processes.is_alive(orphan)
        state = read_state(server.log_path)
        assert state.state == "stopped" and "crash-looping" in state.reason
    finally:
        server.stop(grace_s=5)


def test_a_release_whose_supervisor_gave_up_is_not_alive(home, monkeypatch):
    from llm_release.registry import Release

    monkeypatch.setenv("LLM_RELEASE_RESTART_LIMIT", "0")
    server, record = supervised_fake(home, "rel-c")
    try:
        release = Release(
            release_id="rel-c",
            candidate="c",
            scheme="none",
            repo_id="a/b",
            commit="0" * 40,
            model_dir=str(home),
            public_name="fake",
            port=server.port,
            pid=server.pid(),
            pid_started=processes.start_time(server.pid()),
            supervisor_port=server.supervisor_port,
            log_path=str(server.log_path),
            serving=ServingConfig(),
        )
        assert release_alive(release)
        os.kill(pids(record, "parent")[0], signal.SIGKILL)
        until(lambda: crash_looping(server.log_path) is not None, what="crash-looping")
        assert not release_alive(release) and processes.is_alive(server.pid())
    finally:
        server.stop(grace_s=5)
    assert not processes.is_alive(server.pid())


def test_a_hung_server_is_killed_whole_and_restarted(home, monkeypatch):
    """Alive to the kernel, no answer on /health (a stopped process, as a deadlocked engine
    looks from outside): after hang_after_s its supervisor kills its group and starts it
    again, a restart like any other, and says why."""
    monkeypatch.setenv("LLM_RELEASE_HANG_AFTER_S", "5")
    monkeypatch.setenv("LLM_RELEASE_RESTART_BACKOFF_S", "0.2")
    server, record = supervised_fake(home, "rel-h")
    try:
        [parent], [child] = pids(record, "parent"), pids(record, "child")
        os.kill(parent, signal.SIGSTOP)
        stopped_at = time.monotonic()
        until(lambda: len(pids(record, "parent")) == 2, 30, "a second start")
        waited = time.monotonic() - stopped_at
        assert 5 <= waited < 20, f"restarted {waited:.1f} s after it stopped answering"
        until(lambda: not processes.is_alive(parent), 10, "the hung server killed")
        until(lambda: not processes.is_alive(child), 10, "its child reaped")
        running_again(server)
        assert metric(server.supervisor_port, "llm_release_server_restarts_total") == 1
        log = server.log_path.read_text()
        assert "answered no /health for" in log and "hung, killed; exit code -9" in log
    finally:
        server.stop(grace_s=5)
    assert not processes.is_alive(server.pid())


def test_up_brings_the_recorded_releases_back_behind_the_router_with_their_weights(
    home, monkeypatch
):
    """'down' then 'up' (as after a reboot): stable and canary serve again through the real
    HAProxy, the canary at its recorded weight; stand-in servers instead of vLLM."""
    from llm_release.canary import promote
    from llm_release.results import DeployTarget
    from llm_release.serving import serve

    record = home / "fake.pids"
    monkeypatch.setenv("LLM_RELEASE_VLLM_PYTHON", sys.executable)
    monkeypatch.setattr(
        serve,
        "build_command",
        lambda python, model_dir, port, *a, **k: [
            sys.executable,
            str(FAKE),
            str(port),
            str(record),
        ],
    )
    model = home / "models" / "m"  # a restart serves only the project's own model folders
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")

    def target(name: str) -> DeployTarget:
        serving = ServingConfig(dtype="float32", max_num_seqs=4, startup_timeout_s=30)
        return DeployTarget(
            name, "unquantized", model, "a/b", hashlib.sha1(name.encode()).hexdigest(), serving
        )

    def served() -> int:
        router = promote.router_for(registry.load())
        body = {"model": "fake", "prompt": "hi", "max_tokens": 1}
        return requests.post(
            f"{router.url}/v1/completions", json=body, headers=router.auth_headers, timeout=10
        ).status_code

    first = promote.deploy(
        target("s"), target("c"), public_name="fake", canary_weight=30, router_port=free_port()
    )
    assert first.stable.supervisor_port and first.canary.supervisor_port
    assert served() == 200

    promote.down()
    assert not marked(home)
    assert not promote.release_alive(registry.load().stable)

    state, started = promote.up()
    assert len(started) == 2 and state.canary_weight == 30
    assert state.stable.release_id == first.stable.release_id
    assert state.canary.release_id == first.canary.release_id
    assert promote.release_alive(state.stable) and promote.release_alive(state.canary)
    until(lambda: served() == 200, 20, "served through the router after up")
    weights = {r["role"]: r["weight"] for r in promote.status()["releases"]}
    assert weights == {"stable": 70, "canary": 30}
    assert registry.load().history[-1]["event"] == "up"
    # Everything serves: a second 'up' starts nothing.
    assert promote.up()[1] == []

    # Its supervisor killed (its vLLM left running, unsupervised): the status says so, not
    # its stale figures, and the units' 'up --unattended' starts it again, the other
    # release left alone; after 'down' the units start nothing.
    from llm_release.serving.supervise import GONE

    supervisor, server_group = state.stable.pid, read_state(state.stable.log_path).server_pid
    os.kill(supervisor, signal.SIGKILL)
    until(lambda: not processes.is_alive(supervisor), 10, "the supervisor dead")
    rows = {r["role"]: r for r in promote.status()["releases"]}
    assert rows["stable"]["server"]["state"] == GONE, rows["stable"]
    assert f"pid {supervisor} gone" in rows["stable"]["server"]["reason"]
    assert rows["canary"]["server"]["state"] == "running"
    canary_pid = state.canary.pid
    again, started = promote.up(unattended=True)
    assert [s.split(" ")[0] for s in started] == [first.stable.release_id]
    assert again.stable.pid != supervisor and again.canary.pid == canary_pid
    assert not processes.is_alive(server_group), "the orphaned server was stopped"
    until(lambda: served() == 200, 20, "served through the router after the unattended up")
    assert promote.up(unattended=True)[1] == []
    promote.down()
    assert promote.up(unattended=True)[1] == []
    assert not promote.release_alive(registry.load().stable)
