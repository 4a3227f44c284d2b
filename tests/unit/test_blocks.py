import os

import pytest
from pydantic import ValidationError

from blocks.hub import HubCredentials


def test_hub_token_never_appears_in_repr_or_dump_or_the_environment(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    block = HubCredentials(endpoint="http://127.0.0.1:8765", token="hf_secret_value_123")
    assert "hf_secret_value_123" not in repr(block)
    assert "hf_secret_value_123" not in str(block.model_dump())
    assert not hasattr(block, "apply"), "credentials must not be applied process-wide"
    assert "HF_TOKEN" not in os.environ and "HF_ENDPOINT" not in os.environ


def test_block_endpoint_with_credentials_is_refused():
    with pytest.raises(ValidationError, match="must not carry credentials"):
        HubCredentials(endpoint="https://user:pw@mirror.example")
