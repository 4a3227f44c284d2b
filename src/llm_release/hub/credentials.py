"""Hub endpoints and tokens: passed explicitly, never written down, never inherited.

The acquire stage hands the endpoint and token to the hub client objects themselves
(``HfApi(endpoint=…, token=…)``, the request headers); nothing sets ``HF_ENDPOINT`` or
``HF_TOKEN`` in this process, because ``huggingface_hub`` reads the endpoint once at import
and the token on every call, so a late change can pair one hub's token with another hub.
An endpoint URL must not carry credentials (``https://user:pass@host``): it is written to
the manifest and to error messages. Child processes that talk to no hub (vLLM, HAProxy,
GuideLLM) start from an environment without secrets.

Which token goes where is decided by ``token_for`` alone, and every request to a hub
(listing, config and shard headers, files; acquire, plan, the CLI) takes its token from it:

- a token saved in a ``HubCredentials`` block goes to the endpoint the block was saved for
  and nowhere else; a run that names another endpoint with that block is refused;
- the environment's token (``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``, a cached login) goes
  to the public hub (https://huggingface.co) and to the endpoints the operator lists in
  ``LLM_RELEASE_HF_TOKEN_ENDPOINTS`` (comma-separated), never to one a run or ``--endpoint``
  names otherwise;
- everything else gets ``False``: ``huggingface_hub`` then sends no token at all (``None``
  would make it fall back to the environment).

``check_hub_endpoint`` is the endpoint policy every hub request passes first: no link-local
address (169.254.0.0/16, fe80::/10: cloud metadata services) or other cloud metadata address
(AWS's IPv6 fd00:ec2::254) and none of this project's own service ports on this host (the
Prefect API, the router, Prometheus, HAProxy's metrics), unless the operator lists the
endpoint in ``LLM_RELEASE_HUB_ALLOW_ENDPOINTS``. Loopback stays allowed: the demo hub runs on
127.0.0.1. ``check_prometheus_url`` holds the run form's Prometheus URL to the same rules
(its own services: every one but Prometheus, the demo hub's port included).
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from collections.abc import Iterable
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr

from llm_release.errors import ConfigError
from llm_release.settings import NVLINK_MULTICAST_OFF, env_name, settings

HF_DEFAULT_ENDPOINT = "https://huggingface.co"
# Operator settings (trusted): where the environment's Hugging Face token may also go, and
# endpoints exempt from the endpoint policy. Comma-separated endpoint URLs.
TOKEN_ENDPOINTS_ENV = "LLM_RELEASE_HF_TOKEN_ENDPOINTS"
MODELSCOPE_DEFAULT_ENDPOINTS = ("https://www.modelscope.cn", "https://modelscope.cn")
MODELSCOPE_TOKEN_ENDPOINTS_ENV = "LLM_RELEASE_MODELSCOPE_TOKEN_ENDPOINTS"
ALLOW_ENDPOINTS_ENV = "LLM_RELEASE_HUB_ALLOW_ENDPOINTS"
# The project's own services on this host (settings fields), each with the port it has
# when its setting is not a port number (None: no fixed one).
SERVICE_PORTS = (
    ("router_port", 8080),
    ("prometheus_port", 9090),
    ("alertmanager_port", 9093),
    ("haproxy_metrics_port", None),
    ("prefect_server_api_port", 4200),
)
# The demo hub's port (``llm-release hub``'s default): one of the project's services.
DEMO_HUB_PORT = 8765
# Cloud metadata services outside the link-local ranges: AWS's IPv6 (fd00:ec2::254), GCP's
# IPv6 (fd20:ce::254), Oracle Cloud's IPv4 and IPv6 (192.0.0.192, fd00:c1::a9fe:a9fe),
# Alibaba's (100.100.100.200), Azure's WireServer (168.63.129.16: it hands out the VM's
# configuration and certificates). Azure's, GCP's and DigitalOcean's IMDS are link-local.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "fd00:ec2::254",
        "fd20:ce::254",
        "192.0.0.192",
        "fd00:c1::a9fe:a9fe",
        "100.100.100.200",
        "168.63.129.16",
    )
)
# IPv6 prefixes that carry an IPv4 address in their last 32 bits: NAT64 (64:ff9b::/96,
# 64:ff9b:1::/48) and the deprecated IPv4-compatible form (::/96).
_EMBEDDING_V4 = (
    ipaddress.ip_network("64:ff9b::/96"),
    ipaddress.ip_network("64:ff9b:1::/48"),
    ipaddress.ip_network("::/96"),
)
PROMETHEUS_URL_FIELD = "rollout.analysis.prometheus_url"
# Named secrets, and anything whose name says it is one.
SECRET_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "MODELSCOPE_API_TOKEN",
    "PREFECT_API_KEY",
    "PREFECT_API_AUTH_STRING",
    "PREFECT_SERVER_API_AUTH_STRING",
)
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
    return check_endpoint(explicit or settings().hf_endpoint or HF_DEFAULT_ENDPOINT)


def is_secret(name: str) -> bool:
    return name in SECRET_ENV or bool(SECRET_NAME.search(name))


def child_env(**overrides: str) -> dict[str, str]:
    """This process's environment without secrets, with NVLink multicast off, plus
    ``overrides``: for every child process that does not log in to a hub."""
    env = {k: v for k, v in os.environ.items() if not is_secret(k)}
    env.update(NVLINK_MULTICAST_OFF)
    env.update(overrides)
    return env


# ---------------------------------------------------------------- which token goes where


class HubToken(BaseModel):
    """A saved token and the one endpoint it was saved for (a ``HubCredentials`` block)."""

    model_config = ConfigDict(extra="forbid")

    endpoint: str
    token: SecretStr


def _key(url: str) -> str:
    """``url`` normalised for comparison: scheme, lower-case host, explicit port, path."""
    parts = urlsplit(check_endpoint(url))
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = (parts.hostname or "").lower()
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}:{port}{parts.path.rstrip('/')}"


def same_endpoint(a: str, b: str) -> bool:
    return _key(a) == _key(b)


def _setting_endpoints(field: str) -> list[str]:
    """The endpoints an operator setting lists; a malformed one is a one-line error."""
    name = env_name(field)
    try:
        return [check_endpoint(u) for u in getattr(settings(), field)]
    except ValueError as exc:
        raise ConfigError(
            f"{name}: {str(exc).split(';')[0]}",
            hint=f"set {name} to comma-separated http(s) endpoint URLs without credentials",
        ) from None


def token_endpoints(hub: str = "huggingface") -> list[str]:
    """Where the environment's token may go: the public hub and the endpoints the operator
    configured for it."""
    if hub == "modelscope":
        return [*MODELSCOPE_DEFAULT_ENDPOINTS, *_setting_endpoints("modelscope_token_endpoints")]
    return [HF_DEFAULT_ENDPOINT, *_setting_endpoints("hf_token_endpoints")]


def environment_token(hub: str = "huggingface") -> str | None:
    """The token the hub client would send on its own: ``HF_TOKEN`` (or
    ``HUGGING_FACE_HUB_TOKEN``), else a cached ``hf auth login``; ``MODELSCOPE_API_TOKEN``
    for ModelScope."""
    if hub == "modelscope":
        token = settings().modelscope_api_token
        return token.get_secret_value() if token else None
    from huggingface_hub import get_token

    return get_token()


def saved_token(
    run_endpoint: str | None, saved_endpoint: str | None, token: SecretStr | None, *, block: str
) -> tuple[str, HubToken | None]:
    """The endpoint a run with the ``block`` credentials talks to, and the block's token
    bound to it. A block saved without an endpoint is for the public hub. A run that names
    another endpoint is refused: the block's token never goes there."""
    own = check_endpoint(saved_endpoint or HF_DEFAULT_ENDPOINT)
    if run_endpoint and not same_endpoint(run_endpoint, own):
        raise ConfigError(
            f"source.endpoint {check_endpoint(run_endpoint)} is not the endpoint the "
            f"credentials block {block!r} was saved for ({own})",
            hint="leave source.endpoint empty to use the block's endpoint, or save a block "
            "for that endpoint; a saved token is sent only to its own endpoint",
        )
    return own, (HubToken(endpoint=own, token=token) if token is not None else None)


