"""Hub endpoints and tokens: passed explicitly, never written down, never inherited.

The acquire stage hands the endpoint and token to the hub client objects themselves
(``HfApi(endpoint=…, token=…)``, the request headers); nothing sets ``HF_ENDPOINT`` or
``HF_TOKEN`` in this process, because ``huggingface_hub`` reads the endpoint once at import
and the token on every call, so a late change can pair one hub's token with another hub.
An endpoint URL must not carry credentials (``https://user:pass@host``): it is written to
the manifest and to error messages. Child processes that talk to no hub (vLLM, HAProxy,
GuideLLM) start from an environment without secrets.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

HF_DEFAULT_ENDPOINT = "https://huggingface.co"
# Named secrets, and anything whose name says it is one.
SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "MODELSCOPE_API_TOKEN", "PREFECT_API_KEY")
# Whole words of the name only: TOKENIZERS_PARALLELISM is not a secret.
SECRET_NAME = re.compile(
    r"(?i)(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|SECRET_KEY|CREDENTIALS?)($|_)"
)


def check_endpoint(url: str) -> str:
    """``url`` if it is a plain http(s) endpoint; ValueError naming the problem otherwise.

    The message never repeats the credentials it found.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a malformed port
    except ValueError:
        raise ValueError("endpoint is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("endpoint must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "endpoint must not carry credentials (user:password@host); "
            "give the token through HF_TOKEN or a HubCredentials block"
        )
    if parts.query or parts.fragment:
        raise ValueError("endpoint must not have a query or fragment")
    return url.rstrip("/")


def hf_endpoint(explicit: str | None) -> str:
    """The Hugging Face endpoint, read now (not at import time like huggingface_hub does)."""
    return check_endpoint(explicit or os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT)


def is_secret(name: str) -> bool:
    return name in SECRET_ENV or bool(SECRET_NAME.search(name))


def child_env(**overrides: str) -> dict[str, str]:
    """This process's environment without secrets, plus ``overrides``: for every child
    process that does not log in to a hub."""
    env = {k: v for k, v in os.environ.items() if not is_secret(k)}
    env.update(overrides)
    return env
