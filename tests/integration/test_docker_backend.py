"""The docker backend against the real Docker daemon and the locally built vLLM CPU image.

No vLLM here becomes ready (a start costs 30-60 s on 2 cores): a container that answers
chat completions and /metrics, with its port on 127.0.0.1 and the model read-only, is
checked in tests/e2e/test_docker_release_e2e.py, whose candidates and releases are such
containers.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from llm_release import server_key
from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from llm_release.decision.candidate import measure
from llm_release.serving.backends import image
from llm_release.serving.backends.docker import (
    CONTAINER_PORT,
    HOSTNAME,
    NETWORK,
    HostSettings,
    container_spec,
    ensure_network,
)
from llm_release.serving.backends.docker_client import PROJECT, client, docker_available, label
from llm_release.serving.serve import Owner, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker]


@pytest.fixture(scope="module")
def cpu_image() -> str:
    if not docker_available():
        pytest.fail("the Docker daemon does not answer: 'make setup' installs and starts it")
    return image.build().tag  # idempotent: reused when its inputs are unchanged


def ours(home: Path) -> list:
    """Containers carrying this project's labels for ``home``, running or not."""
    return client().containers.list(
        all=True,
        filters={"label": [f"{label('project')}={PROJECT}", f"{label('home')}={home.resolve()}"]},
    )


SERVING = ServingConfig(
    backend="docker", enforce_eager=True, max_model_len=256, max_num_seqs=2, startup_timeout_s=600
)


def test_a_container_whose_vllm_cannot_start_fails_with_its_log_tail(
    cpu_image, home, tiny_model_dir, tmp_path, monkeypatch
):
    # A flag vLLM does not know gets past the allow-list only as the operator's addition.
    monkeypatch.setenv("LLM_RELEASE_ALLOW_SERVING_FLAGS", "--no-such-vllm-flag")
    result = measure(
        name="broken",
        scheme="FP8_DYNAMIC",
        model_dir=tiny_model_dir,
        tokenizer_dir=tiny_model_dir,
        serving=SERVING.model_copy(update={"extra_args": ["--no-such-vllm-flag"]}),
        evaluation=EvalConfig(),
        load=LoadProfile(),
        out_dir=tmp_path / "broken",
        public_name="tiny",
        run_id="it-broken",
    )
    assert result.status == "failed"
    assert "ServeError" in result.error and "vLLM container for tiny exited" in result.error
    assert "bad vLLM arguments" in result.error
    assert "--no-such-vllm-flag" in result.error, "the container's log tail is not in the error"
    assert ours(home) == [], "a failed candidate's container was left behind"


def test_sweeps_remove_this_homes_leftovers_and_nothing_else(cpu_image, home):
    docker = client()
    base = image.base_tag()
    mine = {label("project"): PROJECT, label("home"): str(home.resolve())}
    me = str(os.getpid())

    def sleeper(name: str, labels: dict[str, str]):
        return docker.containers.run(
            base, ["sleep", "600"], name=f"llmr-test-{name}-{os.getpid()}", labels=labels,
            detach=True, network_mode="none", init=True,
        )  # fmt: skip

    from llm_release.serving.processes import start_time

    started = f"{start_time(os.getpid()):.2f}"
    stranger = sleeper("unlabelled", {})
    other_home = sleeper("other-home", mine | {label("home"): "/tmp/another-home"})
    orphan = sleeper("orphan", mine | {label("role"): "candidate", label("owner-pid"): "999999"})
    live = sleeper(
        "live",
        mine
        | {label("role"): "candidate", label("owner-pid"): me, label("owner-started"): started},
    )
    canary = sleeper("canary", mine | {label("role"): "canary", label("release-id"): "x-1"})
    try:
        from llm_release.serving.backends import sweep_containers

        # Before a release: only what a dead run left (the registry's canary stays).
        removed = sweep_containers(home, everything=False)
        assert removed == [f"container {orphan.name} (candidate)"]
        assert {c.name for c in ours(home)} == {live.name, canary.name}

        down = subprocess.run(
            [sys.executable, "-m", "llm_release.cli", "down"],
            capture_output=True,
            text=True,
            timeout=120,
            env=dict(os.environ, LLM_RELEASE_HOME=str(home)),
        )
        assert down.returncode == 0, down.stderr
        assert live.name in down.stdout and canary.name in down.stdout
        assert ours(home) == []
        for untouched in (stranger, other_home):
            untouched.reload()
            assert untouched.status == "running", f"{untouched.name} was not ours to stop"
    finally:
        for container in (stranger, other_home, orphan, live, canary):
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


