from blocks.hub import HubCredentials


def test_hub_token_never_appears_in_repr_or_dump(monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    block = HubCredentials(endpoint="http://127.0.0.1:8765", token="hf_secret_value_123")
    assert "hf_secret_value_123" not in repr(block)
    assert "hf_secret_value_123" not in str(block.model_dump())
    block.apply()
    import os

    assert os.environ["HF_TOKEN"] == "hf_secret_value_123"
    assert os.environ["HF_ENDPOINT"] == "http://127.0.0.1:8765"
