"""A run's Prometheus (rollout.analysis.prometheus_url) is untrusted: it passes the endpoint
policy before any request, its redirects are not followed, and what it answers never comes
back verbatim in a window's reason."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from llm_release import registry
from llm_release.canary import analysis
from llm_release.canary.prometheus import PrometheusClient
from llm_release.config import AnalysisConfig, ReleaseConfig, ServingConfig
from llm_release.errors import ConfigError, MetricsError

HOSTILE = "\x1b[31mINTERNAL-SECRET db=postgres://admin:pw@10.0.0.9 | row |\x1b[0m"


class Target:
    """A real HTTP server on 127.0.0.1 that answers every POST with one canned reply."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None):
        target = self
        self.requests: list[str] = []
        self.hosts: list[str | None] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                self.rfile.read(length)
                target.requests.append(self.path)
                target.hosts.append(self.headers.get("Host"))
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST  # noqa: N815

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def target_of():
    started: list[Target] = []

    def start(status, body, headers=None):
        started.append(Target(status, body, headers))
        return started[-1]

    yield start
    for target in started:
        target.close()


def reason_of(client: PrometheusClient) -> str:
    """The reason a window gets when its numbers cannot be read (as flows/canary.py does)."""
    config = AnalysisConfig()
    with pytest.raises(MetricsError) as info:
        analysis.analyze_window(client, config, service="svc", slo_ttft_p95_s=3.0, end=1000.0)
    return analysis.unanswered(config, "svc", 940.0, 1000.0, info.value.one_line()).reason


def test_a_refusal_is_told_by_status_and_error_type_never_by_the_body(target_of):
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": HOSTILE}).encode()
    target = target_of(400, body)
    reason = reason_of(PrometheusClient(target.url))
    assert "HTTP 400, bad_data" in reason
    assert "INTERNAL-SECRET" not in reason and "\x1b" not in reason and "|" not in reason
    assert reason.startswith("no numbers: requests (stable): Prometheus at")


def test_an_error_type_outside_the_apis_words_is_left_out(target_of):
    body = json.dumps({"status": "error", "errorType": HOSTILE, "error": "x"}).encode()
    reason = reason_of(PrometheusClient(target_of(500, body).url))
    assert "(HTTP 500)" in reason and "INTERNAL-SECRET" not in reason


@pytest.mark.parametrize(
    "data",
    [
        {"resultType": "vector", "result": [{"value": HOSTILE}]},
        {"resultType": "vector", "result": [{"metric": {}, "value": [0, HOSTILE]}]},
        {"resultType": HOSTILE, "result": []},
        "not an object",
    ],
)
def test_a_malformed_answer_is_a_metrics_error_without_its_text(target_of, data):
    body = json.dumps({"status": "success", "data": data}).encode()
    reason = reason_of(PrometheusClient(target_of(200, body).url))
    assert "INTERNAL-SECRET" not in reason and "\x1b" not in reason


def test_a_redirect_is_not_followed(target_of):
    elsewhere = target_of(200, b"{}")
    redirecting = target_of(307, b"", {"Location": f"{elsewhere.url}/api/v1/query"})
    reason = reason_of(PrometheusClient(redirecting.url))
    assert "HTTP 307" in reason
    assert redirecting.requests and not elsewhere.requests


@pytest.fixture()
def serving(tmp_path, monkeypatch):
    """A home whose registry serves a stable release on port 40001 (its supervisor 40002)."""
    monkeypatch.setenv("LLM_RELEASE_HOME", str(tmp_path))
    for name in ("PREFECT_API_URL", "LLM_RELEASE_HAPROXY_METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    stable = registry.Release(
        release_id="baseline-aaaa-1",
        candidate="baseline",
        scheme="unquantized",
        repo_id="acme/tiny",
        commit="a" * 40,
        model_dir=str(tmp_path / "models" / "m"),
        public_name="tiny",
        port=40001,
        supervisor_port=40002,
        pid=0,
        log_path=str(tmp_path / "log"),
        serving=ServingConfig(),
    )
    registry.save(registry.RegistryState(stable=stable, router_port=18081))
    return stable


