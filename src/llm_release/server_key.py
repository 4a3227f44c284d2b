"""The vLLM servers' key: every vLLM server the project starts (candidates, the stable,
the canary; either backend) answers only requests that carry it as ``Authorization:
Bearer <key>``, ``/health`` aside. vLLM listens on 127.0.0.1 (a container: published on
it), where every local user reaches it past the door; its own ``--api-key`` guards only
paths under /v1, /v2, /inference and /cohere (``/invocations`` runs a completion without
it), so the check is the project's own ASGI middleware on every path
(``serving/vllm_middleware/llm_release_lock.py``, loaded by vLLM's ``--middleware``).

One key a home, made at random the first time it is asked for in ``<home>/server.key``
(0600, ``secret_files.made_secret``). The server gets it in its environment (``KEY_ENV``;
a process's environment is readable by its owner only), never in argv; the project's own
callers send it: the starter's readiness checks, lm-evaluation-harness, GuideLLM (from a
0600 scenario file), the prefix-cache and drain readers of ``/metrics``, Prometheus'
scrapes (``credentials_file``) and HAProxy, which sets it on every request it forwards
(replacing the client's ``Authorization``)."""

from __future__ import annotations

from pathlib import Path

from llm_release import paths
from llm_release.errors import ConfigError
from llm_release.secret_files import home_token, private_file, token_valid

# The variable the middleware reads the key from (set only in the server's environment).
KEY_ENV = "LLMRELEASE_SERVER_KEY"
# vLLM's --middleware: the module's folder is put on the server's PYTHONPATH.
MIDDLEWARE = "llm_release_lock.ServerLock"
SETTING = "the vLLM servers' key file"


def key_path(home: Path | None = None) -> Path:
    return Path(home or paths.home()) / "server.key"


def key(home: Path | None = None) -> str:
    """The home's server key, made (0600) the first time it is asked for."""
    path = key_path(home)
    return home_token(path, SETTING, _hint(path), kind="key")


def read(path: Path) -> str:
    """The key in ``path``, made by ``key`` (checked as it checks it); ConfigError else."""
    private_file(path, SETTING, "the servers' key file")
    secret = Path(path).read_text("utf-8").strip()
    if not valid(secret):
        raise ConfigError(f"{SETTING} {path} holds no key", hint=_hint(path))
    return secret


def valid(value: str) -> bool:
    """What secrets.token_urlsafe makes (the only keys this module makes; a file edited by
    hand to something else is refused, it would not survive a header or a HAProxy line)."""
    return token_valid(value)


def _hint(path: Path) -> str:
    return f"delete {path} and restart the servers (make down, then make up): a new one is made"


def headers() -> dict[str, str]:
    """The header the project's own requests to a vLLM server carry."""
    return {"Authorization": f"Bearer {key()}"}
