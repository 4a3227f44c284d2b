"""Credentials: endpoints carry none, child processes inherit none."""

import pytest
from pydantic import ValidationError

from llm_release.config import SourceConfig
from llm_release.credentials import check_endpoint, child_env, hf_endpoint


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
