"""The door of the load balancer: who may send a request, and on which address.

Every request through HAProxy's public frontend must carry ``Authorization: Bearer <key>``.
HAProxy checks it itself: it hashes the presented key (``http_auth_bearer,sha2(256),hex``)
and looks the hash up in a map file the project writes (``keys.map``, mode 0600, in the
router's directory). The map holds SHA-256 hashes only, never a key. A request without a
known key is denied with 401 and ``WWW-Authenticate: Bearer`` before a backend is chosen,
so no such request reaches vLLM; HAProxy counts it as a denied request of the frontend
(``dreq``; Prometheus: ``haproxy_frontend_requests_denied_total{proxy="llm"}``).

Two kinds of key open the door:

- the operator's keys, one per line in the file the operator names (below); refused when
  the file is empty or others may read it;
- the project's own key (``client.key`` in the router's directory, 0600, made on first
  start): the one the project's own clients send (demo traffic, canary probes). It opens
  only the loopback listener, never the public one. Without an operator key file it is
  the demo's key: ``curl -H "Authorization: Bearer $(cat .llm-release/router/client.key)"``.

Operator settings (trusted; read from the environment here and nowhere else). A run's form
has no field for them: a run can neither open the door nor change its keys.

- ``LLM_RELEASE_DOOR_KEYS_FILE``: the operator's key file.
- ``LLM_RELEASE_DOOR_BIND``: ``ADDRESS:PORT`` of a public listener beside the loopback one
  (``127.0.0.1:<router port>``, which stays for the project's own clients). An address
  other than loopback needs TLS and an operator key file, or is refused at config time.
- ``LLM_RELEASE_DOOR_TLS_PEM``: a PEM file with the certificate (and its chain) and the
  private key; the public listener then binds ``ssl crt <pem>``.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from llm_release.errors import ConfigError, one_line
from llm_release.secret_files import made_secret, private_file
from llm_release.settings import settings as operator_settings

logger = logging.getLogger(__name__)

ENV_PREFIX = "LLM_RELEASE_DOOR_"
KEYS_FILE_ENV = ENV_PREFIX + "KEYS_FILE"
BIND_ENV = ENV_PREFIX + "BIND"
TLS_PEM_ENV = ENV_PREFIX + "TLS_PEM"
# A bearer token's characters (RFC 6750 b64token); nothing that could break a map line.
KEY_PATTERN = re.compile(r"[A-Za-z0-9._~+/-]+=*")
MIN_KEY_CHARS = 16
MAX_KEY_CHARS = 512
NEW_KEY_HINT = "python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
# The map's values: which kind of key a hash belongs to (the HAProxy rules read them).
OPERATOR = "operator"
PROJECT = "project"


class DoorSettings(BaseModel):
    """The operator's settings of the door (``LLM_RELEASE_DOOR_*``, fields of the one
    Settings class: ``settings.Settings.door_*``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keys_file: Path | None = None
    bind: str | None = None
    tls_pem: Path | None = None

    @field_validator("bind")
    @classmethod
    def _address_and_port(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        split_bind(value)
        return value

    @property
    def public(self) -> bool:
        """A listener on an address other than loopback."""
        return (
            self.bind is not None and not ipaddress.ip_address(split_bind(self.bind)[0]).is_loopback
        )

    def check(self) -> DoorSettings:
        """Refuse, in one line, a door that would open to the network unguarded."""
        if self.tls_pem is not None and self.bind is None:
            raise ConfigError(
                f"{TLS_PEM_ENV} is set but {BIND_ENV} is not: TLS is for the public listener",
                hint=f"set {BIND_ENV}=ADDRESS:PORT, or unset {TLS_PEM_ENV}",
            )
        if self.public and (self.tls_pem is None or self.keys_file is None):
            missing = [
                name
                for name, value in ((TLS_PEM_ENV, self.tls_pem), (KEYS_FILE_ENV, self.keys_file))
                if value is None
            ]
            raise ConfigError(
                f"{BIND_ENV}={self.bind} is not loopback: binding there needs TLS and API keys",
                hint=f"set {' and '.join(missing)} (a PEM with certificate and key; a key file, "
                f"one key a line), or bind to 127.0.0.1",
            )
        if self.tls_pem is not None:
            private_file(self.tls_pem, TLS_PEM_ENV, "a PEM with the certificate and its key")
        if self.keys_file is not None:
            read_keys(self.keys_file)
        return self


def settings() -> DoorSettings:
    """The door's settings from the environment, checked; ConfigError in one line."""
    found = operator_settings()
    try:
        return DoorSettings(
            keys_file=found.door_keys_file, bind=found.door_bind, tls_pem=found.door_tls_pem
        ).check()
    except ValidationError as exc:
        raise ConfigError(
            f"the door's settings ({ENV_PREFIX}*) are invalid: {one_line(exc)}",
            hint=f"{BIND_ENV}=ADDRESS:PORT, {KEYS_FILE_ENV}=FILE, {TLS_PEM_ENV}=FILE",
        ) from None


def split_bind(value: str) -> tuple[str, int]:
    """``ADDRESS:PORT`` (IPv6 in brackets) as (address, port); ValueError otherwise."""
    match = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d{1,5})|([0-9.]+):(\d{1,5})", value)
    if match is None:
        raise ValueError(f"{value!r} is not ADDRESS:PORT (an IP address: 0.0.0.0:8443, [::]:8443)")
    host = match.group(1) or match.group(3)
    port = int(match.group(2) or match.group(4))
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range")
    return host, port


