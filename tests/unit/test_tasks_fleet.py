"""tasks/fleet.py: the cards a release plans against, read as input."""

from __future__ import annotations

import httpx
import pytest

from tasks import fleet


def test_a_host_outside_a_fleet_asks_prefect_nothing(monkeypatch):
    monkeypatch.delenv("LLM_RELEASE_HOST_NAME", raising=False)

    def no_call():
        raise AssertionError("the Prefect API was asked")

    monkeypatch.setattr(fleet, "host_queues", no_call)
    assert fleet.release_fleet() == []


def test_an_api_that_does_not_answer_leaves_the_plan_to_this_host(monkeypatch, caplog):
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_a")

    def down():
        raise httpx.ConnectError("connection refused")

    monkeypatch.setattr(fleet, "host_queues", down)
    assert fleet.release_fleet() == []
    assert "planned for this host" in caplog.text


@pytest.mark.parametrize(
    "raw",
    [
        None,
        "all",
        {"name": "gpu_b", "gpus": "all", "source": "x", "declared_at": "2026-12-06"},
        {  # another host's name: it would stand for that host
            "name": "gpu_a",
            "gpus": [{"index": 0, "memory_gib": 8}],
            "source": "stated",
            "declared_at": "2026-12-06T00:00:00Z",
        },
        {
            "name": "gpu_b",
            "gpus": [{"index": 0, "memory_gib": 1e9}],
            "source": "x",
            "declared_at": "2026-12-06T00:00:00Z",
        },
    ],
)
def test_a_card_that_does_not_validate_is_left_out(monkeypatch, raw):
    import prefect.variables

    good = {
        "name": "gpu_a",
        "gpus": [{"index": 0, "memory_gib": 80}],
        "source": "stated",
        "declared_at": "2026-12-06T00:00:00Z",
    }
    cards = {"llm_release_host_gpu_a": good, "llm_release_host_gpu_b": raw}
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_a")
    monkeypatch.setattr(fleet, "host_queues", lambda: ["gpu_a", "gpu_b"])
    monkeypatch.setattr(prefect.variables.Variable, "get", lambda name, default=None: cards[name])
    assert [card.name for card in fleet.release_fleet()] == ["gpu_a"]
