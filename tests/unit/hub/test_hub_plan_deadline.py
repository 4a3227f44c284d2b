"""The plan's hub reads are bounded by one budget, a minute by default (issue 36, medium 9):
a trickling hub cannot hold 'plan' or a release's plan stage for longer."""

import json
import time

import pytest

from llm_release.errors import AcquireError
from llm_release.hub import hub_headers
from llm_release.settings import DEFAULT_PLAN_DEADLINE_S, Settings, settings
from tests.hostile_hub import HostileHub

DEADLINE_ENV = "LLM_RELEASE_PLAN_DEADLINE_S"


def test_the_default_budget_is_a_minute_at_most(monkeypatch):
    monkeypatch.delenv(DEADLINE_ENV, raising=False)
    assert DEFAULT_PLAN_DEADLINE_S <= 60
    assert Settings.model_fields["plan_deadline_s"].default == DEFAULT_PLAN_DEADLINE_S
    assert settings().plan_deadline_s == hub_headers.plan_deadline_s() == DEFAULT_PLAN_DEADLINE_S


def test_read_hub_without_a_deadline_takes_the_settings_budget(monkeypatch):
    """A config trickled a byte every 0.2 s (~40 s in all) ends at the operator's 1 s."""
    monkeypatch.setenv(DEADLINE_ENV, "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with HostileHub() as hub:
        hub.plan.ranges = True
        hub.plan.add(
            "config.json",
            json.dumps({"model_type": "llama"} | {"x": "y" * 150}).encode(),
            trickle_s=0.2,
        )
        start = time.monotonic()
        with pytest.raises(AcquireError) as info:
            hub_headers.read_hub("slow/model", endpoint=hub.url)
        took = time.monotonic() - start
    assert took < 4, took
    line = info.value.one_line()
    assert "within the 1 s budget" in line and DEADLINE_ENV in line
    assert f"default {DEFAULT_PLAN_DEADLINE_S:g} s" in line