def haproxy_address(value: str) -> str:
    """The bind address as HAProxy writes it (``ipv6@`` for an IPv6 address)."""
    host, port = split_bind(value)
    return f"ipv6@{host}:{port}" if ":" in host else f"{host}:{port}"


def read_keys(path: Path) -> list[str]:
    """The operator's keys: one a line; blank lines and lines starting with '#' ignored."""
    private_file(path, KEYS_FILE_ENV, "a file with one API key a line")
    keys: list[str] = []
    for number, raw in enumerate(Path(path).read_text("utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        # The message names the line, never the key.
        if not KEY_PATTERN.fullmatch(line) or not MIN_KEY_CHARS <= len(line) <= MAX_KEY_CHARS:
            raise ConfigError(
                f"{KEYS_FILE_ENV}: line {number} of {path} is not an API key "
                f"({MIN_KEY_CHARS}-{MAX_KEY_CHARS} of A-Z a-z 0-9 - . _ ~ + /, no spaces)",
                hint=f"one key a line; make one with {NEW_KEY_HINT}",
            )
        if line not in keys:
            keys.append(line)
    if not keys:
        raise ConfigError(
            f"{KEYS_FILE_ENV}: {path} holds no API key",
            hint=f"add one key a line, e.g. {NEW_KEY_HINT} >> {path}",
        )
    return keys


def key_hash(key: str) -> str:
    """What HAProxy computes of a presented key: ``sha2(256),hex`` (upper-case hex)."""
    return hashlib.sha256(key.encode()).hexdigest().upper()


def render_key_map(operator_keys: list[str], project_key: str) -> str:
    """HAProxy's map of key hashes to the kind of key; no key itself is written."""
    lines = ["# SHA-256 of each API key -> its kind; written by llm-release, do not edit"]
    lines += [f"{key_hash(key)} {OPERATOR}" for key in operator_keys]
    lines.append(f"{key_hash(project_key)} {PROJECT}")
    return "\n".join(lines) + "\n"


def project_key(path: Path) -> str:
    """The project's own key at ``path``, made (0600) the first time it is asked for."""
    key, made = made_secret(
        path,
        "the project's API key file",
        lambda key: bool(KEY_PATTERN.fullmatch(key)) and len(key) >= MIN_KEY_CHARS,
        f"delete {path}: the next router start makes a new one",
        kind="key",
    )
    if not made:
        return key
    logger.warning(
        "made an API key for the load balancer: %s (the demo traffic and probes send it; "
        'try: curl -H "Authorization: Bearer $(cat %s)" …)',
        path,
        path,
    )
    return key