def test_a_containers_server_is_reached_from_the_hosts_loopback_only(cpu_image, home, tmp_path):
    """The container our spec makes, with a plain HTTP server in vLLM's place (bound as
    vLLM is, to the container's hostname): the host reaches it on 127.0.0.1 through the
    published port; neither a container on the daemon's default bridge nor one on the
    project's own network reaches it, nor does the container's own loopback."""
    import requests

    docker = client()
    base = image.base_tag()
    ensure_network(docker)
    ensure_network(docker)  # once per daemon: the second call finds it
    assert len(docker.networks.list(names=[NETWORK])) == 1
    port = free_port()
    spec = container_spec(
        image=base,
        model_dir=tmp_path,
        served_names=["m"],
        serving=ServingConfig(backend="docker"),
        port=port,
        owner=Owner(run_id="it-net"),
        gpu_ids=None,
        gpu_host=False,
        home=home,
        host=HostSettings(),
    )
    server_cmd = ["python3", "-m", "http.server", "--bind", HOSTNAME, str(CONTAINER_PORT)]
    spec |= {"entrypoint": server_cmd, "command": []}
    server = docker.containers.run(**spec)
    probes = []

    def reach(url: str, network: str) -> int:
        code = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=3)"
        probe = docker.containers.run(
            base, ["python3", "-c", code, url], network=network, detach=True, init=True
        )
        probes.append(probe)
        return int(probe.wait(timeout=60)["StatusCode"])

    try:
        for _ in range(60):
            try:
                answer = requests.get(f"http://127.0.0.1:{port}/", timeout=2)
                break
            except requests.RequestException:
                time.sleep(0.5)
        else:
            pytest.fail(f"the published port 127.0.0.1:{port} never answered")
        assert answer.status_code == 200
        server.reload()
        address = server.attrs["NetworkSettings"]["Networks"][NETWORK]["IPAddress"]
        assert address, server.attrs["NetworkSettings"]["Networks"]
        url = f"http://{address}:{CONTAINER_PORT}/"
        # The probe works: the same server on the default bridge is reached from it.
        control = docker.containers.run(
            base,
            ["python3", "-m", "http.server", str(CONTAINER_PORT)],
            network="bridge",
            detach=True,
            init=True,
        )
        probes.append(control)
        control.reload()
        open_url = f"http://{control.attrs['NetworkSettings']['IPAddress']}:{CONTAINER_PORT}/"
        assert any(reach(open_url, "bridge") == 0 for _ in range(10)), "the probe never worked"
        assert reach(url, "bridge") != 0, "a container on the default bridge reached it"
        assert reach(url, NETWORK) != 0, "a container on the project's network reached it"
        inside = server.exec_run(
            [
                "python3",
                "-c",
                "import urllib.request; urllib.request.urlopen("
                f"'http://127.0.0.1:{CONTAINER_PORT}/', timeout=3)",
            ]
        )
        assert inside.exit_code != 0, "the server listens on the container's loopback too"
    finally:
        for container in [server, *probes]:
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


def dying_release(
    home: Path, model_dir: Path, release_id: str, role: str, code: str, port: int | None = None
):
    """A serving release's container from our spec (restart limit 2) whose server is
    ``code``, a Python program that dies (published on ``port`` of the host's loopback)."""
    docker = client()
    ensure_network(docker)
    spec = container_spec(
        image=image.base_tag(),
        model_dir=model_dir,
        served_names=["m", release_id],
        serving=ServingConfig(backend="docker"),
        port=port or free_port(),
        owner=Owner(role=role, release_id=release_id),
        gpu_ids=None,
        gpu_host=False,
        home=home,
        host=HostSettings(),
        restart_limit=2,
    )
    spec |= {"entrypoint": ["python3", "-c", code], "command": []}
    return docker.containers.run(**spec)


