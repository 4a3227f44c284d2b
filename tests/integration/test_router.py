"""HAProxy, started by the project, in front of two real HTTP backends on 127.0.0.1."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from llm_release.canary.router import Router, SlotTarget
from llm_release.serving.serve import free_port

pytestmark = pytest.mark.integration


class Backend:
    def __init__(self, name: str, delay_s: float = 0.0):
        self.hits = 0
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                if self.path != "/health":
                    backend.hits += 1
                    time.sleep(delay_s if self.path == "/slow" else 0)
                body = name.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture()
def backends():
    stable, canary = Backend("stable"), Backend("canary", delay_s=2.0)
    yield stable, canary
    stable.close()
    canary.close()


@pytest.fixture()
def router(home, backends):
    stable, canary = backends
    r = Router(home / "router", free_port())
    r.start(SlotTarget("127.0.0.1", stable.port, 95), SlotTarget("127.0.0.1", canary.port, 5))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        stats = r.stats()
        if all(stats[s]["status"] == "UP" for s in ("stable", "canary")):
            break
        time.sleep(0.2)
    yield r
    r.stop()


def test_five_percent_reach_the_canary(router, backends):
    stable, canary = backends
    answers = [
        requests.get(f"{router.url}/x", headers=router.auth_headers, timeout=5).text
        for _ in range(100)
    ]
    assert answers.count("canary") == 5 and answers.count("stable") == 95
    stats = router.stats()
    assert int(stats["canary"]["stot"]) == 5 and int(stats["stable"]["stot"]) == 95


def test_rollback_keeps_in_flight_requests(router, backends):
    stable, canary = backends
    router.set_weight("stable", 1)
    router.set_weight("canary", 255)
    with ThreadPoolExecutor(4) as pool:
        in_flight = [
            pool.submit(requests.get, f"{router.url}/slow", headers=router.auth_headers, timeout=10)
            for _ in range(4)
        ]
        time.sleep(0.5)
        assert canary.hits >= 1, "no request reached the slow canary before the rollback"
        router.set_weight("canary", 0)
        after = [
            requests.get(f"{router.url}/x", headers=router.auth_headers, timeout=5).text
            for _ in range(30)
        ]
        replies = [f.result() for f in in_flight]
    assert all(r.status_code == 200 for r in replies)
    assert after.count("canary") == 0


def test_slot_retarget_without_restart(router, backends):
    stable, _ = backends
    pid = router.pid()
    router.set_target("canary", None)
    assert {
        requests.get(f"{router.url}/x", headers=router.auth_headers, timeout=5).text
        for _ in range(20)
    } == {"stable"}
    assert router.pid() == pid


def test_a_slot_repointed_from_a_dead_server_serves_at_once(router, backends):
    # A promotion re-points the stable slot from the stopped old release to the new one,
    # then parks the canary slot: no request may find both slots out in between.
    stable, canary = backends
    router.set_target("stable", SlotTarget("127.0.0.1", free_port(), 50))
    deadline = time.monotonic() + 15
    while router.stats()["stable"]["status"] != "DOWN" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert router.stats()["stable"]["status"] == "DOWN"
    router.set_target("stable", SlotTarget("127.0.0.1", stable.port, 100))
    router.set_target("canary", None)
    replies = [
        requests.get(f"{router.url}/x", headers=router.auth_headers, timeout=5) for _ in range(5)
    ]
    assert [r.status_code for r in replies] == [200] * 5
    assert {r.text for r in replies} == {"stable"}


def test_haproxy_does_not_inherit_hub_tokens(home, backends, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_router_must_not_see")
    monkeypatch.setenv("PREFECT_API_KEY", "pnu_router_must_not_see")
    stable, _ = backends
    r = Router(home / "router", free_port())
    r.start(SlotTarget("127.0.0.1", stable.port, 100), None)
    try:
        environ = open(f"/proc/{r.pid()}/environ", "rb").read()
    finally:
        r.stop()
    assert b"PATH=" in environ
    assert b"must_not_see" not in environ