def token_for(
    endpoint: str, saved: HubToken | None = None, *, hub: str = "huggingface"
) -> str | Literal[False]:
    """The token to send to ``endpoint``, or ``False`` for none (never ``None``, which makes
    ``huggingface_hub`` fall back to the environment). The one place that decides.

    ``saved`` (a block's token) goes to its own endpoint only: any other is a ConfigError,
    raised before a request is made. Without one, the environment's token goes to the
    public hub and to the endpoints in ``LLM_RELEASE_HF_TOKEN_ENDPOINTS`` (ModelScope's:
    modelscope.cn and ``LLM_RELEASE_MODELSCOPE_TOKEN_ENDPOINTS``); elsewhere none.
    """
    if saved is not None:
        if not same_endpoint(endpoint, saved.endpoint):
            raise ConfigError(
                f"a token saved for {check_endpoint(saved.endpoint)} would go to "
                f"{check_endpoint(endpoint)}",
                hint="use the block's own endpoint; a saved token is sent only there",
            )
        return saved.token.get_secret_value() or False
    if any(same_endpoint(endpoint, e) for e in token_endpoints(hub)):
        return environment_token(hub) or False
    return False


# ---------------------------------------------------------------- the endpoint policy


def _service_ports(*, but: str | None = None) -> set[int]:
    """The ports of the project's services on this host, from their settings (``but``: the
    setting of the one left out)."""
    ports: set[int] = set()
    current = settings()
    for field, default in SERVICE_PORTS:
        if field == but:
            continue
        value = getattr(current, field)
        if isinstance(value, int):
            ports.add(value)
        elif default is not None:
            ports.add(default)
    return ports


