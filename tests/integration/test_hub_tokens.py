"""A token goes only where it belongs, and hub endpoints stay off internal addresses.

Real HTTP hubs on 127.0.0.1 serve the tiny repo and record every request's Authorization
header; the acquire stage, the release's plan stage and the CLI's download and plan talk to
them through the real hub client.
"""

import json

import pytest

from blocks.hub import HubCredentials
from demo.hub_server import publish_repo
from llm_release.cli import main
from llm_release.config import ReleaseConfig, SourceConfig
from llm_release.errors import ConfigError
from llm_release.hub.acquire import TransferSettings, acquire, verify_dir
from llm_release.hub.credentials import ALLOW_ENDPOINTS_ENV, TOKEN_ENDPOINTS_ENV, HubToken
from llm_release.hub.hub_headers import read_hub
from llm_release.serving.capacity import read_release_model
from tasks.acquire import bind_hub_access
from tests.faulty_hub import FaultyHub
from tests.helpers import TINY_REPO

pytestmark = pytest.mark.integration
FAST = TransferSettings(workers=3, stall_timeout_s=2.0, max_attempts=2, backoff_s=0.05)
ENV_SECRET = "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"
BLOCK_SECRET = "hf_BlockTokenForTheMirrorOnly"


@pytest.fixture()
def published(hub_root, tiny_model_dir):
    publish_repo(hub_root, TINY_REPO, tiny_model_dir)
    return hub_root


@pytest.fixture()
def mirror(published):
    with FaultyHub(published) as hub:
        yield hub


@pytest.fixture()
def attacker(published):
    """Another hub serving the same repo: whatever reaches it is a leak."""
    with FaultyHub(published) as hub:
        yield hub


@pytest.fixture()
def env_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", ENV_SECRET)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv(TOKEN_ENDPOINTS_ENV, raising=False)
    monkeypatch.delenv(ALLOW_ENDPOINTS_ENV, raising=False)
    return ENV_SECRET


def plan_args(hub) -> list[str]:
    return ["plan", TINY_REPO, "--endpoint", hub.url, "--cpu-kvcache-gib", "1"] + [
        "--max-model-len",
        "1024",
        "--json",
    ]


def test_cli_download_and_plan_send_no_environment_token_to_another_endpoint(
    home, env_token, mirror, capsys
):
    assert main(["download", TINY_REPO, "--endpoint", mirror.url, "--quiet"]) == 0
    downloaded = len(mirror.plan.requests)
    assert downloaded > 3, "the hub saw no listing or files"
    assert main(plan_args(mirror)) == 0
    plan = json.loads(capsys.readouterr().out.split("\n", 2)[2])
    assert plan["fits"]
    assert len(mirror.plan.requests) > downloaded, "plan made no request"
    assert mirror.plan.authorizations == set()


def test_the_environment_token_goes_to_an_endpoint_the_operator_configured(
    home, env_token, mirror, attacker, monkeypatch, capsys
):
    monkeypatch.setenv(TOKEN_ENDPOINTS_ENV, f"https://mirror.invalid, {mirror.url}/")
    for hub in (mirror, attacker):
        assert main(["download", TINY_REPO, "--endpoint", hub.url, "--quiet"]) == 0
        assert main(plan_args(hub)) == 0
    capsys.readouterr()
    assert mirror.plan.authorizations == {f"Bearer {ENV_SECRET}"}
    # every request to the configured hub carried it: listing, files, headers
    assert attacker.plan.requests and attacker.plan.authorizations == set()


def test_plan_stage_reads_with_no_environment_token_for_another_endpoint(env_token, mirror):
    config = ReleaseConfig.model_validate(
        {"source": {"repo_id": TINY_REPO, "endpoint": mirror.url}}
    )
    files = read_release_model(config)
    assert files is not None and files.shards
    assert mirror.plan.requests and mirror.plan.authorizations == set()


