"""The demo hub's write side against bodies that lie about their size: over the limit (by
Content-Length or chunk by chunk), cut short, malformed chunks, or none at all. Each gets
its own status and error code at once, nothing is written under the hub's root, the
connection is closed (its body may be unread), and the hub serves the next request.
Sent over a raw socket: an HTTP client library would not send such bodies."""

import json
import socket

import pytest

from demo import hub_server
from demo.hub_server import HubServer

pytestmark = pytest.mark.integration

TOKEN = "hf_demo_write_token_for_the_upload_tests"


@pytest.fixture()
def hub(tmp_path, monkeypatch):
    # A small JSON limit, so "over the limit" is a few kilobytes and not 4 MiB.
    monkeypatch.setattr(hub_server, "MAX_JSON_BYTES", 4096)
    root = tmp_path / "hub"
    root.mkdir()
    with HubServer(root, token=TOKEN) as server:
        yield server, root


def exchange(url: str, head: list[str], body: bytes = b"", *, shut: bool = False) -> tuple:
    """Send a raw request; return (status, the hub's error code, the JSON body). The read
    ends only when the hub closes the connection (else the socket's timeout fails the test)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        lines = [*head, f"Host: {host}:{port}", f"Authorization: Bearer {TOKEN}"]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        if shut:
            sock.shutdown(socket.SHUT_WR)  # the client sends no more than it sent
        data = b""
        while chunk := sock.recv(65536):  # the hub closes: the read ends
            data += chunk
    head_bytes, _, payload = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head_bytes.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split(" ", 2)[1]), headers.get("X-Error-Code"), json.loads(payload)


def create(name: str) -> str:
    return json.dumps({"name": name, "organization": "tests", "type": "model"})


def assert_nothing_written(root) -> None:
    assert not any(root.rglob("refs.json")), sorted(root.rglob("*"))


def test_a_content_length_over_the_limit_is_refused_before_the_body_is_read(hub):
    server, root = hub
    answer = exchange(
        server.url,
        ["POST /api/repos/create HTTP/1.1", "Content-Length: 5000000"],
        b"{}",  # the rest is never sent: the hub must not wait for it
    )
    assert answer == (413, "TooLarge", {"error": "body over 4096 bytes"})
    assert_nothing_written(root)


def test_chunks_that_add_up_over_the_limit_are_refused(hub):
    server, root = hub
    chunk = b"x" * 3000
    body = b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2 + b"0\r\n\r\n"
    answer = exchange(
        server.url, ["POST /api/repos/create HTTP/1.1", "Transfer-Encoding: chunked"], body
    )
    assert answer == (413, "TooLarge", {"error": "body over 4096 bytes"})
    assert_nothing_written(root)


@pytest.mark.parametrize(
    ("head", "body", "expected"),
    [
        # Says 100 bytes, sends 10 and stops: refused, not waited for.
        (["Content-Length: 100"], b'{"name": ', (400, "BadRequest", "body cut short")),
        # A chunk that says 0x40 bytes and ends after 5.
        (["Transfer-Encoding: chunked"], b"40\r\nhello", (400, "BadRequest", "body cut short")),
        (
            ["Transfer-Encoding: chunked"],
            b"zz\r\n{}\r\n0\r\n\r\n",
            (400, "BadRequest", "bad chunk"),
        ),
        ([], b"", (411, "LengthRequired", "a body needs Content-Length")),
        (["Content-Length: -1"], b"", (413, "TooLarge", "body over 4096 bytes")),
    ],
    ids=["cut-short", "chunk-cut-short", "bad-chunk-size", "no-length", "negative-length"],
)
def test_a_body_that_lies_about_its_size_gets_its_own_error(hub, head, body, expected):
    server, root = hub
    status, code, message = expected
    answer = exchange(server.url, ["POST /api/repos/create HTTP/1.1", *head], body, shut=True)
    assert answer == (status, code, {"error": message})
    assert_nothing_written(root)


def test_the_hub_serves_the_next_request_after_a_refused_one(hub):
    server, root = hub
    exchange(server.url, ["POST /api/repos/create HTTP/1.1", "Content-Length: 5000000"], b"{}")
    body = create("after").encode()
    status, code, answer = exchange(
        server.url,
        ["POST /api/repos/create HTTP/1.1", f"Content-Length: {len(body)}", "Connection: close"],
        body,
    )
    assert (status, code) == (200, None), answer
    assert answer["url"].endswith("/tests/after")
    assert (root / "tests" / "after" / "refs.json").exists()
