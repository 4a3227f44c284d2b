"""The project's Hub endpoint with injectable faults, for failure tests of the acquire stage.

Faults are consumed one per GET of a file, in order: ``http500``, ``reset`` (half the body,
then the connection is cut), ``stall`` (half the body, then silence), ``short`` (the body
and its length are 1 KiB short), ``flip`` (one byte changed). Every request's path and
Range header is recorded.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from pathlib import Path

from demo.hub_server import HubRequestHandler, make_server


class FaultPlan:
    def __init__(self) -> None:
        self.faults: dict[str, list[str]] = defaultdict(list)
        self.requests: list[tuple[str, str | None]] = []
        self.authorizations: set[str] = set()
        self.stall_s = 5.0
        self.lock = threading.Lock()

    def add(self, filename: str, *faults: str) -> None:
        self.faults[filename].extend(faults)

    def take(self, filename: str) -> str | None:
        with self.lock:
            queue = self.faults.get(filename)
            return queue.pop(0) if queue else None

    def gets(self, filename: str) -> list[str | None]:
        return [rng for path, rng in self.requests if path.endswith("/" + filename)]


def faulty_handler(plan: FaultPlan):
    class FaultyHandler(HubRequestHandler):
        def do_GET(self):  # noqa: N802
            with plan.lock:
                plan.requests.append((self.path, self.headers.get("Range")))
                if self.headers.get("Authorization"):
                    plan.authorizations.add(self.headers["Authorization"])
            match = re.fullmatch(r"/[^/]+/[^/]+/resolve/[^/]+/(.+)", self.path)
            fault = plan.take(match.group(1)) if match else None
            if fault == "http500":
                self._send_error(500, "ServerError", "injected failure")
                return
            self._fault = fault
            super().do_GET()

        def _stream(self, file_path: Path, offset: int, length: int) -> None:
            fault = getattr(self, "_fault", None)
            if fault is None:
                super()._stream(file_path, offset, length)
                return
            with file_path.open("rb") as fh:
                fh.seek(offset)
                data = bytearray(fh.read(length))
            half = len(data) // 2
            if fault == "flip":
                data[half] ^= 0xFF
                self.wfile.write(bytes(data))
            elif fault == "short":
                self.wfile.write(bytes(data[: len(data) - 1024]))
                self.close_connection = True
            elif fault in ("reset", "stall"):
                self.wfile.write(bytes(data[:half]))
                self.wfile.flush()
                if fault == "stall":
                    time.sleep(plan.stall_s)
                self.close_connection = True
                self.connection.close()

    return FaultyHandler


class FaultyHub:
    def __init__(self, root: Path) -> None:
        self.plan = FaultPlan()
        self.server = make_server(root, handler=faulty_handler(self.plan))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FaultyHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
