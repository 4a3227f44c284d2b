"""Hub credentials as a Prefect Block, so a token lives in Prefect, not in flow parameters."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr


class HubCredentials(Block):
    """Endpoint and token for a Hugging Face compatible hub (huggingface.co or a mirror)."""

    _block_type_name = "LLM Release Hub Credentials"

    endpoint: str | None = Field(
        default=None, description="Hub URL, e.g. an internal mirror; empty for huggingface.co"
    )
    token: SecretStr | None = Field(default=None, description="HF token for gated/private repos")

    def apply(self) -> None:
        """Expose the settings to huggingface_hub through its environment variables."""
        import os

        if self.endpoint:
            os.environ["HF_ENDPOINT"] = self.endpoint
        if self.token:
            os.environ["HF_TOKEN"] = self.token.get_secret_value()
