"""tasks/plan.plan_capacity on a host of a fleet: a release another host fits may be measured
there, so a fleet without its hub is refused at the plan stage, before the download."""

from __future__ import annotations

import pytest
from prefect.logging import disable_run_logger

import tasks.plan as plan_task
from llm_release.config import ReleaseConfig, SourceConfig
from llm_release.errors import ConfigError

CONFIG = ReleaseConfig(source=SourceConfig(repo_id="org/m"))
PLAN = type("Plan", (), {"verdict": "fits", "recommendation": None, "notes": []})()


@pytest.fixture
def planned(monkeypatch):
    """The plan stage with the hub's headers, this host and the plan itself stood in."""
    for name in ("ENDPOINT", "ORG", "CREDENTIALS"):
        monkeypatch.delenv(f"LLM_RELEASE_FLEET_HUB_{name}", raising=False)
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_a")
    monkeypatch.setenv("LLM_RELEASE_DATABASE_URL", "postgresql+psycopg://r:s@db/llm_release")
    files = type("Files", (), {"bytes_read": 0})()
    monkeypatch.setattr(plan_task, "read_release_model", lambda config, token: files)
    monkeypatch.setattr(plan_task, "detect", lambda: "this host")
    monkeypatch.setattr(plan_task, "release_fleet", lambda: ["card a", "card b"])
    monkeypatch.setattr(plan_task, "plan_release", lambda *a: PLAN)

    def run():
        with disable_run_logger():
            return plan_task.plan_capacity.fn(CONFIG)

    return run


def test_a_fleet_whose_other_host_fits_needs_its_hub_set(planned, monkeypatch):
    monkeypatch.setattr(plan_task, "fleet_fits", lambda *a: ["gpu_b"])
    with pytest.raises(ConfigError, match="LLM_RELEASE_FLEET_HUB_ENDPOINT and .*ORG are unset"):
        planned()
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ENDPOINT", "http://127.0.0.1:8765")
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ORG", "fleet")
    assert planned() is PLAN


def test_a_fleet_no_other_host_of_which_fits_needs_no_hub(planned, monkeypatch):
    monkeypatch.setattr(plan_task, "fleet_fits", lambda *a: [])
    assert planned() is PLAN


def test_a_fleet_without_a_shared_record_measures_here_and_needs_no_hub(planned, monkeypatch):
    monkeypatch.delenv("LLM_RELEASE_DATABASE_URL")
    monkeypatch.setattr(plan_task, "fleet_fits", lambda *a: ["gpu_b"])
    assert planned() is PLAN
