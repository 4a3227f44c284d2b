"""Loaded inside the vLLM server (``--middleware llm_release_lock.ServerLock``, this folder
on its PYTHONPATH): every request but ``GET /health`` must carry ``Authorization: Bearer
<key>``, the key the project put in the server's environment (``LLMRELEASE_SERVER_KEY``).
Without the variable nothing but /health is served (closed, not open). vLLM's own
``--api-key`` checks only /v1, /v2, /inference and /cohere; this checks every path, the
metrics, /invocations and websockets included.

Standard library only: it runs in the serving virtualenv or container, where the project
is not installed. See ``llm_release.server_key``."""

from __future__ import annotations

import hashlib
import hmac
import os

KEY_ENV = "LLMRELEASE_SERVER_KEY"
# Answered without the key: the load balancer's and the supervisor's health checks.
OPEN_PATHS = frozenset({"/health"})
_BODY = (
    b'{"error":{"message":"this server needs the project\'s key (Authorization: Bearer '
    b'<key>); send requests through the load balancer","type":"Unauthorized",'
    b'"code":401}}'
)


def server_key_from_environment() -> str:
    return os.environ.get(KEY_ENV, "").strip()


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


class ServerLock:
    """A pure ASGI middleware (vLLM adds a class with ``app.add_middleware``)."""

    def __init__(self, app) -> None:
        self.app = app
        key = server_key_from_environment()
        self._expected = _digest(b"Bearer " + key.encode()) if key else None

    def _allowed(self, scope) -> bool:
        values = [v for k, v in scope.get("headers", ()) if k.lower() == b"authorization"]
        if self._expected is None or len(values) != 1:
            return False
        scheme, _, token = values[0].partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(_digest(b"Bearer " + token), self._expected)

    @staticmethod
    def _route_path(scope) -> str:
        path, root = scope.get("path", ""), scope.get("root_path", "")
        return path[len(root) :] if root and path.startswith(root) else path

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        if kind == "http" and scope.get("method") in ("GET", "HEAD"):
            if self._route_path(scope) in OPEN_PATHS:
                await self.app(scope, receive, send)
                return
        if self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await receive()  # websocket.connect; a close before accept is a 403
            await send({"type": "websocket.close", "code": 1008})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b'Bearer realm="llm-release vLLM"'),
                    (b"content-length", str(len(_BODY)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": _BODY})
