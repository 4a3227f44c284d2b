"""A server whose picked port is taken before it binds starts again on a new pick; a given
port, or another failure, is reported as it is. (The real vLLM case:
tests/integration/test_serve_failure.py.)"""

from pathlib import Path

import pytest

from llm_release.config import ServingConfig
from llm_release.errors import ServeError
from llm_release.serving import serve
from llm_release.serving.serve import Endpoint, Server

VLLM_TAKEN = "OSError: [Errno 98] Address already in use"
DOCKER_TAKEN = (
    "the Docker daemon refused llmr-x: driver failed programming external connectivity on "
    "endpoint llmr-x: Bind for 127.0.0.1:23456 failed: port is already allocated"
)


class ScriptedServer(Server):
    """Each start fails with the next scripted error (None: it comes up)."""

    def __init__(self, tmp_path: Path, failures: list[str | None], *, port: int | None = None):
        super().__init__(tmp_path, ["m"], ServingConfig(), tmp_path / "vllm.log", port=port)
        self.failures = list(failures)
        self.ports: list[int] = []
        self.stops = 0

    def start(self) -> Endpoint:
        self.ports.append(self.port)
        self.started = True
        return self.endpoint()

    def wait_healthy(self, timeout_s: float | None = None) -> Endpoint:
        failure = self.failures.pop(0)
        if failure is not None:
            raise ServeError(
                "vLLM for m exited with code 1 before it was healthy", log_tail=failure
            )
        return self.endpoint()

    def exit_code(self) -> int | None:
        return None

    def stop(self, grace_s: float = 20) -> None:
        self.stops += 1


@pytest.fixture()
def picks(monkeypatch):
    ports = iter(range(21000, 21100))
    monkeypatch.setattr(serve, "free_port", lambda **_: next(ports))


def test_a_picked_port_taken_at_bind_is_picked_again(tmp_path, picks):
    server = ScriptedServer(tmp_path, [VLLM_TAKEN, DOCKER_TAKEN, None])
    endpoint = server.start_healthy()
    assert server.ports == [21000, 21001, 21002]
    assert endpoint.port == 21002 and endpoint.base_url.endswith(":21002")
    assert server.stops == 2, "each failed start is stopped before the next"


def test_picking_again_stops_after_the_retries_with_the_last_error(tmp_path, picks):
    server = ScriptedServer(tmp_path, [VLLM_TAKEN] * (serve.PORT_RETRIES + 2))
    with pytest.raises(ServeError, match="Address already in use"):
        server.start_healthy()
    assert len(server.ports) == serve.PORT_RETRIES + 1


def test_a_given_port_that_is_taken_is_the_callers_error(tmp_path, picks):
    server = ScriptedServer(tmp_path, [VLLM_TAKEN, None], port=24000)
    with pytest.raises(ServeError, match="Address already in use"):
        server.start_healthy()
    assert server.ports == [24000] and server.stops == 1


def test_another_failure_is_not_retried(tmp_path, picks):
    server = ScriptedServer(tmp_path, ["torch.OutOfMemoryError: CUDA out of memory", None])
    with pytest.raises(ServeError, match="OutOfMemory"):
        server.start_healthy()
    assert server.ports == [21000]


def test_the_diagnosis_reads_only_this_starts_output(tmp_path):
    server = ScriptedServer(tmp_path, [])
    server.log_path.write_text(f"first start\n{VLLM_TAKEN}\n")
    server.mark_log_start()
    with server.log_path.open("a") as fh:
        fh.write("second start\ntorch.OutOfMemoryError: CUDA out of memory\n")
    assert "second start" in server.log_text() and "first start" not in server.log_text()
    assert "out of memory" in serve.diagnose(server.log_text())


def test_a_port_that_another_server_answers_on_is_a_taken_port(tmp_path, picks):
    """vLLM binds ~25 s after its start: another server can bind the picked port first and
    answer /health for it (CI, 2026-12-04). Its /v1/models does not list our names: that is
    a taken port, picked again; our own names pass."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    served = {"ids": ["tiny-qwen3-moe", "baseline-e6741202-20261204225320"]}

    class Models(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = json.dumps({"data": [{"id": i} for i in served["ids"]]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        server = ScriptedServer(tmp_path, [], port=other.server_address[1])
        with pytest.raises(ServeError, match="answers for another server") as caught:
            server._check_names()
        assert Server._port_taken(caught.value)
        served["ids"] = ["m"]
        server._check_names()  # ours
    finally:
        other.shutdown()
        other.server_close()
    # such a start is picked again like a bind that failed
    foreign = "port 21000 answers for another server (models ['x']): it bound the port first"
    again = ScriptedServer(tmp_path, [foreign, None])
    assert again.start_healthy().port == 21001


def test_a_port_whose_server_refuses_this_homes_key_is_a_taken_port(home, tmp_path, picks):
    """Another home's vLLM (locked with its own key, llm_release.server_key) answers 401 to
    ours: that server is not ours either. Our check sends this home's key."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from llm_release import server_key

    accepted = {"key": "another-homes-key-" + "x" * 30}
    seen: list[str | None] = []

    class Locked(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == f"Bearer {accepted['key']}"
            body = b'{"data": [{"id": "m"}]}' if ok else b'{"error": "Unauthorized"}'
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), Locked)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        server = ScriptedServer(tmp_path, [], port=other.server_address[1])
        with pytest.raises(ServeError, match="refuses this home's key") as caught:
            server._check_names()
        assert Server._port_taken(caught.value)
        assert seen == [f"Bearer {server_key.key()}"]
        accepted["key"] = server_key.key()
        server._check_names()  # ours: our key, our names
    finally:
        other.shutdown()
        other.server_close()