@pytest.mark.parametrize("port", [40001, 40002, 18081, 8765])
def test_the_projects_own_servers_are_refused_before_any_request(serving, target_of, port):
    config = AnalysisConfig(prometheus_url=f"http://127.0.0.1:{port}")
    with pytest.raises(ConfigError, match="own services") as info:
        analysis.client_for(config)
    assert "\n" not in info.value.one_line()


def test_a_metadata_address_is_refused_by_the_analysis(serving):
    for url in ("http://169.254.169.254", "http://[fd00:ec2::254]:80"):
        with pytest.raises(ConfigError, match="metadata"):
            analysis.analyze_window(
                None, AnalysisConfig(prometheus_url=url), service="svc", slo_ttft_p95_s=3.0
            )


def test_a_team_prometheus_and_the_projects_own_pass(serving):
    assert analysis.prometheus_url(AnalysisConfig(prometheus_url="http://10.0.0.5:9090/")) == (
        "http://10.0.0.5:9090"
    )
    assert analysis.prometheus_url(AnalysisConfig()).startswith("http://127.0.0.1:")


def test_the_release_preflight_refuses_a_metadata_prometheus_first(serving):
    from llm_release.preflight import check

    config = ReleaseConfig.model_validate(
        {
            "source": {"repo_id": "acme/tiny"},
            "public_name": "tiny",
            "rollout": {"analysis": {"prometheus_url": "http://169.254.169.254"}},
        }
    )
    with pytest.raises(ConfigError, match="rollout.analysis.prometheus_url"):
        check(config)


# ------------------------------------------------ DNS rebinding: the address checked is used

ANSWER = json.dumps(
    {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"job": "vllm"}, "value": [1000, "1"]}],
        },
    }
).encode()
NAME = "prom.rebind.test"


@pytest.fixture()
def rebinding(monkeypatch):
    """NAME resolves to 127.0.0.1 once, then to 127.0.0.2 (where nothing listens): a name
    whose owner answers the check with one address and the query with another."""
    import socket

    real = socket.getaddrinfo
    asked: list[str] = []

    def getaddrinfo(host, port, *args, **kwargs):
        if host == NAME:
            asked.append(host)
            return real("127.0.0.1" if len(asked) == 1 else "127.0.0.2", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    return asked


def test_a_runs_prometheus_is_asked_at_the_address_its_name_was_checked_at(
    serving, target_of, rebinding
):
    prometheus = target_of(200, ANSWER)
    port = prometheus.server.server_address[1]
    client = analysis.client_for(AnalysisConfig(prometheus_url=f"http://{NAME}:{port}"))
    for _ in range(2):
        (sample,) = client.query("up")
        assert sample.labels == {"job": "vllm"} and sample.value == 1.0
    assert rebinding == [NAME]  # resolved once, by the check; never again by the client
    assert prometheus.hosts == [f"{NAME}:{port}"] * 2  # the name still goes in Host


def test_a_name_that_does_not_resolve_is_refused_before_any_request(serving, monkeypatch):
    import socket

    def unknown(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    with pytest.raises(ConfigError, match="does not resolve"):
        analysis.client_for(AnalysisConfig(prometheus_url="http://prom.nowhere.test:9090"))


def test_over_tls_the_name_is_sent_and_checked_at_the_pinned_address(
    serving, tmp_path, rebinding, monkeypatch
):
    import datetime
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = tmp_path / "prom.pem"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    keyfile = tmp_path / "prom.key"
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    target = Target(200, ANSWER)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(pem, keyfile)
    snis: list[str | None] = []
    server_side.sni_callback = lambda sock, sni, ctx: snis.append(sni)
    target.server.socket = server_side.wrap_socket(target.server.socket, server_side=True)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(pem))  # the certificate is trusted by name
    try:
        port = target.server.server_address[1]
        client = analysis.client_for(AnalysisConfig(prometheus_url=f"https://{NAME}:{port}"))
        (sample,) = client.query("up")
        assert sample.value == 1.0
        assert snis == [NAME] and target.hosts == [f"{NAME}:{port}"] and rebinding == [NAME]
    finally:
        target.close()