def test_dockers_restart_policy_restarts_a_serving_release_then_it_is_crash_looping(
    cpu_image, home, tmp_path
):
    """A canary container from our spec whose server dies at once: the daemon restarts it
    (on-failure, at most the limit), then it is crash-looping for the canary's walk."""
    from llm_release.registry import Release
    from llm_release.serving.backends import crash_looping, server_summary

    container = dying_release(home, tmp_path, "loop-1", "canary", "import sys; sys.exit(3)")
    release = Release(
        release_id="loop-1",
        candidate="c",
        scheme="unquantized",
        repo_id="a/b",
        commit="0" * 40,
        model_dir=str(tmp_path),
        public_name="m",
        port=20001,
        container=container.id,
        log_path=str(tmp_path / "canary.log"),
        serving=ServingConfig(backend="docker"),
    )
    try:
        deadline = time.monotonic() + 60
        while crash_looping(release) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        reason = crash_looping(release)
        assert reason == "the container exited with code 3 after 2 restarts (limit 2)", reason
        assert server_summary(release) == {"state": "exited", "restarts": 2}
    finally:
        container.remove(force=True)


def test_a_serving_containers_restarts_reach_prometheus_through_its_metrics_process(
    cpu_image, home, tmp_path
):
    """The Docker backend's restarts, counted: the container's metrics process serves
    Docker's RestartCount as the supervisor's llm_release_server_restarts_total (the series
    the restart alerts read), then its crash loop, and leaves when the container goes."""
    from llm_release.canary.prometheus import scraped_values
    from llm_release.serving.supervise import supervisor_env

    # Up for 3 s, then it dies: each restart is seen while it runs and counted.
    code = "import time, sys; time.sleep(3); sys.exit(3)"
    container = dying_release(home, tmp_path, "loop-2", "stable", code)
    port = free_port()
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "llm_release.serving.container_metrics",
            container.id,
            "m",
            "loop-2",
            "stable",
            str(port),
            "http://127.0.0.1:9/health",
            "60",
            str(server_key.key_path()),
        ],
        env=supervisor_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    seen: list[float] = []
    try:
        deadline = time.monotonic() + 90
        looping = [0.0]
        while time.monotonic() < deadline and looping != [1.0]:
            try:
                reply = requests.get(url, headers=server_key.headers(), timeout=2)
                page = reply.text
            except requests.ConnectionError:
                time.sleep(0.2)
                continue
            seen += scraped_values(page, ["llm_release_server_restarts_total"])
            looping = scraped_values(page, ["llm_release_server_crash_looping"])
            time.sleep(0.5)
        assert looping == [1.0], (seen, exporter.poll())
        assert requests.get(url, timeout=2).status_code == 401  # without the servers' key
        assert 'release="loop-2"' in page and 'role="stable"' in page and 'service="m"' in page
        assert scraped_values(page, ["llm_release_server_restarts_total"]) == [2.0]
        assert scraped_values(page, ["llm_release_server_up"]) == [0.0]  # no server answers
        assert seen == sorted(seen) and seen[0] < 2.0, seen  # counted as they happened
    finally:
        container.remove(force=True)
    assert exporter.wait(15) == 0
    assert "is gone: exiting" in exporter.stdout.read()


# A server that answers /health twice (the metrics process asks every 2 s, however long it
# took to start), then stops answering and stays alive: hung.
HANGING = """
import http.server, threading, time
answered = threading.Semaphore(0)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
        answered.release()
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
answered.acquire()
answered.acquire()
server.shutdown()
server.server_close()
time.sleep(3600)
"""


