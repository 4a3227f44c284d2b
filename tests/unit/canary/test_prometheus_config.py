"""The Prometheus config the project writes passes promtool, and the scrape targets follow
the release registry with the labels the analysis selects on."""

import json
import subprocess
import time

import pytest
import yaml

from llm_release.canary.prometheus import (
    Prometheus,
    render_config,
    render_supervisor_targets,
    render_targets,
    scraped_values,
)
from llm_release.config import ServingConfig
from llm_release.registry import RegistryState, Release
from tests.helpers import require_tool


def release(name: str, port: int) -> Release:
    return Release(
        release_id=f"{name}-0123abcd-20261130000000",
        candidate=name,
        scheme="FP8_DYNAMIC",
        repo_id="a/b",
        commit="0" * 40,
        model_dir="/m",
        public_name="svc",
        port=port,
        pid=1,
        log_path="/dev/null",
        serving=ServingConfig(),
    )


def test_supervisors_are_scraped_where_a_release_records_one():
    supervised = release("fp8", 8002).model_copy(update={"supervisor_port": 9555})
    state = RegistryState(stable=release("baseline", 8001), canary=supervised)
    assert render_supervisor_targets(state) == [
        {
            "targets": ["127.0.0.1:9555"],
            "labels": {"service": "svc", "release": supervised.release_id, "role": "canary"},
        }
    ]


def test_targets_follow_the_registry():
    state = RegistryState(stable=release("baseline", 8001), canary=release("fp8", 8002))
    vllm, haproxy = render_targets(state, haproxy_metrics_port=9101)
    assert vllm == [
        {
            "targets": ["127.0.0.1:8001"],
            "labels": {
                "service": "svc",
                "release": "baseline-0123abcd-20261130000000",
                "role": "stable",
            },
        },
        {
            "targets": ["127.0.0.1:8002"],
            "labels": {
                "service": "svc",
                "release": "fp8-0123abcd-20261130000000",
                "role": "canary",
            },
        },
    ]
    assert haproxy == [{"targets": ["127.0.0.1:9101"], "labels": {"service": "svc"}}]
    # After a rollback only the stable is scraped; with no release, nothing is.
    assert [
        t["labels"]["role"] for t in render_targets(RegistryState(stable=state.stable), None)[0]
    ] == ["stable"]
    assert render_targets(RegistryState(), 9101) == ([], [])


