"""The door of the project's real HAProxy: API keys, 401s, TLS, and the refusals counted.

A small HTTP server stands in for vLLM and records every request that reaches it (HAProxy's
health checks apart), so "no request reached the model" is checked where it matters.
"""

import datetime
import ipaddress
import json
import logging
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from llm_release import server_key
from llm_release.canary import door
from llm_release.canary.router import Router, SlotTarget
from llm_release.errors import ConfigError
from llm_release.load.traffic import Traffic
from llm_release.serving.serve import free_port

pytestmark = pytest.mark.integration

OPERATOR_KEY = "operator-key-0123456789abcdef"
COMPLETION = {
    "id": "c1",
    "object": "chat.completion",
    "created": 0,
    "model": "svc",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


class RecordingBackend:
    """Answers like vLLM enough for HAProxy and the openai client; records what it got."""

    def __init__(self):
        self.seen: list[tuple[str, str, str | None]] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: bytes):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path != "/health":
                    backend.seen.append(("GET", self.path, self.headers.get("Authorization")))
                self._answer(b"{}")

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                backend.seen.append(("POST", self.path, self.headers.get("Authorization")))
                self._answer(json.dumps(COMPLETION).encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture()
def backend():
    server = RecordingBackend()
    yield server
    server.close()


def started(router: Router, backend: RecordingBackend) -> Router:
    router.start(SlotTarget("127.0.0.1", backend.port, 100), None)
    deadline = time.monotonic() + 15
    while router.stats()["stable"]["status"] != "UP" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert router.stats()["stable"]["status"] == "UP"
    return router


@pytest.fixture()
def demo_router(home, backend, caplog):
    """The demo: no operator setting at all."""
    caplog.set_level(logging.WARNING, logger="llm_release.canary.door")
    router = Router(home / "router", free_port(), door.DoorSettings())
    yield started(router, backend)
    router.stop()


def denied(router: Router) -> int:
    """HAProxy's own Prometheus counter of the requests its frontend denied."""
    text = requests.get(
        f"http://127.0.0.1:{router.metrics_port}/metrics", headers=server_key.headers(), timeout=5
    ).text
    for line in text.splitlines():
        if line.startswith('haproxy_frontend_requests_denied_total{proxy="llm"}'):
            return int(float(line.split()[-1]))
    raise AssertionError("no haproxy_frontend_requests_denied_total for the frontend 'llm'")


def test_without_a_key_401_and_the_model_sees_nothing(demo_router, backend):
    before = denied(demo_router)
    url = f"{demo_router.url}/v1/chat/completions"
    body = {"model": "svc", "messages": [{"role": "user", "content": "hi"}]}
    for headers in (
        {},
        {"Authorization": "Bearer wrong-key-0123456789abcdef"},
        {"Authorization": f"Basic {demo_router.api_key}"},
        {"Authorization": f"Bearer {demo_router.api_key}x"},
    ):
        reply = requests.post(url, json=body, headers=headers, timeout=5)
        assert reply.status_code == 401, headers
        assert reply.headers["WWW-Authenticate"].startswith("Bearer")
        assert reply.json()["error"]["code"] == "invalid_api_key"
    assert requests.get(f"{demo_router.url}/v1/models", timeout=5).status_code == 401
    assert backend.seen == []
    assert denied(demo_router) == before + 5


def test_with_the_key_served_as_before(demo_router, backend):
    before = denied(demo_router)
    url = f"{demo_router.url}/v1/chat/completions"
    body = {"model": "svc", "messages": [{"role": "user", "content": "hi"}]}
    reply = requests.post(url, json=body, headers=demo_router.auth_headers, timeout=5)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "ok"
    # The server gets the servers' key in place of the client's (the door's stays here).
    assert backend.seen == [("POST", "/v1/chat/completions", f"Bearer {server_key.key()}")]
    assert denied(demo_router) == before


def test_the_servers_key_is_haproxys_alone_and_opens_its_exporter(demo_router, backend):
    """HAProxy sends the vLLM servers' key (issue 36 medium 5) from its environment, never
    from its config file; its Prometheus exporter asks for that key too."""
    config = demo_router.config_path.read_text()
    assert server_key.key() not in config
    assert f"${{{server_key.KEY_ENV}}}" in config
    exporter = f"http://127.0.0.1:{demo_router.metrics_port}/metrics"
    assert requests.get(exporter, timeout=5).status_code == 401
    wrong = {"Authorization": f"Bearer {demo_router.api_key}"}  # the door's key is not it
    assert requests.get(exporter, headers=wrong, timeout=5).status_code == 401
    opened = requests.get(exporter, headers=server_key.headers(), timeout=5)
    assert opened.status_code == 200 and "haproxy_frontend_" in opened.text
    # A client's own Authorization never reaches a server, whatever it says.
    requests.get(f"{demo_router.url}/v1/models", headers=demo_router.auth_headers, timeout=5)
    assert [auth for _, _, auth in backend.seen] == [f"Bearer {server_key.key()}"]


def test_a_server_key_that_begins_with_a_dash_opens_the_exporter(home, backend):
    """token_urlsafe begins one key in 64 with '-': HAProxy read it as an ACL option and
    refused its config (the promote of the H100 demo of 2026-12-05, second run). The pattern
    now follows '--'."""
    import os
    import secrets

    key = "-" + secrets.token_urlsafe(32)
    path = server_key.key_path(home)
    path.write_text(key + "\n")
    os.chmod(path, 0o600)
    assert server_key.key() == key
    router = started(Router(home / "router", free_port(), door.DoorSettings()), backend)
    try:
        exporter = f"http://127.0.0.1:{router.metrics_port}/metrics"
        assert requests.get(exporter, timeout=5).status_code == 401
        opened = requests.get(exporter, headers=server_key.headers(), timeout=5)
        assert opened.status_code == 200 and "haproxy_frontend_" in opened.text
    finally:
        router.stop()


def test_the_demo_key_is_made_private_and_named(demo_router, caplog):
    key_file = demo_router.api_key_path
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert demo_router.key_map_path.stat().st_mode & 0o777 == 0o600
    assert demo_router.api_key not in demo_router.key_map_path.read_text()
    assert any(str(key_file) in record.getMessage() for record in caplog.get_records("setup"))


def test_demo_traffic_sends_the_key(demo_router, backend):
    with_key = Traffic(
        demo_router.url,
        "svc",
        rate_rps=20,
        duration_s=5,
        max_requests=6,
        api_key=demo_router.api_key,
    ).run()
    assert with_key.succeeded == 6 and with_key.failed == 0
    without = Traffic(demo_router.url, "svc", rate_rps=20, duration_s=5, max_requests=3).run()
    assert without.errors == {"http_401": 3}
    assert len(backend.seen) == 6


def test_the_operators_keys_open_the_door(home, backend, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"# the support team\n{OPERATOR_KEY}\n")
    keys.chmod(0o600)
    router = Router(home / "router", free_port(), door.DoorSettings(keys_file=keys))
    started(router, backend)
    try:
        ok = requests.get(
            f"{router.url}/v1/models", headers={"Authorization": f"Bearer {OPERATOR_KEY}"}
        )
        assert ok.status_code == 200
        # The project's own key still opens the loopback listener (its probes, the demo).
        assert requests.get(f"{router.url}/v1/models", headers=router.auth_headers).ok
        assert OPERATOR_KEY not in router.key_map_path.read_text()
    finally:
        router.stop()


def test_a_public_bind_without_tls_is_refused_before_haproxy_starts(home, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(OPERATOR_KEY + "\n")
    keys.chmod(0o600)
    settings = door.DoorSettings(bind=f"0.0.0.0:{free_port()}", keys_file=keys)
    router = Router(home / "router", free_port(), settings)
    with pytest.raises(ConfigError, match="not loopback") as caught:
        router.start(SlotTarget("127.0.0.1", 9, 100), None)
    assert "LLM_RELEASE_DOOR_TLS_PEM" in caught.value.one_line()
    assert not router.running() and not router.config_path.exists()


def make_ca_and_server_pem(tmp_path):
    """A test CA, and a server certificate for 127.0.0.1 it signed: (CA file, server PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject, issuer, public_key, signer, extensions):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signer, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = build(
        "door test CA",
        "door test CA",
        ca_key.public_key(),
        ca_key,
        [(x509.BasicConstraints(ca=True, path_length=None), True)],
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = build(
        "127.0.0.1",
        "door test CA",
        server_key.public_key(),
        ca_key,
        [
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (
                x509.SubjectAlternativeName(
                    [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
                ),
                False,
            ),
        ],
    )
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_pem = tmp_path / "door.pem"
    server_pem.write_bytes(
        server.public_bytes(serialization.Encoding.PEM)
        + server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    server_pem.chmod(0o600)
    return ca_file, server_pem


def test_a_public_door_speaks_tls_and_takes_operator_keys_only(home, backend, tmp_path):
    ca_file, server_pem = make_ca_and_server_pem(tmp_path)
    keys = tmp_path / "keys"
    keys.write_text(OPERATOR_KEY + "\n")
    keys.chmod(0o600)
    public_port = free_port()
    settings = door.DoorSettings(
        bind=f"0.0.0.0:{public_port}", keys_file=keys, tls_pem=server_pem
    ).check()
    assert settings.public
    router = started(Router(home / "router", free_port(), settings), backend)
    public = f"https://127.0.0.1:{public_port}/v1/models"
    operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    try:
        before = denied(router)
        # A client that verifies the test CA: served with a key, 401 without one.
        assert requests.get(public, headers=operator, verify=str(ca_file), timeout=5).ok
        assert requests.get(public, verify=str(ca_file), timeout=5).status_code == 401
        # The project's own key opens the loopback listener only, never the public one.
        refused = requests.get(public, headers=router.auth_headers, verify=str(ca_file))
        assert refused.status_code == 401
        # A client that does not trust the test CA stops at the handshake: nothing sent.
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(public, headers=operator, timeout=5)
        strict = ssl.create_default_context()  # the system's CAs only
        with pytest.raises(ssl.SSLCertVerificationError):
            raw = socket.create_connection(("127.0.0.1", public_port), timeout=5)
            with strict.wrap_socket(raw, server_hostname="127.0.0.1"):
                pass
        # Plain HTTP on the TLS port gets no answer from the model either.
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(f"http://127.0.0.1:{public_port}/v1/models", headers=operator, timeout=5)
        assert denied(router) == before + 2
        assert [path for _, path, _ in backend.seen] == ["/v1/models"]
    finally:
        router.stop()


def test_a_router_an_older_version_started_is_outdated(demo_router):
    """One started before the servers' key forwards requests without it: the next deploy,
    rollback or 'up' starts it again (promote._apply)."""
    assert not demo_router.outdated()
    config = demo_router.config_path.read_text()
    old = "\n".join(line for line in config.splitlines() if "set-header Authorization" not in line)
    demo_router.config_path.write_text(old + "\n")
    assert demo_router.outdated()
