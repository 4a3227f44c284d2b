"""Fixtures the integration tests share."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from llm_release.serving.serve import free_port, stop_process_group

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def prefect_api(tmp_path):
    """A Prefect server of the project's own start (SQLite, credentials), and the client
    environment the Makefile gives Prefect's clients."""
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "LLM_RELEASE_"))}
    env = base | {
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "LLM_RELEASE_HOME": str(tmp_path / "home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}",
    }
    pid_file = tmp_path / "prefect.pid"
    started = subprocess.run(
        [sys.executable, "-m", "flows.server", "--port", str(port)]
        + ["--log", str(tmp_path / "server.log"), "--pid-file", str(pid_file)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    auth = (tmp_path / "home" / "prefect-api.auth").read_text().strip()
    client = env | {
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_API_AUTH_STRING": auth,
        "PREFECT_WORKER_HEARTBEAT_SECONDS": "5",
        "PREFECT_WORKER_QUERY_SECONDS": "2",
    }
    try:
        yield client
    finally:
        stop_process_group(int(pid_file.read_text()), grace_s=15)
