"""A real vLLM server started by the project answers only the project's key (issue 36
medium 5): /health for the health checks, nothing else without the key, /invocations
(SageMaker's route, open under vLLM's own --api-key) and /metrics included."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest
import requests

from llm_release import server_key
from llm_release.config import ServingConfig
from llm_release.serving.serve import VllmServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMPLETION = {"prompt": "Hello", "max_tokens": 1, "temperature": 0}


@pytest.fixture()
def open_umask():
    """The most open umask a caller can have: what the servers make must still be theirs."""
    previous = os.umask(0o000)
    yield
    os.umask(previous)


def test_a_real_vllm_answers_the_projects_key_alone(home, tiny_model_dir, tmp_path, open_umask):
    serving = ServingConfig(enforce_eager=True, max_model_len=256, max_num_seqs=2)
    key = server_key.key()
    key_file = server_key.key_path()
    assert key_file.parent == home and key_file.stat().st_mode & 0o777 == 0o600
    with VllmServer(tiny_model_dir, ["tiny"], serving, tmp_path / "vllm.log") as server:
        url = server.base_url
        assert requests.get(f"{url}/health", timeout=10).status_code == 200
        body = COMPLETION | {"model": "tiny"}
        refused = {
            "completions": requests.post(f"{url}/v1/completions", json=body, timeout=30),
            "invocations": requests.post(f"{url}/invocations", json=body, timeout=30),
            "models": requests.get(f"{url}/v1/models", timeout=10),
            "metrics": requests.get(f"{url}/metrics", timeout=10),
            "tokenize": requests.post(f"{url}/tokenize", json={"prompt": "hi"}, timeout=10),
            "wrong key": requests.get(
                f"{url}/v1/models", headers={"Authorization": f"Bearer {key[::-1]}"}, timeout=10
            ),
        }
        assert {name: r.status_code for name, r in refused.items()} == dict.fromkeys(refused, 401)
        headers = server_key.headers()
        answer = requests.post(f"{url}/v1/completions", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200 and answer.json()["choices"]
        invoked = requests.post(f"{url}/invocations", json=body, headers=headers, timeout=60)
        assert invoked.status_code == 200, invoked.text[:300]
        metrics = requests.get(f"{url}/metrics", headers=headers, timeout=10)
        assert metrics.status_code == 200 and "vllm:" in metrics.text
        # The key is in the server's environment (its owner's to read), never in argv.
        tree = [psutil.Process(server.process.pid)]
        tree += tree[0].children(recursive=True)
        assert all(key not in " ".join(p.cmdline()) for p in tree)
        environ = Path(f"/proc/{server.process.pid}/environ")
        assert environ.stat().st_mode & 0o077 == 0
        assert f"{server_key.KEY_ENV}={key}".encode() in environ.read_bytes().split(b"\0")
        # vLLM's own sockets (the API server and its engine core talk over ZMQ sockets in
        # /tmp): a unix socket takes the process's umask, and connecting needs write
        # permission on it, so they are its owner's alone whatever the caller's umask.
        inodes = {
            conn.laddr
            for proc in tree
            for conn in proc.net_connections(kind="unix")
            if conn.laddr and conn.status == psutil.CONN_NONE
        }
        sockets = [Path(path) for path in inodes if path.startswith("/")]
        assert sockets, "vLLM listened on no unix socket: the check saw nothing"
        modes = {str(p): oct(p.stat().st_mode & 0o777) for p in sockets if p.exists()}
        assert modes and all(mode == "0o700" for mode in modes.values()), modes
