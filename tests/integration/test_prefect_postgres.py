"""The Prefect server on PostgreSQL (issue 25, part 5): ``python -m flows.server``, the
command ``make prefect-up`` runs, given ``LLM_RELEASE_PREFECT_DATABASE_URL`` starts a real
``prefect server start`` on a database of the real PostgreSQL server of tests/pg.py; a flow
run against its API is read back from the API and found in PostgreSQL's ``flow_run`` table."""

from __future__ import annotations

import base64
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import requests
import sqlalchemy as sa

from llm_release.serving.serve import free_port, stop_process_group

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]


def test_prefect_server_runs_on_postgresql(postgres_url, tmp_path, monkeypatch):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    # The record's own URL spelling (psycopg, a unix socket): the start path gives it to
    # Prefect with the asyncpg driver.
    monkeypatch.setenv("LLM_RELEASE_PREFECT_DATABASE_URL", postgres_url)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PREFECT_API_AUTH_STRING", raising=False)
    monkeypatch.delenv("PREFECT_SERVER_API_AUTH_STRING", raising=False)
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    monkeypatch.setenv("PREFECT_UI_ENABLED", "false")
    monkeypatch.delenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", raising=False)
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    log, pid_file = tmp_path / "prefect-server.log", tmp_path / "pids" / "prefect.pid"
    started = subprocess.run(
        [sys.executable, "-m", "flows.server", "--port", str(port)]
        + ["--log", str(log), "--pid-file", str(pid_file), "--timeout-s", "90"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        assert started.returncode == 0, (
            started.stdout + started.stderr + (log.read_text()[-3000:] if log.exists() else "")
        )
        assert "database PostgreSQL" in started.stdout, started.stdout
        assert "postgresql+asyncpg://" in started.stdout, started.stdout
        assert requests.get(f"{api}/health", timeout=5).json() is True
        # Its API asks for the home's credentials (0600): a local user without them gets
        # 401 on every path but the health checks, with them the API answers.
        auth_file = tmp_path / "home" / "prefect-api.auth"
        assert stat.S_IMODE(auth_file.stat().st_mode) == 0o600
        auth = auth_file.read_text().strip()
        basic = {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()}
        wrong = {"Authorization": "Basic " + base64.b64encode(b"llm-release:guess").decode()}
        for path in ("/admin/version", "/deployments/filter", "/flow_runs/filter"):
            call = requests.get if path == "/admin/version" else requests.post
            assert call(f"{api}{path}", timeout=5).status_code == 401, path
            assert call(f"{api}{path}", headers=wrong, timeout=5).status_code == 401, path
            assert call(f"{api}{path}", headers=basic, timeout=5).status_code == 200, path
        assert "credentials" in started.stdout, started.stdout
        # A second start finds it healthy and leaves it as it is.
        again = subprocess.run(
            [sys.executable, "-m", "flows.server", "--port", str(port)]
            + ["--log", str(tmp_path / "second.log"), "--pid-file", str(tmp_path / "x.pid")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 0 and "already running" in again.stdout, again.stdout
        assert "OPEN" not in again.stdout, again.stdout

        @flow(name="pg-probe", persist_result=False)
        def probe(n: int) -> int:
            return n * 2

        with temporary_settings({PREFECT_API_URL: api, PREFECT_API_AUTH_STRING: auth}):
            state = probe(21, return_state=True)
            assert state.is_completed() and state.result() == 42
            run_id = state.state_details.flow_run_id
            with get_client(sync_client=True) as client:
                run = client.read_flow_run(run_id)
            # The run's logs and events reach the server before it stops.
            APILogWorker.drain_all(timeout=10)
            EventsWorker.drain_all(timeout=10)
        assert run.state is not None and run.state.is_completed()
        assert run.parameters == {"n": 21}

        # The server wrote it to PostgreSQL, not to an SQLite file under PREFECT_HOME.
        engine = sa.create_engine(postgres_url)
        try:
            with engine.connect() as conn:
                row = conn.execute(
                    sa.text(
                        "SELECT flow_run.state_type, flow.name FROM flow_run "
                        "JOIN flow ON flow.id = flow_run.flow_id WHERE flow_run.id = :id"
                    ),
                    {"id": run_id},
                ).one()
        finally:
            engine.dispose()
        assert (str(row.state_type), row.name) == ("COMPLETED", "pg-probe")
        assert not list((tmp_path / "prefect-home").glob("*.db"))
    finally:
        if pid_file.exists():
            stop_process_group(int(pid_file.read_text()), grace_s=15)
