"""Credentials: endpoints carry none, child processes inherit none, a token goes only where
it belongs, and hub endpoints stay off link-local addresses and the project's own ports."""

import pytest
from pydantic import SecretStr, ValidationError

from llm_release.config import SourceConfig
from llm_release.errors import ConfigError
from llm_release.hub.credentials import (
    ALLOW_ENDPOINTS_ENV,
    HF_DEFAULT_ENDPOINT,
    PROMETHEUS_URL_FIELD,
    TOKEN_ENDPOINTS_ENV,
    HubToken,
    check_endpoint,
    check_hub_endpoint,
    check_prometheus_url,
    child_env,
    hf_endpoint,
    saved_token,
    token_for,
)


@pytest.mark.parametrize(
    "url",
    ["https://user:hunter2@hub.example", "https://hunter2@hub.example", "http://:hunter2@h:1"],
)
def test_endpoint_with_credentials_is_refused_without_repeating_them(url):
    with pytest.raises(ValueError, match="credentials") as info:
        check_endpoint(url)
    assert "hunter2" not in str(info.value)
    with pytest.raises(ValidationError) as info:
        SourceConfig(repo_id="a/b", endpoint=url)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("url", ["ftp://h", "file:///etc", "h:80", "https://h/?t=1", "http://h:x"])
def test_endpoint_must_be_a_plain_http_url(url):
    with pytest.raises(ValueError):
        check_endpoint(url)


def test_hf_endpoint_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert hf_endpoint(None) == "http://127.0.0.1:9"
    assert hf_endpoint("https://mirror.example") == "https://mirror.example"


def test_child_env_has_no_secrets(monkeypatch):
    secrets = [
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "MODELSCOPE_API_TOKEN",
        "PREFECT_API_KEY",
        "PREFECT_API_AUTH_STRING",  # the project's Prefect API credentials (flows/server.py)
        "PREFECT_SERVER_API_AUTH_STRING",
        "AWS_SECRET_ACCESS_KEY",
        "GITHUB_TOKEN",
        "DB_PASSWORD",
    ]
    for name in secrets:
        monkeypatch.setenv(name, "s3cr3t")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    env = child_env(HF_HUB_OFFLINE="1")
    assert not set(secrets) & set(env) and "s3cr3t" not in env.values()
    assert env["TOKENIZERS_PARALLELISM"] == "false" and env["HF_HUB_OFFLINE"] == "1"
    assert env["PATH"]


# ---------------------------------------------------------------- which token goes where


@pytest.fixture()
def env_token(monkeypatch):
    """HF_TOKEN set, no operator setting."""
    monkeypatch.setenv("HF_TOKEN", "hf_env_secret")
    monkeypatch.delenv(TOKEN_ENDPOINTS_ENV, raising=False)
    monkeypatch.delenv(ALLOW_ENDPOINTS_ENV, raising=False)
    return "hf_env_secret"


@pytest.mark.parametrize(
    "endpoint", ["https://huggingface.co", "https://huggingface.co/", "https://HuggingFace.co:443"]
)
def test_the_environment_token_goes_to_the_public_hub(env_token, endpoint):
    assert token_for(endpoint) == env_token


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://127.0.0.1:8765",
        "http://huggingface.co",  # not https: another endpoint
        "https://huggingface.co.evil.example",
        "https://huggingface.co:8443",
        "https://mirror.example",
    ],
)
def test_the_environment_token_goes_nowhere_else(env_token, endpoint):
    assert token_for(endpoint) is False  # False, not None: None lets the client fall back


def test_the_operator_names_more_endpoints_for_the_environment_token(env_token, monkeypatch):
    monkeypatch.setenv(TOKEN_ENDPOINTS_ENV, "https://mirror.example/, http://127.0.0.1:8765")
    assert token_for("https://mirror.example") == env_token
    assert token_for("http://127.0.0.1:8765/") == env_token
    assert token_for("http://127.0.0.1:8766") is False


