"""The lock vLLM loads with --middleware (serving/vllm_middleware/llm_release_lock.py),
driven as an ASGI server drives it: every path but GET /health needs the key."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from llm_release.serving.serve import MIDDLEWARE_DIR

KEY = "k" * 43


def load_lock(monkeypatch, key: str | None):
    if key is None:
        monkeypatch.delenv("LLMRELEASE_SERVER_KEY", raising=False)
    else:
        monkeypatch.setenv("LLMRELEASE_SERVER_KEY", key)
    spec = importlib.util.spec_from_file_location("lock", MIDDLEWARE_DIR / "llm_release_lock.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    reached: list[str] = []

    async def app(scope, receive, send):
        reached.append("lifespan" if scope["type"] == "lifespan" else scope["path"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    return module.ServerLock(app), reached


def call(lock, path: str, headers: list[tuple[bytes, bytes]] = (), *, method="POST", kind="http"):
    sent: list[dict] = []

    async def receive():
        return {"type": "websocket.connect"} if kind == "websocket" else {"type": "http.request"}

    async def send(message):
        sent.append(message)

    scope = {"type": kind, "path": path, "root_path": "", "headers": list(headers)}
    if kind == "http":
        scope["method"] = method
    asyncio.run(lock(scope, receive, send))
    return sent


def status(sent: list[dict]) -> int | None:
    return next((m["status"] for m in sent if m["type"] == "http.response.start"), None)


def bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


@pytest.mark.parametrize(
    "path", ["/v1/chat/completions", "/invocations", "/metrics", "/tokenize", "/", "/health/x"]
)
def test_every_path_but_health_needs_the_key(monkeypatch, path):
    lock, reached = load_lock(monkeypatch, KEY)
    assert status(call(lock, path)) == 401
    assert status(call(lock, path, bearer("x" * 43))) == 401
    assert reached == []
    assert status(call(lock, path, bearer(KEY))) == 200
    assert reached == [path]


def test_health_is_open_to_a_get_only(monkeypatch):
    lock, reached = load_lock(monkeypatch, KEY)
    assert status(call(lock, "/health", method="GET")) == 200
    assert status(call(lock, "/health", method="POST")) == 401
    assert reached == ["/health"]


@pytest.mark.parametrize(
    "headers",
    [
        [(b"authorization", f"Basic {KEY}".encode())],
        [(b"authorization", KEY.encode())],
        [(b"authorization", f"Bearer {KEY}x".encode())],
        [(b"authorization", f"Bearer {KEY}".encode()), (b"authorization", b"Bearer other")],
        [(b"x-api-key", KEY.encode())],
    ],
)
def test_anything_but_one_bearer_key_is_refused(monkeypatch, headers):
    lock, reached = load_lock(monkeypatch, KEY)
    sent = call(lock, "/v1/models", headers, method="GET")
    assert status(sent) == 401 and reached == []
    start = sent[0]
    assert (b"www-authenticate", b'Bearer realm="llm-release vLLM"') in start["headers"]
    assert b"Unauthorized" in sent[1]["body"]


def test_the_scheme_is_case_insensitive(monkeypatch):
    lock, _ = load_lock(monkeypatch, KEY)
    assert status(call(lock, "/v1/models", [(b"Authorization", f"bearer {KEY}".encode())])) == 200


def test_without_a_key_in_its_environment_it_serves_health_alone(monkeypatch):
    lock, reached = load_lock(monkeypatch, None)
    assert status(call(lock, "/v1/models", bearer(""), method="GET")) == 401
    assert status(call(lock, "/v1/models", [(b"authorization", b"Bearer ")])) == 401
    assert status(call(lock, "/health", method="GET")) == 200
    assert reached == ["/health"]


def test_a_websocket_without_the_key_is_closed_before_it_is_accepted(monkeypatch):
    lock, reached = load_lock(monkeypatch, KEY)
    assert call(lock, "/v1/realtime", kind="websocket") == [
        {"type": "websocket.close", "code": 1008}
    ]
    assert reached == []
    call(lock, "/v1/realtime", bearer(KEY), kind="websocket")
    assert reached == ["/v1/realtime"]


def test_lifespan_passes(monkeypatch):
    lock, reached = load_lock(monkeypatch, KEY)
    call(lock, "", kind="lifespan")
    assert reached == ["lifespan"]


def test_a_root_path_is_taken_off_as_starlette_routes(monkeypatch):
    lock, reached = load_lock(monkeypatch, KEY)
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    scope = {"type": "http", "method": "GET", "path": "/api/health", "root_path": "/api"}
    asyncio.run(lock(scope | {"headers": []}, receive, send))
    assert status(sent) == 200
