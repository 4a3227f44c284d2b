"""Hub credentials as a Prefect Block, so a token lives in Prefect, not in flow parameters."""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr, field_validator

from llm_release.hub.credentials import check_endpoint


class HubCredentials(Block):
    """Endpoint and token for a Hugging Face compatible hub (huggingface.co or a mirror).

    The token is bound to this endpoint: it is sent there only, and a run that names
    another endpoint with this block is refused (``credentials.saved_token``/``token_for``).
    """

    _block_type_name = "LLM Release Hub Credentials"

    endpoint: str | None = Field(
        default=None,
        description="Hub URL, e.g. an internal mirror; empty for huggingface.co. The token "
        "is sent to this endpoint only",
    )
    token: SecretStr | None = Field(
        default=None, description="token for gated/private repos, sent only to the endpoint"
    )

    @field_validator("endpoint")
    @classmethod
    def _plain_endpoint(cls, value: str | None) -> str | None:
        return check_endpoint(value) if value else None

    # No apply(): setting HF_ENDPOINT / HF_TOKEN process-wide pairs the token with whatever
    # endpoint huggingface_hub read at import. The flow binds the token to this endpoint
    # (credentials.HubToken) and passes both to the plan and acquire stages.