def _prefect_api() -> tuple[str, int] | None:
    url = settings().prefect_api_url
    if not url:
        return None
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    return ((parts.hostname or "").lower(), port) if parts.hostname else None


def _literal_addresses(host: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """``host`` as an IP address, in any spelling the C library accepts (``2852039166``,
    ``0xa9fea9fe``, ``169.254.43518`` are all 169.254.169.254); [] for a name. An IPv6
    zone (``fd00:ec2::254%eth0``) is dropped: it names the interface, not another host."""
    try:
        return [ipaddress.ip_address(host.split("%")[0])]
    except ValueError:
        pass
    try:
        return [ipaddress.IPv4Address(socket.inet_aton(host))]
    except OSError:
        return []


def _resolved(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    found = []
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []  # an unknown name: the request fails on its own, reaching nothing
    for info in infos:
        try:
            found.append(ipaddress.ip_address(str(info[4][0]).split("%")[0]))
        except ValueError:
            continue
    return found


def _link_local(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """A link-local address or a cloud metadata service's (IPv4-mapped spellings too)."""
    candidates = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            candidates.append(address.ipv4_mapped)
        if address.sixtofour is not None:  # 2002:a9fe:a9fe::/48
            candidates.append(address.sixtofour)
        if any(address in net for net in _EMBEDDING_V4):
            candidates.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return any(a.is_link_local or a in METADATA_ADDRESSES for a in candidates)


def _this_host(host: str, addresses: list) -> bool:
    addresses = addresses or _literal_addresses(host)
    if host in ("localhost", socket.gethostname().lower()) or host.endswith(".localhost"):
        return True
    for address in addresses:
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if address.is_loopback or address.is_unspecified:
            return True
    return False


def _target(
    url: str, resolve: bool
) -> tuple[str, int, list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    """The host, port and addresses a checked URL reaches (resolved when ``resolve``)."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower().rstrip(".")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = _literal_addresses(host)
    if resolve and not addresses:
        addresses = _resolved(host, port)
    return host, port, addresses


def _own_service(host: str, port: int, addresses: list, ports: set[int]) -> bool:
    """``host:port`` is one of ``ports`` on this host, or the Prefect API wherever it runs."""
    api = _prefect_api()
    ports = ports | ({api[1]} if api and _this_host(api[0], []) else set())
    return api == (host, port) or (port in ports and _this_host(host, addresses))


def check_hub_endpoint(url: str, *, resolve: bool = True) -> str:
    """``url`` if the endpoint policy lets a hub request go there; ConfigError otherwise.

    Refused: a link-local address or another cloud metadata address (metadata services live
    there) and, on this host, a port of the project's own services (Prefect API, router,
    Prometheus, HAProxy metrics) or the Prefect API's host and port wherever it runs. The
    operator exempts an endpoint by listing it in ``LLM_RELEASE_HUB_ALLOW_ENDPOINTS``.
    ``resolve`` also checks the addresses a host name resolves to (a DNS lookup; no
    connection is made).
    """
    try:
        url = check_endpoint(url)
    except ValueError as exc:
        raise ConfigError(
            f"hub endpoint refused: {exc}", hint="give the hub's plain http(s) URL"
        ) from None
    if any(same_endpoint(url, allowed) for allowed in _setting_endpoints("hub_allow_endpoints")):
        return url
    host, port, addresses = _target(url, resolve)
    hint = (
        f"use the hub's own address; an operator who means it lists the endpoint in "
        f"{ALLOW_ENDPOINTS_ENV}"
    )
    if any(_link_local(a) for a in addresses):
        raise ConfigError(
            f"hub endpoint {url} is a link-local address (169.254.0.0/16, fe80::/10, where "
            "cloud metadata services answer) or a cloud metadata address (fd00:ec2::254, "
            "fd20:ce::254, 192.0.0.192, …)",
            hint=hint,
        )
    if _own_service(host, port, addresses, _service_ports()):
        raise ConfigError(
            f"hub endpoint {url} is one of this project's own services (port {port}: the "
            "Prefect API, the router, Prometheus or HAProxy's metrics)",
            hint=hint,
        )
    return url


def check_prometheus_url(url: str, *, own_ports: Iterable[int] = (), resolve: bool = True) -> str:
    """The run form's ``rollout.analysis.prometheus_url`` past the hub endpoint policy's
    rules; ConfigError (one line, with the fix) otherwise.

    Refused: anything but a plain http(s) URL, a link-local or cloud metadata address and,
    on this host, the port of any of the project's own services but Prometheus (the demo
    hub, the router, Alertmanager, HAProxy's metrics, the Prefect API, from their settings)
    and ``own_ports``: the ports the caller knows are the project's now (the vLLM servers
    and their supervisors, the recorded router and Alertmanager ports). ``resolve`` checks
    the addresses a name resolves to as well. No operator exemption: no Prometheus answers
    on those addresses.
    """
    return _checked_prometheus(url, own_ports, resolve)[0]


def pinned_prometheus_url(url: str, *, own_ports: Iterable[int] = ()) -> tuple[str, str]:
    """``check_prometheus_url`` with the name resolved, and the address it checked: the
    address the queries go to (``PrometheusClient(pinned=...)``), so a name that resolves
    elsewhere a moment later (DNS rebinding: a short TTL, another answer) reaches nothing
    the check did not pass. A name that does not resolve is refused."""
    url, host, addresses = _checked_prometheus(url, own_ports, True)
    if not addresses:
        raise ConfigError(
            f"{PROMETHEUS_URL_FIELD} {url}: {host} does not resolve",
            hint=f"set {PROMETHEUS_URL_FIELD} to a name this host resolves, or to an address",
        )
    return url, str(addresses[0])


def _checked_prometheus(
    url: str, own_ports: Iterable[int], resolve: bool
) -> tuple[str, str, list[ipaddress.IPv4Address | ipaddress.IPv6Address]]:
    hint = (
        f"set {PROMETHEUS_URL_FIELD} to your Prometheus's own address (http(s)://host:port), "
        "or leave it unset for the project's Prometheus"
    )
    try:
        url = check_endpoint(url)
    except ValueError as exc:
        reason = str(exc).split(";")[0].replace("endpoint", "it")
        raise ConfigError(f"{PROMETHEUS_URL_FIELD} refused: {reason}", hint=hint) from None
    host, port, addresses = _target(url, resolve)
    if any(_link_local(a) for a in addresses):
        raise ConfigError(
            f"{PROMETHEUS_URL_FIELD} {url} is a link-local or cloud metadata address "
            "(169.254.0.0/16, fe80::/10, fd00:ec2::254), not a Prometheus",
            hint=hint,
        )
    ports = _service_ports(but="prometheus_port") | {DEMO_HUB_PORT} | set(own_ports)
    if _own_service(host, port, addresses, ports):
        raise ConfigError(
            f"{PROMETHEUS_URL_FIELD} {url} is one of this project's own services (port "
            f"{port}: the hub, the router, Alertmanager, HAProxy, a vLLM server or the "
            "Prefect API), not a Prometheus",
            hint=hint,
        )
    return url, host, addresses


def hub_endpoint(explicit: str | None) -> str:
    """The Hugging Face endpoint a request goes to (``hf_endpoint``), past the policy."""
    return check_hub_endpoint(hf_endpoint(explicit))
