"""The release flow with ``serving.backend: docker``: every candidate and release is a vLLM
container of the locally built CPU image, behind the same HAProxy, through promotion to a
canary, rollback and ``down``. Lean on purpose (one FP8 candidate, one eval set of two
items, one load level): the flow's logic is covered by test_release_e2e.py; this one
proves the backend is invisible to it, and checks a served container directly (chat
completions, /metrics, its port and mounts) rather than starting one more in an
integration test (each vLLM start costs 30-60 s on 2 cores)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from llm_release import registry, server_key
from llm_release.canary.prometheus import scraped_values
from llm_release.serving.backends import image
from llm_release.serving.backends.docker_client import PROJECT, client, docker_available, label
from tests.helpers import TINY_REPO, lb_headers, vllm_processes

pytestmark = [pytest.mark.slow, pytest.mark.docker]


def cli(*args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "llm_release.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def containers(home, **labels) -> dict[str, str]:
    """name → status of the containers labelled with this project and home (and ``labels``)."""
    wanted = {label("project"): PROJECT, label("home"): str(home.resolve())}
    wanted |= {label(k): v for k, v in labels.items()}
    found = client().containers.list(
        all=True, filters={"label": [f"{k}={v}" for k, v in wanted.items()]}
    )
    return {c.name: c.status for c in found}


def test_release_with_the_docker_backend(prefect_api, home, hub, sets_reported_only):
    from flows.release import release
    from llm_release.config import ReleaseConfig
    from llm_release.serving.serve import free_port

    assert docker_available(), "the Docker daemon does not answer: 'make setup' starts it"
    image.build()  # idempotent: reused when its inputs are unchanged
    router_port = free_port()
    out = release(
        ReleaseConfig.model_validate(
            {
                "source": {"repo_id": TINY_REPO, "endpoint": hub.url},
                "candidates": [{"name": "fp8-dynamic", "scheme": "FP8_DYNAMIC"}],
                "serving": {
                    "backend": "docker",
                    "enforce_eager": True,
                    "max_model_len": 512,
                    "max_num_seqs": 4,
                    # The FP8 scheme is served by the same vLLM build as the process
                    # backend's (the image is that virtualenv's freeze): no second probe.
                    "probe_schemes": False,
                },
                "evaluation": {"eval_sets": ["refusal_kb"], "limit": 2},
                "load": {
                    "concurrencies": [1],
                    "requests_per_level": 4,
                    "prompt_tokens": 32,
                    "output_tokens": 8,
                },
                "gates": {"ttft_p95_slo_s": 120},
                "review": {"auto": "approve"},
                # The canary stays at its first step: this test drives promote/rollback
                # itself (the walk is test_canary_e2e's). Without this the release would
                # walk the canary and wait up to an hour for an approval.
                "rollout": {"mode": "hold"},
                "router_port": router_port,
            }
        )
    )
    report = json.loads((home / "runs" / out.run_id / "report.json").read_text())
    results = {r["name"]: r for r in report["results"]}
    for name in ("baseline", "fp8-dynamic"):
        assert results[name]["status"] == "measured", results[name]["error"]
        assert results[name]["load"]["levels"][0]["requests"] == 4
        log = (home / "runs" / out.run_id / "candidates" / name / "vllm.log").read_text()
        assert log.startswith("$ docker run llmr-") and "Starting vLLM server" in log
    assert out.winner == "fp8-dynamic", out.summary

    # Candidates are gone; the stable and the canary are containers, and no vLLM process.
    state = registry.load()
    assert (state.stable.candidate, state.canary.candidate) == ("baseline", "fp8-dynamic")
    assert state.stable.serving.backend == "docker" and state.stable.pid == 0
    assert containers(home, role="candidate") == {}
    running = containers(home)
    assert sorted(running.values()) == ["running", "running"], running
    assert {state.stable.container, state.canary.container} == {
        client().containers.get(n).id for n in running
    }
    assert vllm_processes(under=home) == []

    status = json.loads(cli("canary", "status", "--json"))
    assert [(r["role"], r["weight"], r["process_alive"]) for r in status["releases"]] == [
        ("stable", 95, True),
        ("canary", 5, True),
    ]
    headers = lb_headers(status)
    chat = requests.post(
        f"{status['lb_url']}/v1/chat/completions",
        json={
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
        },
        headers=headers,
        timeout=60,
    )
    assert chat.status_code == 200, (chat.text, dict(chat.headers))
    for _ in range(20):
        models = requests.get(f"{status['lb_url']}/v1/models", headers=headers, timeout=10)
        assert models.status_code == 200

    # The canary's container itself: chat completions and vLLM's Prometheus metrics on a
    # port published on 127.0.0.1 only, the model mounted read-only, the locally built image.
    canary_url = f"http://127.0.0.1:{state.canary.port}"
    chat = {
        "model": state.canary.release_id,
        "messages": [{"role": "user", "content": "What is the torque?"}],
        "max_tokens": 4,
    }
    # Locked like a process's server (llm_release.server_key): the middleware is mounted
    # into the container and its key is in the container's environment.
    for path in ("/v1/chat/completions", "/invocations"):
        assert requests.post(f"{canary_url}{path}", json=chat, timeout=60).status_code == 401
    assert requests.get(f"{canary_url}/metrics", timeout=10).status_code == 401
    assert requests.get(f"{canary_url}/health", timeout=10).status_code == 200
    direct = requests.post(
        f"{canary_url}/v1/chat/completions", json=chat, headers=server_key.headers(), timeout=60
    )
    assert direct.status_code == 200 and direct.json()["choices"][0]["message"]["content"]
    metrics = requests.get(f"{canary_url}/metrics", headers=server_key.headers(), timeout=10).text
    assert "vllm:num_requests_running" in metrics and "vllm:time_to_first_token_seconds" in metrics
    container = client().containers.get(state.canary.container)
    assert container.image.tags == [image.local_image()]
    assert container.labels[label("role")] == "canary"
    assert container.attrs["HostConfig"]["PortBindings"] == {
        "8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(state.canary.port)}]
    }
    mounts = {m["Destination"]: m["RW"] for m in container.attrs["Mounts"]}
    assert mounts[str(Path(state.canary.model_dir).resolve())] is False, (
        "the model must be mounted read-only"
    )

    # Its restarts, crash loop and health for Prometheus and the alert rules, as the
    # process backend's supervisor serves them (serving/container_metrics.py).
    exporter = f"http://127.0.0.1:{state.canary.supervisor_port}/metrics"
    assert requests.get(exporter, timeout=10).status_code == 401
    page = requests.get(exporter, headers=server_key.headers(), timeout=10).text
    assert scraped_values(page, ["llm_release_server_restarts_total"]) == [0.0], page
    assert scraped_values(page, ["llm_release_server_crash_looping"]) == [0.0], page
    assert scraped_values(page, ["llm_release_server_up"]) == [1.0], page
    assert f'release="{state.canary.release_id}"' in page and 'role="canary"' in page

    # Rollback: the canary's container is drained and removed, its log kept in the home,
    # and its metrics process leaves with it.
    cli("canary", "rollback")
    assert containers(home, role="canary") == {}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            requests.get(exporter, timeout=2)
        except requests.ConnectionError:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("the canary's container metrics outlived its container")
    canary_log = state.canary.log_path
    assert "Starting vLLM server" in open(canary_log).read()
    status = json.loads(cli("canary", "status", "--json"))
    assert [r["role"] for r in status["releases"]] == ["stable"]
    models = requests.get(f"{status['lb_url']}/v1/models", headers=lb_headers(status), timeout=10)
    assert models.status_code == 200

    cli("down")
    assert containers(home) == {}