def test_a_malformed_token_endpoints_setting_is_one_line(env_token, monkeypatch):
    monkeypatch.setenv(TOKEN_ENDPOINTS_ENV, "https://u:hunter2@mirror.example")
    with pytest.raises(ConfigError, match=TOKEN_ENDPOINTS_ENV) as info:
        token_for("https://mirror.example")
    assert "hunter2" not in str(info.value)


def test_a_saved_token_goes_to_its_own_endpoint_only(env_token):
    saved = HubToken(endpoint="http://127.0.0.1:8765", token="hf_block_secret")
    assert token_for("http://127.0.0.1:8765/", saved) == "hf_block_secret"
    for other in ("http://127.0.0.1:9999", HF_DEFAULT_ENDPOINT):
        with pytest.raises(ConfigError, match="saved for http://127.0.0.1:8765") as info:
            token_for(other, saved)
        assert "hf_block_secret" not in str(info.value)
    assert "hf_block_secret" not in repr(saved)


def test_a_run_naming_another_endpoint_with_a_block_is_refused():
    token = SecretStr("hf_block_secret")
    with pytest.raises(ConfigError, match="saved for") as info:
        saved_token("http://attacker.example", "http://mirror.example", token, block="mirror")
    assert "hf_block_secret" not in info.value.one_line()
    assert "\n" not in info.value.one_line()
    # a block without an endpoint is for the public hub
    with pytest.raises(ConfigError, match="saved for"):
        saved_token("http://mirror.example", None, token, block="hf")
    endpoint, bound = saved_token(None, "http://mirror.example/", token, block="mirror")
    assert endpoint == "http://mirror.example" and bound.endpoint == endpoint
    assert saved_token("http://mirror.example", "http://mirror.example", None, block="m") == (
        "http://mirror.example",
        None,
    )
    assert saved_token(None, None, token, block="hf")[0] == HF_DEFAULT_ENDPOINT


# ---------------------------------------------------------------- the endpoint policy


@pytest.fixture()
def policy(monkeypatch):
    for name in (
        ALLOW_ENDPOINTS_ENV,
        "PREFECT_API_URL",
        "PREFECT_SERVER_API_PORT",
        "LLM_RELEASE_HAPROXY_METRICS_PORT",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LLM_RELEASE_ROUTER_PORT", "8080")
    monkeypatch.setenv("LLM_RELEASE_PROMETHEUS_PORT", "9090")


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254",
        "http://169.254.169.254/latest/meta-data",
        "http://2852039166",  # 169.254.169.254 as one number
        "http://0xa9fea9fe",
        "http://169.254.43518",
        "http://[fe80::1]:8765",
        "http://[::ffff:169.254.169.254]",
        "http://[fd00:ec2::254]",  # AWS's IPv6 metadata service: unique-local, not fe80::/10
        "http://[fd20:ce::254]",  # GCP's IPv6 metadata service
        "http://192.0.0.192",  # Oracle Cloud's
        "http://[fd00:c1::a9fe:a9fe]",  # Oracle Cloud's IPv6
        "http://[64:ff9b::a9fe:a9fe]",  # 169.254.169.254 through NAT64
        "http://[64:ff9b::169.254.169.254]",
        "http://[::a9fe:a9fe]",  # the IPv4-compatible spelling
        "http://[2002:a9fe:a9fe::1]",  # 6to4 of 169.254.169.254
        "http://[fd00:ec2::254%251]",  # AWS's, with an IPv6 zone (%25 is '%' in a URL)
        "http://[fd00:ec2::254%25eth0]/latest",
        "http://100.100.100.200",  # Alibaba Cloud's
        "http://168.63.129.16",  # Azure's WireServer
    ],
)
def test_link_local_endpoints_are_refused(policy, url):
    with pytest.raises(ConfigError, match="link-local"):
        check_hub_endpoint(url, resolve=False)
    with pytest.raises(ConfigError, match="link-local"):
        check_hub_endpoint(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080",  # the router
        "http://localhost:9090",  # Prometheus
        "http://127.0.0.1:4200",  # the Prefect API's default port
        "http://0.0.0.0:8080",
        "http://[::1]:9090",
    ],
)
def test_the_projects_own_service_ports_are_refused(policy, url):
    with pytest.raises(ConfigError, match="own services"):
        check_hub_endpoint(url)