def test_a_hung_serving_container_is_killed_and_restarted_by_its_policy(cpu_image, home, tmp_path):
    """Docker restarts a container that exits, not one whose server is alive and silent:
    the metrics process kills a server that answered /health once and then none for
    HANG_AFTER_S, and the container's restart policy starts it again (counted)."""
    from llm_release.serving.supervise import supervisor_env

    port = free_port()
    container = dying_release(home, tmp_path, "hang-1", "stable", HANGING, port=port)
    exporter = subprocess.Popen(
        [
            sys.executable, "-m", "llm_release.serving.container_metrics", container.id,
            "m", "hang-1", "stable", str(free_port()), f"http://127.0.0.1:{port}/health", "3",
        ],
        env=supervisor_env(home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            container.reload()
            if container.attrs["RestartCount"] >= 1:
                break
            time.sleep(0.5)
        assert container.attrs["RestartCount"] >= 1, container.status
        # It was killed (137 from tini), not stopped by hand: the policy restarted it.
        assert container.attrs["State"]["Status"] in ("running", "restarting")
    finally:
        container.remove(force=True)
    assert exporter.wait(15) == 0
    out = exporter.stdout.read()
    assert "answered no /health for 3 s: hung; killing it" in out, out


# A server that answers /health for as long as it runs.
HEALTHY = """
import http.server
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), Health).serve_forever()
"""


def test_a_running_containers_lost_watch_is_started_again(cpu_image, home, tmp_path):
    """The container's watch (hang watch, restart metrics) is a host process nothing else
    restarts: killed while the container runs, 'up' starts it again on the recorded port
    (issue 36, item 11), and leaves one that runs alone."""
    import psutil

    from llm_release import paths
    from llm_release.registry import Release
    from llm_release.serving.backends import ensure_watched
    from llm_release.serving.backends.docker import _metrics_processes

    port, watch_port = free_port(), free_port()
    container = dying_release(home, tmp_path, "watch-1", "stable", HEALTHY, port=port)
    paths.servers_dir().mkdir(parents=True, exist_ok=True)
    release = Release(
        release_id="watch-1",
        candidate="c",
        scheme="unquantized",
        repo_id="a/b",
        commit="0" * 40,
        model_dir=str(tmp_path),
        public_name="m",
        port=port,
        supervisor_port=watch_port,
        container=container.id,
        log_path=str(paths.servers_dir() / "stable-watch-1.log"),
        serving=ServingConfig(backend="docker"),
    )
    url = f"http://127.0.0.1:{watch_port}/metrics"

    def served() -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                return requests.get(url, headers=server_key.headers(), timeout=2).text
            except requests.ConnectionError:
                time.sleep(0.3)
        raise AssertionError(f"nothing served {url}")

    try:
        assert ensure_watched(release, "stable") == (
            f"the watch of watch-1's container (port {watch_port})"
        )
        assert 'release="watch-1"' in served() and 'role="stable"' in served()
        (first,) = _metrics_processes(container.id)
        assert ensure_watched(release, "stable") is None  # one runs: no second
        psutil.Process(first).kill()
        psutil.Process(first).wait(10)
        assert ensure_watched(release, "stable") is not None
        assert 'release="watch-1"' in served()
        (second,) = _metrics_processes(container.id)
        assert second != first
    finally:
        container.remove(force=True)
    deadline = time.monotonic() + 30
    while _metrics_processes(container.id) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _metrics_processes(container.id)  # it leaves with its container


def test_down_removes_the_projects_network_once_no_container_uses_it(cpu_image, home, monkeypatch):
    """The network is the daemon's, shared by every home there: 'down' removes it only when
    nothing is attached. (A network of this test's own name: the other pytest worker's
    containers use the real one.)"""
    from llm_release.serving.backends import docker as backend
    from llm_release.serving.backends import sweep_containers

    name = f"llm-release-isolated-test-{os.getpid()}"
    monkeypatch.setattr(backend, "NETWORK", name)
    docker = client()
    ensure_network(docker)
    attached = docker.containers.run(
        image.base_tag(), ["sleep", "600"], name=f"llmr-test-net-{os.getpid()}", network=name,
        labels={label("project"): PROJECT, label("home"): "/tmp/another-home"},
        detach=True, init=True,
    )  # fmt: skip
    try:
        assert f"network {name}" not in sweep_containers(home, everything=True)
        assert [n.name for n in docker.networks.list(names=[name])] == [name]
    finally:
        attached.remove(force=True)
    # Before a release (everything=False) the network stays; 'down' removes it.
    assert sweep_containers(home, everything=False) == []
    assert docker.networks.list(names=[name])
    assert sweep_containers(home, everything=True) == [f"network {name}"]
    assert [n for n in docker.networks.list(names=[name]) if n.name == name] == []
    # A server started after another home's 'down' removed it finds it again.
    ensure_network(docker)
    docker.networks.get(name).remove()
    server = backend.DockerServer.__new__(backend.DockerServer)
    spec = {
        "image": image.base_tag(), "command": ["sleep", "600"], "detach": True, "init": True,
        "name": f"llmr-test-net2-{os.getpid()}", "network": name,
        "labels": {label("project"): PROJECT, label("home"): str(home.resolve())},
    }  # fmt: skip
    container = server._run(docker, spec)
    try:
        container.reload()
        assert name in container.attrs["NetworkSettings"]["Networks"]
    finally:
        container.remove(force=True)
        sweep_containers(home, everything=True)
