"""Start the project's Prefect server (``make prefect-up`` runs it): ``prefect server start``
on 127.0.0.1, detached in a session of its own, its pid and log under the project home,
waited for until its API reports healthy. A server already healthy on the port is left as it is.

Its database: ``LLM_RELEASE_PREFECT_DATABASE_URL`` (a PostgreSQL URL, any driver spelling)
is given to Prefect as ``PREFECT_SERVER_DATABASE_CONNECTION_URL`` with the asyncpg driver
Prefect needs; unset, Prefect keeps its SQLite file under ``PREFECT_HOME``. Prefect creates
and migrates its tables at the first start on an empty database (docs/prefect-ui.md).

Its API asks for credentials: on 127.0.0.1 every local user reaches it, and an open API
lets anyone run a deployment with their own parameters, resume a release paused for a
human's review, or read every run's parameters. The server gets Prefect's
``PREFECT_SERVER_API_AUTH_STRING`` (HTTP Basic on every API path but its health checks, and
the events websocket's handshake), a random string made once in ``<home>/prefect-api.auth``
(0600); the project's Prefect clients (``make prefect-up``'s control step, the worker and its
flow runs, ``make demo``'s runs) send it as ``PREFECT_API_AUTH_STRING``, and the UI asks for it
once. Children the flows start (vLLM, lm-eval, GuideLLM, HAProxy) never get it
(``credentials.SECRET_ENV``)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import requests
from sqlalchemy.engine import make_url

from llm_release import paths
from llm_release.errors import ConfigError, PrefectServerError, ReleaseError
from llm_release.hub.credentials import child_env
from llm_release.secret_files import home_token
from llm_release.serving.serve import stop_process_group
from llm_release.settings import env_name, settings

PREFECT_DATABASE_VARIABLE = "PREFECT_SERVER_DATABASE_CONNECTION_URL"
DRIVER = "postgresql+asyncpg"
AUTH_VARIABLE = "PREFECT_SERVER_API_AUTH_STRING"  # its clients send PREFECT_API_AUTH_STRING


def auth_path() -> Path:
    return paths.home() / "prefect-api.auth"


def auth_string() -> str:
    """The Prefect API's credentials, made (0600) the first time they are asked for."""
    path = auth_path()
    return home_token(
        path,
        "the Prefect API's credentials",
        f"delete {path}, then 'make down' and 'make prefect-up worker-up': new ones are made",
        kind="credential",
    )


def open_to_anyone(api: str) -> bool:
    """The API at ``api`` answers a request that carries no credentials (an API path, not
    the health check, which Prefect leaves open)."""
    try:
        return requests.get(f"{api}/admin/version", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def prefect_database_url(url: str) -> str:
    """``url`` (postgresql://, postgres://, postgresql+psycopg://, …) with the asyncpg driver
    that Prefect's server requires; libpq's ``sslmode`` becomes asyncpg's ``ssl``."""
    parsed = make_url(url)
    query = dict(parsed.query)
    if "sslmode" in query:
        query["ssl"] = query.pop("sslmode")
    return parsed.set(drivername=DRIVER, query=query).render_as_string(hide_password=False)


def server_environment() -> tuple[dict[str, str], str]:
    """The server's environment (this one, less hub secrets) and, in words, its database."""
    operator = settings()
    secret = operator.prefect_database_url
    if secret is None:
        return child_env(), "SQLite (Prefect's file under PREFECT_HOME)"
    if importlib.util.find_spec("asyncpg") is None:
        raise ConfigError(
            f"{env_name('prefect_database_url')} is set but the asyncpg driver is missing",
            hint="make setup installs it (pyproject.toml pins asyncpg), or: "
            ".venv/bin/pip install 'asyncpg==0.32.0'",
        )
    url = prefect_database_url(secret.get_secret_value())
    shown = make_url(url).render_as_string(hide_password=True)
    record = operator.database_url
    if record is not None and record.get_secret_value().startswith("postgres"):
        if same_database(url, prefect_database_url(record.get_secret_value())):
            raise ConfigError(
                f"{env_name('prefect_database_url')} names the release record's database "
                f"({env_name('database_url')}); both keep Alembic's alembic_version table",
                hint="give the Prefect server a database of its own, e.g. CREATE DATABASE "
                "prefect on the same PostgreSQL server",
            )
    return child_env(**{PREFECT_DATABASE_VARIABLE: url}), f"PostgreSQL ({shown})"


def same_database(a: str, b: str) -> bool:
    """Two asyncpg URLs name one database (user, password and options aside)."""

    def where(url: str) -> tuple:
        parsed = make_url(url)
        return (parsed.host, parsed.port, parsed.query.get("host"), parsed.database)

    return where(a) == where(b)


def healthy(api: str) -> bool:
    try:
        return requests.get(f"{api}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def start(port: int, log: Path, pid_file: Path, timeout_s: float = 120) -> str:
    """Start the server unless one answers on ``port``; what happened, in one line."""
    api = f"http://127.0.0.1:{port}/api"
    credentials = auth_string()  # made before any client of this home asks for them
    if healthy(api):
        if open_to_anyone(api):
            return (
                f"Prefect server: already running at http://127.0.0.1:{port}, OPEN to every "
                "local user (started before it asked for credentials, or not by this project): "
                "'make down', then 'make prefect-up worker-up' restarts it locked"
            )
        return f"Prefect server: already running at http://127.0.0.1:{port}"
    env, database = server_environment()
    env[AUTH_VARIABLE] = credentials
    prefect = Path(sys.executable).parent / "prefect"
    log.parent.mkdir(parents=True, exist_ok=True)
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(prefect), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: it outlives make and its terminal
        )
    pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + timeout_s
    while not healthy(api):
        if proc.poll() is not None or time.monotonic() > deadline:
            ended = "exited" if proc.poll() is not None else f"not healthy after {timeout_s:g} s"
            stop_process_group(proc.pid, grace_s=10)
            pid_file.unlink(missing_ok=True)
            raise PrefectServerError(
                f"the Prefect server on {database} {ended}",
                hint=f"read {log}; a PostgreSQL database must exist and accept the URL's user",
            )
        time.sleep(0.5)
    return (
        f"Prefect server: http://127.0.0.1:{port} (UI and API), database {database}; "
        f"its API asks for the credentials in {auth_path()} (the UI asks for them once)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.server", description=__doc__)
    parser.add_argument("--port", type=int, default=4200)
    parser.add_argument("--log", type=Path, required=True, help="the server's log file")
    parser.add_argument("--pid-file", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, default=120)
    args = parser.parse_args(argv)
    try:
        print(start(args.port, args.log, args.pid_file, args.timeout_s))
    except ReleaseError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
