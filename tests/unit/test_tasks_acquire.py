"""tasks/acquire.receive_candidate on the measuring host, the download stood in: a baseline
fetched from the release's source reads with the token of the credentials block the order
names, loaded here and bound to the block's own endpoint as the release host binds it; an
order that names another endpoint with it, a block not saved, or an endpoint the policy
refuses is one line before any request. A hand-over through the fleet's hub loads no block."""

from __future__ import annotations

import pytest
from prefect.logging import disable_run_logger
from pydantic import SecretStr

import tasks.acquire as acquire_tasks
from blocks.hub import HubCredentials
from llm_release.errors import ConfigError
from llm_release.hub.handover import Handover, Upstream

UPSTREAM = "http://127.0.0.1:8765"
FILES = {"model.safetensors": "0" * 64}


def order(endpoint: str = UPSTREAM, block: str | None = "hub-read") -> Handover:
    return Handover(
        repo_id="org/m",
        commit="c" * 40,
        endpoint=endpoint,
        files=FILES,
        upstream=Upstream(hub="huggingface", credentials_block=block),
    )


@pytest.fixture
def host_b(monkeypatch, tmp_path):
    """The measuring host: its saved blocks (``saved``) and its downloads (``received``)."""
    saved: dict[str, HubCredentials] = {}
    received: list[tuple[Handover, object]] = []

    def load(name):
        if name not in saved:
            raise ValueError(f"Unable to find block document named {name}")
        return saved[name]

    def receive(handover, *, token=None):
        received.append((handover, token))
        return tmp_path / "model"

    monkeypatch.setattr(HubCredentials, "load", load)
    monkeypatch.setattr(acquire_tasks, "receive", receive)
    return saved, received


def run(handover: Handover):
    with disable_run_logger():
        return acquire_tasks.receive_candidate.fn(handover)


def test_the_named_blocks_token_goes_to_its_own_endpoint(host_b):
    saved, received = host_b
    saved["hub-read"] = HubCredentials(endpoint=UPSTREAM, token=SecretStr("hf_read_b"))
    run(order())
    ((_, token),) = received
    assert token.endpoint == UPSTREAM and token.token.get_secret_value() == "hf_read_b"


def test_an_order_naming_another_endpoint_with_the_block_is_refused(host_b):
    saved, received = host_b
    saved["hub-read"] = HubCredentials(endpoint=UPSTREAM, token=SecretStr("hf_read_b"))
    with pytest.raises(ConfigError) as refused:
        run(order("http://127.0.0.1:9999"))
    line = refused.value.one_line()
    assert "\n" not in line and "not the endpoint the credentials block 'hub-read'" in line
    assert "hf_read_b" not in line and received == []


def test_a_block_not_saved_here_is_one_line(host_b):
    _, received = host_b
    with pytest.raises(ConfigError) as refused:
        run(order())
    line = refused.value.one_line()
    assert "\n" not in line and "no HubCredentials block 'hub-read' is saved" in line
    assert received == []


def test_the_endpoint_policy_applies_on_the_measuring_host(host_b):
    _, received = host_b
    with pytest.raises(ConfigError, match="link-local"):
        run(order("http://169.254.169.254", block=None))
    assert received == []


def test_a_hand_over_through_the_fleets_hub_loads_no_block(host_b):
    _, received = host_b
    handover = Handover(repo_id="fleet/m-x", commit="b" * 40, endpoint=UPSTREAM, files=FILES)
    run(handover)
    assert received == [(handover, None)]
