"""A small OpenAI chat-completions server, for HAProxy failure tests (run as a process).

    python tests/fake_openai.py NAME DELAY_S RECORD_FILE [FAIL_EVERY]

answers POST /v1/chat/completions after DELAY_S with a completion whose content is NAME
(every FAIL_EVERY-th one with a 500 instead, when given),
GET /health, and GET /metrics with vLLM's ``num_requests_running``/``waiting`` gauges
(the requests in flight now). It prints its port on the first line of stdout. On SIGTERM
it writes the number of requests in flight at that instant to RECORD_FILE and exits at
once, cutting them, as a crashing server would: a test then knows whether a server was
stopped with requests still on it. SIGKILL is the crash without the record.

The property under test is HAProxy's, so a fake is enough here; it is a process (not a
thread) so it can be killed mid-request.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class FakeServer:
    """This file run as a process of its own session (a group leader, like vLLM's)."""

    def __init__(
        self,
        name: str,
        delay_s: float,
        directory: Path,
        fail_every: int = 0,
        *,
        home: Path | None = None,
        served_names: tuple[str, ...] = (),
    ):
        """``home``: the project home whose mark it carries (LLM_RELEASE_HOME's by default),
        as the vLLM servers it stands in for do; ``served_names`` end its command line, as
        vLLM's --served-model-name names the release it serves."""
        from tests.helpers import marked_env

        self.name = name
        self.record_path = Path(directory) / f"{name}.json"
        self.process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                name,
                str(delay_s),
                str(self.record_path),
                str(fail_every),
                *(["--served-model-name", *served_names] if served_names else []),
            ],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env=marked_env(home),
        )
        self.pid = self.process.pid
        self.port = int(self.process.stdout.readline())

    def record(self) -> dict:
        """What it had in flight when it got SIGTERM (written by the process itself)."""
        return json.loads(self.record_path.read_text())

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.process.stdout.close()


def main() -> None:
    name, delay_s, record = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    fail_every = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    lock = threading.Lock()
    state = {"in_flight": 0, "served": 0, "received": 0}

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
            elif self.path == "/metrics":
                with lock:
                    running = state["in_flight"]
                text = (
                    f'vllm:num_requests_running{{model_name="{name}"}} {running}\n'
                    f'vllm:num_requests_waiting{{model_name="{name}"}} 0\n'
                )
                self._send(200, text.encode(), "text/plain")
            else:
                self._send(404, b'{"error": "not found"}')

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            request = json.loads(self.rfile.read(length) or b"{}")
            if self.path != "/v1/chat/completions":
                self._send(404, b'{"error": "not found"}')
                return
            with lock:
                state["in_flight"] += 1
                state["received"] += 1
                number = state["received"]
            try:
                if fail_every and number % fail_every == 0:
                    self._send(500, b'{"error": {"message": "injected failure"}}')
                    return
                time.sleep(delay_s)
                body = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": request.get("model", name),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": name},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
                self._send(200, json.dumps(body).encode())
            finally:
                with lock:
                    state["in_flight"] -= 1
                    state["served"] += 1

        def log_message(self, *args):
            pass

    def on_term(signum, frame):
        with lock:
            in_flight = state["in_flight"]
        with open(record, "w") as fh:
            json.dump({"in_flight_at_stop": in_flight, "served": state["served"]}, fh)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            pass  # HAProxy's health checks hang up without reading the answer

    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