def test_a_block_token_with_a_foreign_endpoint_is_refused_before_any_request(
    home, env_token, mirror, attacker
):
    block = HubCredentials(endpoint=mirror.url, token=BLOCK_SECRET)
    form = SourceConfig(repo_id=TINY_REPO, endpoint=attacker.url, credentials_block="mirror")
    with pytest.raises(ConfigError, match="not the endpoint the credentials block 'mirror'") as e:
        bind_hub_access(form, block)
    assert BLOCK_SECRET not in e.value.one_line() and "\n" not in e.value.one_line()
    # The core refuses too, whoever calls it with a token bound elsewhere.
    bound = HubToken(endpoint=mirror.url, token=BLOCK_SECRET)
    with pytest.raises(ConfigError, match="would go to"):
        acquire(SourceConfig(repo_id=TINY_REPO, endpoint=attacker.url), token=bound, settings=FAST)
    config = ReleaseConfig.model_validate(
        {"source": {"repo_id": TINY_REPO, "endpoint": attacker.url}}
    )
    with pytest.raises(ConfigError, match="would go to"):
        read_release_model(config, bound)
    assert attacker.plan.requests == [] and mirror.plan.requests == []


def test_a_block_token_goes_to_the_blocks_endpoint_in_plan_and_acquire(
    home, env_token, mirror, attacker
):
    """The form names no endpoint: the block's is used, with the block's token, in both
    stages (the plan stage once dropped it and sent the environment's)."""
    block = HubCredentials(endpoint=mirror.url, token=BLOCK_SECRET)
    form = SourceConfig(repo_id=TINY_REPO, credentials_block="mirror")
    source, token = bind_hub_access(form, block)
    assert source.endpoint == mirror.url and token is not None
    config = ReleaseConfig.model_validate({"source": source.model_dump()})
    assert read_release_model(config, token) is not None
    acquired = acquire(source, token=token, settings=FAST)
    assert verify_dir(acquired.model_dir) == []
    assert mirror.plan.authorizations == {f"Bearer {BLOCK_SECRET}"}
    assert attacker.plan.requests == []


def test_a_block_without_an_endpoint_is_for_the_public_hub_only(env_token, mirror):
    block = HubCredentials(token=BLOCK_SECRET)
    form = SourceConfig(repo_id=TINY_REPO, endpoint=mirror.url, credentials_block="hf")
    with pytest.raises(ConfigError, match=r"saved for \(https://huggingface.co\)"):
        bind_hub_access(form, block)
    assert mirror.plan.requests == []


@pytest.mark.parametrize(
    "endpoint", ["http://169.254.169.254", "http://2852039166", "http://[fe80::1]:8765"]
)
def test_a_link_local_endpoint_is_refused_by_download_plan_and_release(home, endpoint, capsys):
    assert main(["download", TINY_REPO, "--endpoint", endpoint, "--quiet"]) == 2
    assert main(["plan", TINY_REPO, "--endpoint", endpoint]) == 2
    err = capsys.readouterr().err
    assert err.count("link-local") == 2 and ALLOW_ENDPOINTS_ENV in err
    with pytest.raises(ConfigError, match="link-local"):
        read_hub(TINY_REPO, endpoint=endpoint)
    with pytest.raises(ConfigError, match="link-local"):
        bind_hub_access(SourceConfig(repo_id=TINY_REPO, endpoint=endpoint), None)
    ms = SourceConfig(hub="modelscope", repo_id=TINY_REPO, endpoint=endpoint)
    with pytest.raises(ConfigError, match="link-local"):
        acquire(ms, settings=FAST)


def test_a_service_port_is_refused_unless_the_operator_allows_it(home, mirror, monkeypatch):
    port = mirror.url.rsplit(":", 1)[1]
    monkeypatch.setenv("LLM_RELEASE_ROUTER_PORT", port)
    monkeypatch.delenv(ALLOW_ENDPOINTS_ENV, raising=False)
    source = SourceConfig(repo_id=TINY_REPO, endpoint=mirror.url)
    with pytest.raises(ConfigError, match="own services"):
        acquire(source, settings=FAST)
    with pytest.raises(ConfigError, match="own services"):
        read_hub(TINY_REPO, endpoint=mirror.url)
    assert mirror.plan.requests == []
    monkeypatch.setenv(ALLOW_ENDPOINTS_ENV, mirror.url)
    assert verify_dir(acquire(source, settings=FAST).model_dir) == []