def test_service_ports_follow_the_settings(policy, monkeypatch):
    monkeypatch.setenv("LLM_RELEASE_ROUTER_PORT", "18080")
    monkeypatch.setenv("PREFECT_API_URL", "http://prefect.internal:4300/api")
    assert check_hub_endpoint("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
    with pytest.raises(ConfigError, match="own services"):
        check_hub_endpoint("http://127.0.0.1:18080")
    with pytest.raises(ConfigError, match="own services"):
        check_hub_endpoint("http://prefect.internal:4300", resolve=False)
    # the port of another host is someone else's
    assert check_hub_endpoint("http://10.1.2.3:18080", resolve=False)


def test_loopback_hubs_and_public_hubs_stay_allowed(policy):
    assert check_hub_endpoint("http://127.0.0.1:8765") == "http://127.0.0.1:8765"
    assert check_hub_endpoint("http://localhost:8765/") == "http://localhost:8765"
    assert check_hub_endpoint(HF_DEFAULT_ENDPOINT, resolve=False) == HF_DEFAULT_ENDPOINT
    assert check_hub_endpoint("http://10.0.0.5:8080", resolve=False)


def test_the_operator_allows_an_endpoint(policy, monkeypatch):
    monkeypatch.setenv(ALLOW_ENDPOINTS_ENV, "http://169.254.10.10:80,http://127.0.0.1:8080")
    assert check_hub_endpoint("http://169.254.10.10")
    assert check_hub_endpoint("http://127.0.0.1:8080/")
    with pytest.raises(ConfigError):
        check_hub_endpoint("http://169.254.10.11")


def test_a_refused_endpoint_is_one_line_with_a_fix(policy):
    with pytest.raises(ConfigError) as info:
        check_hub_endpoint("http://169.254.169.254")
    line = info.value.one_line()
    assert "\n" not in line and ALLOW_ENDPOINTS_ENV in line


# ---------------------------------------------------------------- a run's Prometheus URL


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        "http://2852039166:9090",
        "http://[fd00:ec2::254]",
        "http://[::ffff:169.254.169.254]:9090",
    ],
)
def test_a_prometheus_url_on_a_metadata_address_is_refused(policy, url):
    with pytest.raises(ConfigError, match="link-local or cloud metadata") as info:
        check_prometheus_url(url, resolve=False)
    line = info.value.one_line()
    assert "\n" not in line and PROMETHEUS_URL_FIELD in line and "leave it unset" in line


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8765",  # the demo hub
        "http://localhost:4200",  # the Prefect API
        "http://127.0.0.1:9093",  # Alertmanager
        "http://[::1]:8080",  # the router
        "http://127.0.0.1:18404",  # HAProxy's metrics, from its setting
        "http://127.0.0.1:40001",  # a vLLM server the caller knows of
    ],
)
def test_a_prometheus_url_on_another_of_the_projects_services_is_refused(policy, monkeypatch, url):
    monkeypatch.setenv("LLM_RELEASE_HAPROXY_METRICS_PORT", "18404")
    monkeypatch.setenv("LLM_RELEASE_ALERTMANAGER_PORT", "9093")
    with pytest.raises(ConfigError, match="own services.*not a Prometheus"):
        check_prometheus_url(url, own_ports={40001})


def test_a_prometheus_url_may_name_a_prometheus(policy):
    # The project's own Prometheus and a team's, on this host or another.
    assert check_prometheus_url("http://127.0.0.1:9090/") == "http://127.0.0.1:9090"
    assert check_prometheus_url("http://10.0.0.5:8080", resolve=False) == "http://10.0.0.5:8080"
    assert check_prometheus_url("https://prom.example:443", resolve=False)


def test_a_prometheus_url_with_credentials_is_refused_without_repeating_them(policy):
    with pytest.raises(ConfigError) as info:
        check_prometheus_url("http://admin:hunter2@10.0.0.5:9090", resolve=False)
    assert "hunter2" not in str(info.value) and PROMETHEUS_URL_FIELD in str(info.value)
