"""tasks/fleet.py: the cards a release plans against, read as input."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from pydantic import SecretStr

from llm_release.errors import ConfigError
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


# ---------------------------------------------------------------- free slots and the fleet's hub


class _Client:
    """Prefect's client as free_slots reads it: the pool's workers and the slot limits."""

    def __init__(self, workers, limits):
        self.workers, self.limits = workers, limits

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False

    def read_workers_for_work_pool(self, pool):
        assert pool == "llm-release"
        return [SimpleNamespace(name=n, status=SimpleNamespace(value=s)) for n, s in self.workers]

    def read_global_concurrency_limit_by_name(self, name):
        from prefect.exceptions import ObjectNotFound

        for n, cap, held in self.limits:
            if n == name:
                return SimpleNamespace(name=n, limit=cap, active_slots=held)
        raise ObjectNotFound(http_exc=Exception(f"no limit {name}"))


def test_free_slots_are_each_hosts_limit_less_what_is_held(monkeypatch):
    import prefect.client.orchestration

    client = _Client(
        workers=[("gpu_b", "ONLINE"), ("gpu_c", "OFFLINE"), ("gpu_d", "ONLINE")],
        limits=[
            ("llm-release-host-gpu_a", 2, 1),
            ("llm-release-host-gpu_b", 4, 1),
            ("llm-release-host-gpu_c", 8, 0),
            ("llm-release-host-gpu_e", 8, 9),  # held past its limit (lowered meanwhile)
            ("llm-release-host", 8, 0),  # the one-host limit is no host's of the fleet
        ],
    )
    monkeypatch.setattr(prefect.client.orchestration, "get_client", lambda **_: client)
    free = fleet.free_slots("gpu_a", ["gpu_b", "gpu_c", "gpu_d", "gpu_e"])
    # home counts without a worker (this process measures its own); gpu_c's worker is
    # offline, gpu_d has no limit, gpu_e's is over-held and has no worker
    assert free == {"gpu_a": 1, "gpu_b": 3, "gpu_c": 0, "gpu_d": 0, "gpu_e": 0}


def test_a_credentials_block_that_is_not_saved_is_refused_in_one_line(monkeypatch):
    from blocks.hub import HubCredentials

    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ENDPOINT", "http://127.0.0.1:8765")
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ORG", "fleet")
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_CREDENTIALS", "fleet-hub")

    def load(name):
        raise ValueError(f"Unable to find block document named {name}")

    monkeypatch.setattr(HubCredentials, "load", load)
    with pytest.raises(ConfigError, match="no HubCredentials block 'fleet-hub' is saved"):
        fleet.fleet_hub_access()
    saved = SimpleNamespace(endpoint="http://127.0.0.1:8765", token=SecretStr("hf_write"))
    monkeypatch.setattr(HubCredentials, "load", lambda name: saved)
    hub = fleet.fleet_hub_access()
    assert hub.token is not None and hub.token.token.get_secret_value() == "hf_write"


def run_on_queue(monkeypatch, queue, parent=None):
    """The release as a worker runs it: its flow run came from ``queue`` (a subflow, run
    inside ``parent``'s task, has none of its own)."""
    import prefect.context

    flow_run = SimpleNamespace(work_queue_name=queue, parent_task_run_id=parent)
    monkeypatch.setattr(
        prefect.context.FlowRunContext,
        "get",
        classmethod(lambda cls: SimpleNamespace(flow_run=flow_run)),
    )


def test_a_run_sent_to_another_hosts_queue_is_refused_before_the_plan(monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_b")
    run_on_queue(monkeypatch, "host-gpu_a")
    with pytest.raises(ConfigError) as refused:
        fleet.check_home()
    assert "host 'gpu_a'" in str(refused.value) and "host 'gpu_b' took it" in str(refused.value)
    assert "make fleet-join HOST=gpu_a" in refused.value.hint


def test_a_run_on_its_own_hosts_queue_or_outside_a_deployment_goes_on(monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_a")
    run_on_queue(monkeypatch, "host-gpu_a")
    fleet.check_home()
    monkeypatch.undo()
    monkeypatch.delenv("LLM_RELEASE_HOST_NAME", raising=False)
    fleet.check_home()  # no flow run context at all: run in this process


def test_a_release_inside_a_model_update_is_checked_against_the_updates_queue(monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_HOST_NAME", "gpu_b")
    run_on_queue(monkeypatch, None, parent="a-task-run")
    monkeypatch.setattr(fleet, "root_queue", lambda: "host-gpu_a")
    with pytest.raises(ConfigError, match="sent to host 'gpu_a'"):
        fleet.check_home()
    monkeypatch.setattr(fleet, "root_queue", lambda: "host-gpu_b")
    fleet.check_home()