def test_the_config_passes_promtool(tmp_path):
    require_tool("promtool")  # a missing promtool fails; 'make setup' installs it
    prometheus = Prometheus(tmp_path, port=1, scrape_interval_s=5)
    prometheus.targets_dir.mkdir()
    state = RegistryState(stable=release("baseline", 8001), canary=release("fp8", 8002))
    prometheus.write_targets(state, 9101)
    prometheus.write_alertmanagers(["127.0.0.1:9093"])
    key = tmp_path / "server.key"
    key.write_text("k" * 43 + "\n")
    prometheus.config_path.write_text(
        render_config(tmp_path, 5, tmp_path / "alertmanager", server_key_file=key)
    )
    check = subprocess.run(
        ["promtool", "check", "config", str(prometheus.config_path)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(prometheus.config_path.read_text())
    assert config["global"]["scrape_interval"] == "5000ms"
    assert [job["job_name"] for job in config["scrape_configs"]] == [
        "vllm",
        "haproxy",
        "supervisor",
    ]
    # The vLLM servers and HAProxy's exporter ask for the servers' key: a file, read at
    # each scrape, never the key itself.
    auth = {job["job_name"]: job.get("authorization") for job in config["scrape_configs"]}
    bearer = {"type": "Bearer", "credentials_file": str(key)}
    assert auth == {"vllm": bearer, "haproxy": bearer, "supervisor": bearer}
    assert "k" * 43 not in prometheus.config_path.read_text()
    # Firing alerts go to the Alertmanager named in a file_sd file (followed without reload),
    # with its user and password file (read at each send; never the password itself).
    [alerting] = config["alerting"]["alertmanagers"]
    assert alerting["file_sd_configs"] == [
        {"files": [str(prometheus.targets_dir / "alertmanager.json")]}
    ]
    assert alerting["basic_auth"] == {
        "username": "llm-release",
        "password_file": str(tmp_path / "alertmanager" / "password"),
    }
    assert json.loads((prometheus.targets_dir / "alertmanager.json").read_text()) == [
        {"targets": ["127.0.0.1:9093"]}
    ]
    assert (
        json.loads((prometheus.targets_dir / "vllm.json").read_text())[1]["labels"]["role"]
        == "canary"
    )


def test_an_auto_port_is_picked_at_start_and_again_when_taken(tmp_path, monkeypatch):
    # LLM_RELEASE_PROMETHEUS_PORT=auto: the port is picked when Prometheus starts (real
    # prometheus); a port taken between the pick and the bind is picked again
    import socket

    from llm_release.canary import daemon
    from llm_release.canary import prometheus as prom

    monkeypatch.setenv(prom.PORT_ENV, "auto")
    assert prom.default_port() == 0
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    picks = iter([taken])
    real = daemon.free_port  # the port picker of every server of the Prometheus family
    monkeypatch.setattr(daemon, "free_port", lambda: next(picks, None) or real())
    server = prom.Prometheus(tmp_path / "prometheus")
    try:
        server.start()
        assert server.port not in (0, taken)
        assert prom.Prometheus(tmp_path / "prometheus").port == server.port  # recorded
    finally:
        server.stop()
        held.close()
    monkeypatch.setenv(prom.PORT_ENV, "9191")
    assert prom.default_port() == 9191


def test_scraped_values_reads_every_series_of_a_name_and_refuses_a_broken_page():
    page = (
        "# HELP vllm:num_requests_running Running requests.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="a"} 2.0\n'
        'vllm:num_requests_running{model_name="b"} 3 1700000000000\n'
        'vllm:num_requests_waiting{model_name="a"} 1\n'
        "prometheus_config_last_reload_successful 1\n"
    )
    assert scraped_values(page, {"vllm:num_requests_running"}) == [2.0, 3.0]
    assert scraped_values(page, {"vllm:num_requests_waiting", "nothing"}) == [1.0]
    assert scraped_values(page, {"absent"}) == []
    with pytest.raises(ValueError):
        scraped_values(page + 'vllm:num_requests_waiting{model_name="b"} many\n', {"x"})


def test_reload_reads_prometheus_own_metrics_and_says_when_it_refused(tmp_path, monkeypatch):
    # Real prometheus: reload() waits for the reload timestamp on its /metrics page to move,
    # and reads its 'last reload successful' gauge going to 0 as a refusal.
    from llm_release.canary import prometheus as prom
    from llm_release.errors import MetricsError

    monkeypatch.setenv(prom.PORT_ENV, "auto")
    server = prom.Prometheus(tmp_path / "prometheus")
    try:
        server.start()
        ok, before = server._reload_state()
        assert ok == 1 and before > 1.7e9
        server.reload()
        assert server._reload_state()[1] > before
        server.config_path.write_text("global: [not, a, mapping]\n")
        with pytest.raises(MetricsError, match="refused its new config"):
            server.reload()
    finally:
        server.stop()


def test_its_api_asks_every_caller_for_the_projects_credentials(tmp_path, monkeypatch):
    # Real prometheus: without the user and password (or with a wrong one) its query API,
    # its targets, its own /metrics and even /-/ready answer 401; the project's client gets
    # in. One started open by an older version is restarted locked by ensure_running.
    import subprocess

    import requests

    from llm_release.canary import prometheus as prom
    from llm_release.canary.basic_auth import USERNAME
    from llm_release.serving.serve import free_port

    monkeypatch.setenv(prom.PORT_ENV, "auto")
    server = prom.Prometheus(tmp_path / "prometheus")
    try:
        server.start()
        assert server.locked()
        assert oct(server.credentials.password_path.stat().st_mode & 0o777) == "0o600"
        for auth in (None, (USERNAME, "not-the-password")):
            for path in ("/api/v1/query?query=up", "/api/v1/targets", "/metrics", "/-/ready"):
                assert requests.get(f"{server.url}{path}", auth=auth, timeout=5).status_code == 401
        assert server.query("vector(1)")[0].value == 1.0
        assert requests.get(f"{server.url}/-/ready", auth=server.http_auth(), timeout=5).ok
    finally:
        server.stop()
    # An instance an older version started open (no web config) on the same directory.
    open_port = free_port()
    old = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={server.config_path}",
            f"--storage.tsdb.path={server.data_dir}",
            f"--web.listen-address=127.0.0.1:{open_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server.pid_path.write_text(f"{old.pid}\n")
    server.port_path.write_text(f"{open_port}\n")
    again = None
    try:
        # Ready before it is looked at: while it is still binding, its socket may not map to
        # its pid yet (psutil reads /proc's sockets and the processes' files apart), and the
        # port would read as another process's.
        deadline = time.monotonic() + 60
        while not _answers(f"http://127.0.0.1:{open_port}/-/ready"):
            assert old.poll() is None, f"the open Prometheus exited with {old.returncode}"
            assert time.monotonic() < deadline, "the open Prometheus never answered"
            time.sleep(0.2)
        again = prom.Prometheus(tmp_path / "prometheus")
        assert again.running() and not again.locked()
        again.ensure_running()
        assert again.locked() and old.wait(timeout=30) is not None
        assert requests.get(f"{again.url}/-/ready", timeout=5).status_code == 401
    finally:
        if again is not None:
            again.stop()
        if old.poll() is None:
            old.kill()


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=2).ok
    except requests.RequestException:
        return False


def test_a_run_naming_the_projects_own_prometheus_queries_it_with_its_credentials(
    home, monkeypatch
):
    # Real prometheus at the home's own directory: a run's analysis.prometheus_url naming
    # its loopback port gets the project's credentials; any other Prometheus gets none.
    from llm_release.canary import prometheus as prom
    from llm_release.canary.analysis import client_for
    from llm_release.config import AnalysisConfig
    from llm_release.serving.serve import free_port

    monkeypatch.setenv(prom.PORT_ENV, "auto")
    server = prom.for_home()
    try:
        server.start()
        own = client_for(AnalysisConfig(prometheus_url=server.url))
        assert own.auth == server.http_auth()
        assert own.query("vector(2)")[0].value == 2.0
        other = client_for(AnalysisConfig(prometheus_url=f"http://127.0.0.1:{free_port()}"))
        assert other.auth is None
    finally:
        server.stop()
    # Stopped: a process on its port now would not be the project's; no credentials.
    assert client_for(AnalysisConfig(prometheus_url=server.url)).auth is None
