"""The docker backend against the real Docker daemon and the locally built vLLM CPU image.

One container serves the tiny model for the module (a vLLM start is ~35 s here); the
failing candidate and the sweep use no vLLM server that becomes ready.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import requests

from llm_release import image
from llm_release.backends.docker import PROJECT, client, docker_available, label
from llm_release.candidate import measure
from llm_release.config import EvalConfig, LoadProfile, ServingConfig
from llm_release.serve import Owner, make_server

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


@pytest.fixture(scope="module")
def served(cpu_image, tiny_model_dir):
    home = Path(tempfile.mkdtemp(prefix="llmr-dk-", dir="/tmp"))
    previous = os.environ.get("LLM_RELEASE_HOME")
    os.environ["LLM_RELEASE_HOME"] = str(home)
    server = make_server(
        tiny_model_dir,
        ["tiny", "public"],
        SERVING,
        home / "vllm.log",
        owner=Owner(role="candidate", run_id="it", candidate="tiny"),
    )
    try:
        with server:
            yield server, home
    finally:
        if previous is None:
            os.environ.pop("LLM_RELEASE_HOME", None)
        else:
            os.environ["LLM_RELEASE_HOME"] = previous
    assert ours(home) == [], "the candidate's container outlived its server"


def test_a_candidate_in_a_container_answers_chat_and_metrics(served, tiny_model_dir, cpu_image):
    server, home = served
    chat = requests.post(
        f"{server.base_url}/v1/chat/completions",
        json={
            "model": "public",
            "messages": [{"role": "user", "content": "What is the torque?"}],
            "max_tokens": 4,
        },
        timeout=60,
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"]
    metrics = requests.get(f"{server.base_url}/metrics", timeout=10).text
    assert "vllm:num_requests_running" in metrics and "vllm:time_to_first_token_seconds" in metrics

    container = server.container
    container.reload()
    assert container.image.tags == [cpu_image]
    assert container.labels[label("role")] == "candidate"
    assert container.labels[label("home")] == str(home.resolve())
    ports = container.attrs["HostConfig"]["PortBindings"]
    assert ports == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(server.port)}]}
    mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
    model = str(Path(tiny_model_dir).resolve())
    assert mounts[model]["RW"] is False, "the model folder must be mounted read-only"
    # The server's log file holds the container's log (the same reading as a process's).
    assert "docker run" in server.log_text() and "Starting vLLM" in server.log_text()


def test_a_container_whose_vllm_cannot_start_fails_with_its_log_tail(
    cpu_image, home, tiny_model_dir, tmp_path
):
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

    from llm_release.processes import start_time

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
        from llm_release.backends import sweep_containers

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
