"""An OpenAI chat-completions server on 127.0.0.1 that records every request body it gets.

``with RecordingOpenAI() as server:`` serves ``server.base_url`` from a thread of this
process; ``server.bodies()`` are the JSON bodies of the chat requests received, in order.
It answers GET /health and /v1/models (GuideLLM checks both), and POST
/v1/chat/completions with ``answer``, as one JSON answer or, when the request asks for
``stream``, as server-sent events ending with a usage chunk, as vLLM does.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RecordingOpenAI:
    def __init__(self, model: str = "recorded", answer: str = "Paris") -> None:
        self.model = model
        self.answer = answer
        self._lock = threading.Lock()
        self._bodies: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def bodies(self) -> list[dict]:
        with self._lock:
            return list(self._bodies)

    def __enter__(self) -> RecordingOpenAI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/v1/models":
                    models = {"object": "list", "data": [{"id": outer.model, "object": "model"}]}
                    self._send(200, json.dumps(models).encode())
                else:
                    self._send(404, b'{"error": "not found"}')

            def do_POST(self):  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/chat/completions":
                    self._send(404, b'{"error": "not found"}')
                    return
                with outer._lock:
                    outer._bodies.append(body)
                if body.get("stream"):
                    self._stream(body)
                    return
                answer = {
                    "id": "chatcmpl-recorded",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", outer.model),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": outer.answer},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
                self._send(200, json.dumps(answer).encode())

            def _stream(self, body: dict) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                words = outer.answer.split() or [outer.answer]
                base = {
                    "id": "chatcmpl-recorded",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": body.get("model", outer.model),
                }
                for word in words:
                    chunk = base | {
                        "choices": [{"index": 0, "delta": {"content": word + " "}}],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                usage = {
                    "prompt_tokens": 5,
                    "completion_tokens": len(words),
                    "total_tokens": 5 + len(words),
                }
                last = base | {
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                    "usage": usage,
                }
                self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                self.close_connection = True

            def log_message(self, *args):
                pass

        return Handler
