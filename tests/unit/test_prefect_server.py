"""The Prefect server's database setting (flows/server.py): a PostgreSQL URL in any driver
spelling reaches Prefect with asyncpg; unset, Prefect keeps its SQLite file."""

from __future__ import annotations

import importlib.util

import pytest

from flows import server
from llm_release.errors import ConfigError
from llm_release.settings import settings

VARIABLE = "LLM_RELEASE_PREFECT_DATABASE_URL"


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u:pw@db.internal/prefect", "postgresql+asyncpg://u:pw@db.internal/prefect"),
        ("postgres://u@db:5433/prefect", "postgresql+asyncpg://u@db:5433/prefect"),
        (
            "postgresql+psycopg://postgres@/p?host=/tmp/pg&port=5432",
            "postgresql+asyncpg://postgres@/p?host=%2Ftmp%2Fpg&port=5432",
        ),
        ("postgresql+asyncpg://u@h/p", "postgresql+asyncpg://u@h/p"),
        ("postgresql://u@h/p?sslmode=require", "postgresql+asyncpg://u@h/p?ssl=require"),
    ],
)
def test_the_url_reaches_prefect_with_asyncpg(given, expected):
    assert server.prefect_database_url(given) == expected


def test_unset_leaves_prefect_on_sqlite(monkeypatch):
    monkeypatch.delenv(VARIABLE, raising=False)
    monkeypatch.delenv(server.PREFECT_DATABASE_VARIABLE, raising=False)
    env, database = server.server_environment()
    assert server.PREFECT_DATABASE_VARIABLE not in env
    assert database.startswith("SQLite")


def test_set_gives_the_server_postgresql_and_hides_the_password(monkeypatch):
    monkeypatch.setenv(VARIABLE, "postgresql://prefect:s3cret@db.internal/prefect")
    env, database = server.server_environment()
    assert env[server.PREFECT_DATABASE_VARIABLE] == (
        "postgresql+asyncpg://prefect:s3cret@db.internal/prefect"
    )
    assert "s3cret" not in database and database.startswith("PostgreSQL")


def test_a_missing_asyncpg_is_a_config_error(monkeypatch):
    monkeypatch.setenv(VARIABLE, "postgresql://u@h/p")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "asyncpg" else real(name, *a)
    )
    with pytest.raises(ConfigError, match="asyncpg driver is missing"):
        server.server_environment()


@pytest.mark.parametrize("url", ["sqlite:///prefect.db", "mysql://u@h/p", "db.internal/prefect"])
def test_a_url_that_is_not_postgresql_is_refused(monkeypatch, url):
    monkeypatch.setenv(VARIABLE, url)
    with pytest.raises(ConfigError) as caught:
        settings()
    assert VARIABLE in caught.value.one_line() and url not in caught.value.one_line()


def test_the_record_s_database_is_refused(monkeypatch):
    """Prefect and the record both keep Alembic's alembic_version table: one database each."""
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", "postgresql+psycopg://rec:a@db:5432/shared")
    monkeypatch.setenv(VARIABLE, "postgresql://prefect:b@db:5432/shared")
    with pytest.raises(ConfigError, match="release record's database"):
        server.server_environment()
    monkeypatch.setenv(VARIABLE, "postgresql://prefect:b@db:5432/prefect")
    env, _ = server.server_environment()
    assert env[server.PREFECT_DATABASE_VARIABLE].endswith("@db:5432/prefect")


def test_a_server_already_running_open_is_reported_with_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path))
    monkeypatch.setattr(server, "healthy", lambda api: True)
    monkeypatch.setattr(server, "open_to_anyone", lambda api: True)
    line = server.start(4200, tmp_path / "log", tmp_path / "pid")
    assert "OPEN to every local user" in line and "make prefect-up worker-up" in line
    # the credentials are made all the same, for the clients of the server that follows
    assert (tmp_path / "prefect-api.auth").stat().st_mode & 0o777 == 0o600
    monkeypatch.setattr(server, "open_to_anyone", lambda api: False)
    assert "OPEN" not in server.start(4200, tmp_path / "log", tmp_path / "pid")
