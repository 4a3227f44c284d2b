"""hub/handover.fleet_hub: the fleet's hub from the operator's settings, its saved write token
bound to its endpoint; refused in one line, before any request, when it is not set right."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from llm_release.errors import ConfigError
from llm_release.hub.handover import fleet_hub

HUB = "http://127.0.0.1:8765"
RUN = "20261206T120000Z-5e4d3c2b"


@pytest.fixture
def fleet_env(monkeypatch):
    for name in ("ENDPOINT", "ORG", "CREDENTIALS"):
        monkeypatch.delenv(f"LLM_RELEASE_FLEET_HUB_{name}", raising=False)
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ENDPOINT", HUB)
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ORG", "fleet")
    return monkeypatch


def test_unset_it_is_refused_naming_what_is_missing(monkeypatch):
    for name in ("ENDPOINT", "ORG", "CREDENTIALS"):
        monkeypatch.delenv(f"LLM_RELEASE_FLEET_HUB_{name}", raising=False)
    with pytest.raises(ConfigError) as refused:
        fleet_hub()
    line = refused.value.one_line()
    assert "\n" not in line
    assert "LLM_RELEASE_FLEET_HUB_ENDPOINT and LLM_RELEASE_FLEET_HUB_ORG are unset" in line
    assert "how to fix: set LLM_RELEASE_FLEET_HUB_ENDPOINT" in line
    monkeypatch.setenv("LLM_RELEASE_FLEET_HUB_ENDPOINT", HUB)
    with pytest.raises(ConfigError, match="LLM_RELEASE_FLEET_HUB_ORG is unset"):
        fleet_hub()


def test_set_without_credentials_it_names_the_hand_over_repos(fleet_env):
    hub = fleet_hub()
    assert (hub.endpoint, hub.org, hub.token) == (HUB, "fleet", None)
    target = hub.target("Qwen/Qwen3-0.6B", "w4a16", RUN)
    assert target.repo_id == f"fleet/qwen3-0.6b-w4a16-{RUN.lower()}"
    assert target.endpoint == HUB and target.token is None


def test_a_saved_token_is_bound_to_the_fleet_hubs_endpoint(fleet_env):
    fleet_env.setenv("LLM_RELEASE_FLEET_HUB_CREDENTIALS", "fleet-hub")
    hub = fleet_hub(HUB + "/", SecretStr("hf_write"))
    assert hub.token is not None and hub.token.endpoint == HUB
    assert hub.token.token.get_secret_value() == "hf_write"
    assert hub.target("org/m", "fp8", RUN).token == hub.token
    assert "hf_write" not in repr(hub)


def test_a_block_saved_for_another_hub_or_without_a_token_is_refused(fleet_env):
    fleet_env.setenv("LLM_RELEASE_FLEET_HUB_CREDENTIALS", "fleet-hub")
    with pytest.raises(ConfigError, match="saved for http://127.0.0.1:9999, not for the fleet"):
        fleet_hub("http://127.0.0.1:9999", SecretStr("hf_write"))
    # a block saved without an endpoint is for huggingface.co: never the fleet's hub here
    with pytest.raises(ConfigError, match="saved for https://huggingface.co"):
        fleet_hub(None, SecretStr("hf_write"))
    with pytest.raises(ConfigError, match="holds no token"):
        fleet_hub(HUB, None)


@pytest.mark.parametrize(
    "endpoint, says",
    [
        ("ftp://127.0.0.1/hub", "LLM_RELEASE_FLEET_HUB_ENDPOINT: endpoint must be an http"),
        ("http://user:pw@127.0.0.1:8765", "LLM_RELEASE_FLEET_HUB_ENDPOINT: endpoint must not"),
        ("http://169.254.169.254", "link-local"),  # the endpoint policy, as every hub's
    ],
)
def test_an_endpoint_the_policy_refuses_is_refused(fleet_env, endpoint, says):
    fleet_env.setenv("LLM_RELEASE_FLEET_HUB_ENDPOINT", endpoint)
    with pytest.raises(ConfigError, match=says) as refused:
        fleet_hub()
    assert "pw" not in refused.value.one_line()
