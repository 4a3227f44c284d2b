"""The Prometheus config the project writes passes promtool, and the scrape targets follow
the release registry with the labels the analysis selects on."""

import json
import subprocess

import yaml

from llm_release.canary.prometheus import Prometheus, render_config, render_targets
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
    prometheus.config_path.write_text(render_config(tmp_path, 5))
    check = subprocess.run(
        ["promtool", "check", "config", str(prometheus.config_path)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    config = yaml.safe_load(prometheus.config_path.read_text())
    assert config["global"]["scrape_interval"] == "5000ms"
    assert [job["job_name"] for job in config["scrape_configs"]] == ["vllm", "haproxy"]
    assert (
        json.loads((prometheus.targets_dir / "vllm.json").read_text())[1]["labels"]["role"]
        == "canary"
    )


def test_an_auto_port_is_picked_at_start_and_again_when_taken(tmp_path, monkeypatch):
    # LLM_RELEASE_PROMETHEUS_PORT=auto: the port is picked when Prometheus starts (real
    # prometheus); a port taken between the pick and the bind is picked again
    import socket

    from llm_release.canary import prometheus as prom

    monkeypatch.setenv(prom.PORT_ENV, "auto")
    assert prom.default_port() == 0
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    picks = iter([taken])
    real = prom.free_port
    monkeypatch.setattr(prom, "free_port", lambda: next(picks, None) or real())
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
