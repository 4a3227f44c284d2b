"""A Hub endpoint whose every answer the test chooses, to attack the acquire stage.

It speaks the two calls the acquire stage makes through ``huggingface_hub`` — the model
listing (``/api/models/{repo}/revision/{rev}``) and a file (``/{repo}/resolve/{rev}/{file}``)
— but the commit id, the file names, the published hashes and sizes and the bytes sent are
whatever the test put in. It can also accept a connection and never answer (``silent``),
send more bytes than it published (``extra``) or stream without end (``endless``), and
redirect a file to another URL (``redirect``). Every request's path and Authorization
header is recorded.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

from llm_release.hub_server import git_blob_sha1


@dataclass
class HubFile:
    body: bytes
    sibling: dict
    extra: int = 0  # bytes sent beyond the body (over-long stream)
    endless: bool = False
    redirect: str | None = None


@dataclass
class Plan:
    commit: object = "0123456789abcdef0123456789abcdef01234567"
    files: dict[str, HubFile] = field(default_factory=dict)
    silent: bool = False
    requests: list[tuple[str, str | None]] = field(default_factory=list)

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
                self.send_response(200)
                if file.endless:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(file.body) + file.extra))
                self.end_headers()
                try:
                    if file.endless:
                        chunk = b"x" * 65536
                        while not hub.release.is_set():
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    else:
                        self.wfile.write(file.body + b"x" * file.extra)
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
