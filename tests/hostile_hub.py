"""A Hub endpoint whose every answer the test chooses, to attack the acquire stage.

It speaks the two calls the acquire stage makes through ``huggingface_hub`` — the model
listing (``/api/models/{repo}/revision/{rev}``) and a file (``/{repo}/resolve/{rev}/{file}``)
— but the commit id, the file names, the published hashes and sizes and the bytes sent are
whatever the test put in. It can also accept a connection and never answer (``silent``),
send more bytes than it published (``extra``) or stream without end (``endless``),
redirect a file to another URL (``redirect``), wait before answering (``delay_s``) and
send a body one byte at a time (``trickle_s`` between bytes: a hub no per-read timeout
catches). With ``ranges`` on, it answers a ``Range: bytes=a-b`` with 206 and that slice, as
the planner's header reads need. Every request's path and Authorization header is recorded.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

from demo.hub_server import git_blob_sha1


@dataclass
class HubFile:
    body: bytes
    sibling: dict
    extra: int = 0  # bytes sent beyond the body (over-long stream)
    endless: bool = False
    redirect: str | None = None
    delay_s: float = 0.0  # silence before the answer
    trickle_s: float = 0.0  # pause between the body's bytes, each sent alone


@dataclass
class Plan:
    commit: object = "0123456789abcdef0123456789abcdef01234567"
    files: dict[str, HubFile] = field(default_factory=dict)
    silent: bool = False
    ranges: bool = False  # answer Range requests with 206 and the slice
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # time.monotonic() of each request

    def add(
        self,
        name: str,
        body: bytes = b"{}\n",
        *,
        lfs: bool = False,
        hashed: bool = True,
        size: int | None = -1,
        **behaviour,
    ) -> None:
        """Publish ``name``; ``hashed=False`` publishes neither SHA-256 nor blob id."""
        sibling: dict = {"rfilename": name}
        if size is not None:
            sibling["size"] = len(body) if size == -1 else size
        if hashed and lfs:
            sha = hashlib.sha256(body).hexdigest()
            sibling["blobId"] = "f" * 40
            sibling["lfs"] = {"sha256": sha, "size": len(body), "pointerSize": 130}
        elif hashed:
            sibling["blobId"] = git_blob_sha1(body)
        self.files[name] = HubFile(body, sibling, **behaviour)


class HostileHub:
    def __init__(self) -> None:
        self.plan = Plan()
        self.release = threading.Event()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                plan = hub.plan
                plan.requests.append((self.path, self.headers.get("Authorization")))
                plan.times.append(time.monotonic())
                if plan.silent:
                    hub.release.wait(60)  # accepted, never answered
                    return
                path = unquote(urlparse(self.path).path)
                if re.fullmatch(r"/api/models/[^/]+/[^/]+/revision/.+", path):
                    siblings = [f.sibling for f in plan.files.values()]
                    self._send(json.dumps({"id": "x/y", "sha": plan.commit, "siblings": siblings}))
                    return
                match = re.fullmatch(r"/[^/]+/[^/]+/resolve/[^/]+/(.+)", path)
                file = plan.files.get(match.group(1)) if match else None
                if file is None:
                    self.send_error(404)
                    return
                if file.redirect:
                    self.send_response(302)
                    self.send_header("Location", file.redirect)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if file.delay_s:
                    hub.release.wait(file.delay_s)
                body = file.body
                wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
                if plan.ranges and wanted:
                    begin, end = int(wanted.group(1)), min(int(wanted.group(2)), len(body) - 1)
                    body = body[begin : end + 1]
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {begin}-{end}/{len(file.body)}")
                else:
                    self.send_response(200)
                if file.endless:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(body) + file.extra))
                # this answer ends its connection: say so, or a client that keeps connections
                # alive sends its next request down a socket the hub is closing (a race that
                # reads as "Server disconnected without sending a response")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    if file.trickle_s:
                        for i in range(len(body)):
                            if hub.release.wait(file.trickle_s):
                                break
                            self.wfile.write(body[i : i + 1])
                    elif file.endless:
                        chunk = b"x" * 65536
                        while not hub.release.is_set():
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    else:
                        self.wfile.write(body + b"x" * file.extra)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            def _send(self, text: str) -> None:
                body = text.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> HostileHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
